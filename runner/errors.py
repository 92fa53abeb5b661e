"""Domain errors. Raised deep inside; only the CLI turns them into one line and an exit code."""


class GgbatchError(Exception):
    """A problem the user can fix: bad usage, config, input or model. Exit code 2."""

    exit_code = 2


class ConfigError(GgbatchError):
    pass


class InputError(GgbatchError):
    pass


class ModelError(GgbatchError):
    pass


class OutputError(GgbatchError):
    pass


class WorkerFailure(Exception):
    """Workers could not run (not a user error): every worker failed to start, for example."""

    exit_code = 1
