from ggbatch.runner.cli import entry_point

entry_point()
