"""What a client of sessions meets when a session's workflow has ended, as types of corral's own.

Temporal says such things in its own terms, or not at all: an update to a closed workflow is "workflow execution
already completed" (NOT_FOUND, which reads as "no such session"), and a query on a run whose start input did not
decode fails inside the worker with "Expected workflow input. This is a Python SDK bug." `corral.client` is the one
choke point that turns these into the errors below, read from the workflow's own close event, so that every
reader (the CLI, the gateway, a script) says what happened and when.

    SessionEnded            the workflow closed (failed, terminated, timed out, cancelled): it takes no more events;
     │                      its log, where it has one, can still be read
     └── SessionStartFailed     the run's start input was refused: it never had a log, so nothing can be read
"""

from __future__ import annotations

from datetime import UTC, datetime


class SessionEnded(Exception):
    """The session's workflow has closed: how (`how`: failed, terminated, timed_out, canceled, completed), when
    (`at`) and why (`reason`: the failure's message, the terminate reason, or empty)."""

    def __init__(self, session_id: str, how: str, at: datetime | None, reason: str = "") -> None:
        self.session_id, self.how, self.at, self.reason = session_id, how, at, reason
        super().__init__(self.describe())

    def describe(self) -> str:
        when = f" at {format_time(self.at)}" if self.at is not None else ""
        verb = {
            "failed": "failed",
            "terminated": "was terminated",
            "timed_out": "timed out (its workflow execution timeout passed)",
            "canceled": "was cancelled",
            "completed": "ended",
        }.get(self.how, self.how)
        return f"session {self.session_id} {verb}{when}" + (f": {self.reason}" if self.reason else "")


class SessionStartFailed(SessionEnded):
    """The session's run failed at its start because its input was refused (it did not fit `SessionInput`): it
    never ran, so it has no log, and a query cannot be answered (the worker cannot rebuild it)."""

    def describe(self) -> str:
        when = f" ({format_time(self.at)})" if self.at is not None else ""
        return f"session {self.session_id} failed at start{when}: its start input was refused: {self.reason}"


def format_time(moment: datetime) -> str:
    """A close time as people read it, in UTC (a server's and a reader's local times differ)."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
