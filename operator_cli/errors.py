"""One error type for the CLI: a single line naming the problem, and a hint for the fix."""

from __future__ import annotations


class CliError(Exception):
    """Shown to the user as ``error: <message>`` (+ ``hint: <hint>``), exit code ``exit_code``."""

    def __init__(self, message: str, hint: str | None = None, exit_code: int = 2, status: int | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.exit_code = exit_code
        self.status = status  # the HTTP status, for API errors
