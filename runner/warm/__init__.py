"""A warm pool: the workers and the model loaded once, answering calls from many threads (ggbatch.Pool)."""
