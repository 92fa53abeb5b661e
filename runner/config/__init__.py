"""A job's settings: the schema every key is checked against, the checks, and what an answer must be."""
