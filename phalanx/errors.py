"""User-facing errors: one line that names the option and says what to do.

Only ``phalanx.cli.main`` turns these into exit codes; every other module raises them where a value is
checked, so the message can name the option the user typed.
"""

#: Exit statuses phalanx documents (README, "Exit codes").
EXIT_OK = 0
EXIT_FAILED = 1  # training or a worker failed at run time
EXIT_BAD_INPUT = 2  # bad option, config, data or model; nothing was written
EXIT_INTERRUPTED = 130  # Ctrl-C / SIGINT (128 + 2)
EXIT_TERMINATED = 143  # SIGTERM (128 + 15), e.g. preemption


class PhalanxError(Exception):
    """An error the user can fix. ``option`` is the flag to name, e.g. ``--batch-size``."""

    exit_code = EXIT_BAD_INPUT

    def __init__(self, message: str, option: str | None = None, exit_code: int | None = None):
        super().__init__(message)
        self.option = option
        self.message = message
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        return f"{self.option}: {self.message}" if self.option else self.message


class RunFailed(PhalanxError):
    """Training started but could not finish (a worker failed, a file could not be written)."""

    exit_code = EXIT_FAILED
