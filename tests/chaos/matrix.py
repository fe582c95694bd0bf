"""What a fault test records and checks: N from the environment, the log's integrity, and one outcome row.

A fault test starts `chaos_n()` sessions, brings them mid-turn, injects its fault, and asserts its documented
expectation exactly. It then calls `record(...)` with what it saw; when `CORRAL_CHAOS_RECORD` names a file (set by
`bench/reliability.py`) the row is appended there as one JSON line, so the report is built from real runs only.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from corral.contract.events import SessionError, SessionEvent

ENV_N = "CORRAL_CHAOS_N"
ENV_RECORD = "CORRAL_CHAOS_RECORD"


def chaos_n(default: int = 2) -> int:
    """How many sessions each fault test runs: `$CORRAL_CHAOS_N`, else `default` (small, for CI)."""
    raw = os.environ.get(ENV_N)
    return max(1, int(raw)) if raw else default


@dataclass(frozen=True)
class LogCheck:
    """A session log's integrity: positions missing from 1..N, and positions or ids seen more than once."""

    gaps: int
    duplicates: int

    @property
    def whole(self) -> bool:
        return self.gaps == 0 and self.duplicates == 0


def check_log(events: Sequence[SessionEvent]) -> LogCheck:
    positions = [event.position for event in events]
    highest = max(positions, default=0)
    gaps = len(set(range(1, highest + 1)) - set(positions))
    duplicates = (len(positions) - len(set(positions))) + (len(events) - len({event.id for event in events}))
    return LogCheck(gaps=gaps, duplicates=duplicates)


def integrity(logs: Sequence[Sequence[SessionEvent]]) -> tuple[int, int]:
    """(gaps, duplicates) summed over the sessions' logs."""
    checks = [check_log(log) for log in logs]
    return sum(check.gaps for check in checks), sum(check.duplicates for check in checks)


def assert_whole(logs: Sequence[Sequence[SessionEvent]]) -> None:
    """Each log has no gap and no duplicate."""
    for log in logs:
        check = check_log(log)
        assert check.whole, f"log of {len(log)} events has {check.gaps} gaps and {check.duplicates} duplicates"


def errors_of(events: Sequence[SessionEvent]) -> list[tuple[str, str]]:
    """The log's `session.error`s as (error type, retry status)."""
    return [(e.error.type, e.error.retry_status.type) for e in events if isinstance(e, SessionError)]


@dataclass
class Outcome:
    """One row of the matrix: the fault, how many sessions met it, what was expected and what was seen."""

    fault: str
    expected: str
    n: int
    observed: str
    lost: int = 0
    """Events, messages or tool results missing from a session's log (gaps, or a sent message never logged)."""
    duplicated: int = 0
    """Events logged twice, or side effects (a sandbox command's marker) that ran more than once."""
    recovery_seconds: list[float] = field(default_factory=list)
    """Per session: from the fault to the session being whole again (idle after the turn that met it)."""


def record(outcome: Outcome) -> None:
    """Append the outcome to `$CORRAL_CHAOS_RECORD` (one JSON line) when a reliability run asked for it."""
    target = os.environ.get(ENV_RECORD)
    if not target:
        return
    with Path(target).open("a", encoding="utf-8") as out:
        out.write(json.dumps(asdict(outcome)) + "\n")


def record_logs(
    logs: Sequence[Sequence[SessionEvent]],
    recovery: Sequence[float],
    *,
    fault: str,
    expected: str,
    observed: str,
    extra_runs: int = 0,
) -> None:
    """Record the row of a fault met by `len(logs)` sessions: lost and duplicated are the logs' gaps and duplicates,
    plus `extra_runs`, the runs of a side effect beyond one per session."""
    gaps, duplicates = integrity(logs)
    record(
        Outcome(
            fault=fault,
            expected=expected,
            n=len(logs),
            observed=observed,
            lost=gaps,
            duplicated=duplicates + extra_runs,
            recovery_seconds=list(recovery),
        )
    )
