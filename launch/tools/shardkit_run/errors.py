"""How shardkit-run fails: LaunchError, and the exit statuses it carries."""

from __future__ import annotations

EXIT_USAGE = 2
EXIT_NOT_FOUND = 127  # what a shell answers for a command it cannot find


class LaunchError(Exception):
    """A problem that ends shardkit-run with a message and an exit status."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code
