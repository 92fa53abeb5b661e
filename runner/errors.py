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


class Interrupted(Exception):
    """Stopped by SIGINT or SIGTERM; everything answered so far is in the journal."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"interrupted by signal {signum}")
        self.signum = signum
        self.exit_code = 128 + signum  # 130 for SIGINT, 143 for SIGTERM
