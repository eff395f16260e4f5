"""Rule checks, one small function per rule id, grouped by area."""
