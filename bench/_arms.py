"""Two arms of a benchmark timed in turn on one `corral up` stack (bench/_stack.py): each arm a session started
from its input file, its wall time read from its own log, the first run of each arm a warm-up not counted, and the
arms' order alternating from run to run so neither always runs on a warmer stack."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from bench import _stack
from corral.contract.session import SessionInput
from modelserver import Script

Events = list[dict[str, Any]]


def wall_seconds(events: Events) -> float:
    """From the session's first `user.message` to its last `session.status_idle`, as its log stores them."""
    start = next(e["created_at"] for e in events if e["type"] == "user.message")
    end = [e["created_at"] for e in events if e["type"] == "session.status_idle"][-1]
    return (datetime.fromisoformat(end) - datetime.fromisoformat(start)).total_seconds()


def time_arms(
    scripts: dict[str, Script],
    inputs: dict[str, SessionInput],
    runs: int,
    play: Callable[[_stack.Stack, Path, str], tuple[str, Events]],
    check: Callable[[str, Events], None],
    prefix: str,
) -> dict[str, list[float]]:
    """Each arm's counted wall times, by arm name (`inputs`' keys), after `scripts` are on the offline model
    server; `play` runs one session of an arm to its end and returns its id and log, `check` refuses a log that did
    not do all its work."""
    stack = _stack.up()
    walls: dict[str, list[float]] = {arm: [] for arm in inputs}
    try:
        for name, script in scripts.items():
            url = f"{stack.model_url}/_corral/scripts/{name}"
            httpx.put(url, json=script.model_dump(mode="json"), timeout=30).raise_for_status()
        with tempfile.TemporaryDirectory(prefix=prefix) as scratch:
            files = {}
            for arm, session_input in inputs.items():
                files[arm] = Path(scratch) / f"{arm}.json"
                files[arm].write_text(session_input.model_dump_json())
            arms = list(inputs)
            for run in range(runs + 1):  # the first run of each arm warms up and is not counted
                for arm in arms if run % 2 == 0 else arms[::-1]:
                    session_id, events = play(stack, files[arm], arm)
                    check(arm, events)
                    took = wall_seconds(events)
                    if run:
                        walls[arm].append(took)
                    print(f"run {run}/{runs} {arm}: {took:.2f} s ({session_id})", flush=True)
    finally:
        _stack.down(stack)
    return walls
