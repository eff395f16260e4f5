"""`ckptdoctor forensics`: from a failed job's logs to the first checkpoint-related failure."""
