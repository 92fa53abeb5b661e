"""The files a job reads and writes: paths and their checks, the lock, question files, answers files, shards."""
