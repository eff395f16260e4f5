"""Preflight: node views of a new allocation and what each rank can read."""
