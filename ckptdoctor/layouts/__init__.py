"""Checkpoint layouts: YAML descriptions (rules/layouts/) plus readers for binary formats."""
