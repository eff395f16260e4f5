"""Reconcile: run_state/v1, mapping profiles, positions and the resume simulator."""
