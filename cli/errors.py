"""Errors of the CLI: each is reported as one message (plus an optional hint) and an exit code, never a traceback.

The hierarchy::

    CliError                     a failure to report as a message, a hint and an exit code (cli.context.fail)
     └── DemoRepositoryError     git could not make the demo repository; the message carries git's own words

Errors of other packages (`corral.errors`, `proxy.errors`, `sandbox.errors`...) are turned into a `CliError` where
a command meets them, with a hint that says what to do.
"""

from __future__ import annotations


class CliError(Exception):
    """A failure to report as one message (plus an optional hint) and an exit code, never as a traceback."""

    def __init__(self, message: str, *, hint: str | None = None, exit_code: int = 1) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        self.exit_code = exit_code


class DemoRepositoryError(CliError):
    """git could not make the demo repository; the message carries git's own words."""
