"""Storage access, safe unpickling, hashing and atomic writes."""
