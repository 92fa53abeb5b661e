"""ggbatch worker side: the continuous-batching engine and the worker process around it.
Never imports runner/."""
