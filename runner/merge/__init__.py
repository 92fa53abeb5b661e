"""`ggbatch merge`: the parts of a sharded job joined into one answers file."""
