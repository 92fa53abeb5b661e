"""After the run: the tally of answers and the report."""
