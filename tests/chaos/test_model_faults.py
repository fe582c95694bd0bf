"""The fault matrix's model-endpoint rows: 429 with `retry-after`, bursts of 529, a stream cut mid-message, a
malformed stream, a stream that stalls after its first token, and a 400 that no retry will fix.

Each test runs `chaos_n()` sessions at once against the offline model server (real HTTP, the real `anthropic`
SDK). Every session has its own script, so the requests the server saw are counted per session: its turn first
runs `append_line` (a side effect counted in a file of its own), then the model's next answer meets the fault.
The retry must not run the tool again nor log anything twice, and the final message must be logged once, whole.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from temporalio.client import WorkflowHandle

from corral.client import send_text
from corral.contract.events import SessionError, SessionEvent
from tests.chaos.matrix import Outcome, chaos_n, check_log, errors_of, record
from tests.conftest import Stack, assert_log_is_whole, read_events, stop_reason, texts, wait_for_idle
from workers.roles import model_worker

WAIT = 180  # seconds: generous, the machine is shared; no test asserts on how long anything took
ANSWER = "the answer, whole: one two three four five six seven eight"

BEFORE_THE_FAULT = [
    "user.message",
    "session.status_running",
    "span.model_request_start",
    "span.model_request_end",
    "agent.tool_use",
    "agent.tool_result",
]
"""The turn up to the model request that meets the fault: the first answer ran the tool."""


def retried(times: int) -> list[str]:
    """The events of a model request that failed `times` times and was retried each time, then answered."""
    attempt = ["span.model_request_start", "span.model_request_end", "session.error"]
    wait = ["session.status_rescheduled", "session.status_running"]
    answer = ["span.model_request_start", "span.model_request_end", "agent.message", "session.status_idle"]
    return [*((attempt + wait) * times), *answer]


@dataclass
class Session:
    """One session of a fault test: its handle, its own model script, and the file its tool call appends to."""

    handle: WorkflowHandle
    model: str
    marker: Path


async def start_sessions(stack: Stack, tmp_path: Path, n: int, answer: dict[str, Any], **start: Any) -> list[Session]:
    """`n` sessions at once, each one turn: `append_line`, then `answer` (the step that meets the fault)."""

    async def one(index: int) -> Session:
        marker = tmp_path / f"runs-{index}"
        tool = {"tool_uses": [{"name": "append_line", "input": {"path": str(marker)}}]}
        model = stack.script([tool, answer])
        handle = await stack.start(model, "go", tools=[stack.hand_tool("append_line")], **start)
        return Session(handle, model, marker)

    return list(await asyncio.gather(*(one(i) for i in range(n))))


async def turn_of(session: Session) -> list[SessionEvent]:
    return await wait_for_idle(session.handle, within_seconds=WAIT)


def logged_errors(events: list[SessionEvent]) -> str:
    """The session.errors of a log, counted: `3 x session.error model_overloaded_error (retrying)`."""
    counted = Counter(errors_of(events))
    return ", ".join(f"{n} x session.error {kind} ({status})" for (kind, status), n in counted.items()) or "no error"


def tool_runs(session: Session) -> int:
    return len(session.marker.read_text().splitlines()) if session.marker.exists() else 0


def recovery_seconds(events: list[SessionEvent]) -> float:
    """From the start of the first model request that failed to the end of its turn, in workflow time."""
    ends = {getattr(e, "model_request_start_id", None) for e in events if getattr(e, "is_error", False)}
    failed = next(e for e in events if e.id in ends)
    idle = next(e for e in events if e.type == "session.status_idle" and e.position > failed.position)
    return (idle.created_at - failed.created_at).total_seconds()


async def outcome_of(stack: Stack, sessions: list[Session], fault: str, expected: str) -> Outcome:
    """The row of the matrix, from each session's whole log: gaps and duplicates, the answer logged once, the tool
    run once; what was observed is told from the errors logged and the requests the model server saw."""
    lost = duplicated = 0
    seconds = []
    seen: Counter[str] = Counter()
    for session in sessions:
        events = await read_events(session.handle)
        check = check_log(events)
        answers, runs = texts(events).count(ANSWER), tool_runs(session)
        lost += check.gaps + (answers == 0) + (runs == 0)
        duplicated += check.duplicates + max(0, answers - 1) + max(0, runs - 1)
        seconds.append(recovery_seconds(events))
        requests = len(stack.requests(session.model))
        seen[f"{logged_errors(events)}; {requests} requests; answer logged {answers}x, tool run {runs}x"] += 1
    observed = "; ".join(f"{count} of {len(sessions)}: {what}" for what, count in seen.items())
    return Outcome(fault, expected, len(sessions), observed, lost, duplicated, seconds)


def assert_resumed_whole(stack: Stack, session: Session, events: list[SessionEvent], requests: int) -> None:
    """The retried turn: the answer once and whole, the tool run once, the requests the server saw exactly."""
    assert_log_is_whole(events)
    assert texts(events) == [ANSWER]
    assert [e.type for e in events].count("agent.tool_use") == 1
    assert tool_runs(session) == 1, "the tool ran again on a retry"
    assert stop_reason(events[-1]).type == "end_turn"
    assert len(stack.requests(session.model)) == requests, "not the requests expected at the model endpoint"


async def finish(sessions: list[Session]) -> list[list[SessionEvent]]:
    """Each session's turn, up to its `session.status_idle`."""
    return list(await asyncio.gather(*(turn_of(s) for s in sessions)))


async def test_a_429_with_retry_after_is_waited_out_then_the_turn_resumes(stack: Stack, tmp_path: Path) -> None:
    """429 with `retry-after: 2`: a `session.error` (model_rate_limited_error, retrying), the session waits at least
    the 2 s the server asked for (a workflow timer of exactly that), then the turn resumes and ends cleanly."""
    n = chaos_n()
    limited = {"text": ANSWER, "fail": [{"status": 429, "type": "rate_limit_error", "retry_after": 2}]}
    sessions = await start_sessions(stack, tmp_path, n, limited)
    turns = await finish(sessions)
    for session, events in zip(sessions, turns, strict=True):
        assert [e.type for e in events] == BEFORE_THE_FAULT + retried(1)
        assert errors_of(events) == [("model_rate_limited_error", "retrying")]
        assert "429" in next(e for e in events if isinstance(e, SessionError)).error.message
        assert_resumed_whole(stack, session, events, requests=3)
        history = await session.handle.fetch_history()
        timers = [
            e.timer_started_event_attributes.start_to_fire_timeout.ToTimedelta()
            for e in history.events
            if e.HasField("timer_started_event_attributes")
        ]
        assert timers == [timedelta(seconds=2)], "the session did not wait what retry-after asked"
        rescheduled = next(e for e in events if e.type == "session.status_rescheduled")
        next_request = [e for e in events if e.type == "span.model_request_start"][-1]
        assert next_request.created_at - rescheduled.created_at >= timedelta(seconds=2)
    record(
        await outcome_of(
            stack,
            sessions,
            "model: 429 with retry-after",
            "session.error(model_rate_limited_error, retrying); waits retry-after; clean resume",
        )
    )


async def test_a_burst_of_529s_is_retried_and_resumes_with_nothing_twice(stack: Stack, tmp_path: Path) -> None:
    """Three 529s in a row: three `session.error`s (model_overloaded_error, retrying), each followed by a
    rescheduled wait, then the answer: logged once, the tool not run again, four requests to the endpoint."""
    n = chaos_n()
    burst = {"text": ANSWER, "fail": [{"status": 529, "type": "overloaded_error"}] * 3}
    sessions = await start_sessions(stack, tmp_path, n, burst, model_retry={"initial_delay_seconds": 0.2})
    turns = await finish(sessions)
    for session, events in zip(sessions, turns, strict=True):
        assert [e.type for e in events] == BEFORE_THE_FAULT + retried(3)
        assert errors_of(events) == [("model_overloaded_error", "retrying")] * 3
        assert_resumed_whole(stack, session, events, requests=5)
    record(
        await outcome_of(
            stack,
            sessions,
            "model: burst of 529s (3 in a row)",
            "3 x session.error(model_overloaded_error, retrying); clean resume",
        )
    )


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("cut", "the stream broke off"),  # the connection drops: a chunked body that never ends
        ("end", "the stream ended before its message_stop event"),  # the body ends cleanly, the message does not
    ],
)
async def test_a_stream_cut_mid_message_is_retried_and_logged_once(
    stack: Stack, tmp_path: Path, kind: str, says: str
) -> None:
    """The stream breaks off after three words of the answer: a `session.error` (model_request_failed_error,
    retrying), and the retry's whole answer is logged once, with no partial message before it."""
    n = chaos_n()
    cut = {"text": ANSWER, "break_stream": [{"kind": kind, "after_deltas": 3}]}
    sessions = await start_sessions(stack, tmp_path, n, cut, model_retry={"initial_delay_seconds": 0.2})
    turns = await finish(sessions)
    for session, events in zip(sessions, turns, strict=True):
        assert texts(events) == [ANSWER], "a partial message was logged"
        assert [e.type for e in events] == BEFORE_THE_FAULT + retried(1)
        assert errors_of(events) == [("model_request_failed_error", "retrying")]
        assert says in next(e for e in events if isinstance(e, SessionError)).error.message
        assert_resumed_whole(stack, session, events, requests=3)
    record(
        await outcome_of(
            stack,
            sessions,
            f"model: stream {'cut' if kind == 'cut' else 'ended early (no message_stop)'} mid-message",
            "session.error(model_request_failed_error, retrying); the whole answer logged once",
        )
    )


async def test_a_malformed_stream_is_retried(stack: Stack, tmp_path: Path) -> None:
    """A data line that is not JSON mid-stream: the SDK cannot read on, and a fresh request is the remedy, so a
    `session.error` (model_request_failed_error, retrying) that says the stream was malformed, then a clean resume
    (a stream that is malformed every time ends, like any retried error, as `exhausted`)."""
    n = chaos_n()
    garbled = {"text": ANSWER, "break_stream": [{"kind": "malformed", "after_deltas": 2}]}
    sessions = await start_sessions(stack, tmp_path, n, garbled, model_retry={"initial_delay_seconds": 0.2})
    turns = await finish(sessions)
    for session, events in zip(sessions, turns, strict=True):
        assert [e.type for e in events] == BEFORE_THE_FAULT + retried(1)
        assert errors_of(events) == [("model_request_failed_error", "retrying")]
        assert "the stream was malformed" in next(e for e in events if isinstance(e, SessionError)).error.message
        assert_resumed_whole(stack, session, events, requests=3)
    record(
        await outcome_of(
            stack,
            sessions,
            "model: malformed SSE (a data line that is not JSON)",
            "session.error(model_request_failed_error, retrying); clean resume",
        )
    )


STALL_SECONDS = 3.0
"""The test's model worker's stall timeout: small, so the test is short (production default: 120 s)."""


@contextlib.asynccontextmanager
async def stall_watching_worker(stack: Stack) -> AsyncIterator[str]:
    """A model worker (on a task queue of its own) whose stall timeout is `STALL_SECONDS`; yields the queue."""
    queue = f"{stack.model_queue}-stall"
    client = anthropic.AsyncAnthropic(base_url=stack.model_server.base_url, api_key="test-key", max_retries=0)
    async with model_worker(stack.client, client, queue, stall_timeout_seconds=STALL_SECONDS):
        yield queue


def cancelled_streams(stack: Stack) -> int:
    count: int = httpx.get(f"{stack.model_server.base_url}/_corral/stats").json()["cancelled_streams"]
    return count


async def test_a_stream_that_stalls_after_its_first_token_is_noticed_and_retried(stack: Stack, tmp_path: Path) -> None:
    """The stream sends its first token, then nothing: the model activity notices after its stall timeout (no byte
    for that long), not at its 10-minute timeout, closes the stream and fails the attempt with a `session.error`
    (model_request_failed_error, retrying) that says so; the retry answers, logged once."""
    n = chaos_n()
    stall = {"text": ANSWER, "break_stream": [{"kind": "stall", "after_deltas": 1}]}
    cancelled_before = cancelled_streams(stack)
    async with stall_watching_worker(stack) as queue:
        sessions = await start_sessions(
            stack, tmp_path, n, stall, model_task_queue=queue, model_retry={"initial_delay_seconds": 0.2}
        )
        turns = await finish(sessions)
    for session, events in zip(sessions, turns, strict=True):
        assert [e.type for e in events] == BEFORE_THE_FAULT + retried(1)
        assert errors_of(events) == [("model_request_failed_error", "retrying")]
        message = next(e for e in events if isinstance(e, SessionError)).error.message
        assert f"the stream stalled: no data for {STALL_SECONDS:g} s" in message
        assert_resumed_whole(stack, session, events, requests=3)
    async with asyncio.timeout(WAIT):  # the stalled streams were closed by the worker, not left open on the server
        while cancelled_streams(stack) - cancelled_before < n:
            await asyncio.sleep(0.1)
    record(
        await outcome_of(
            stack,
            sessions,
            "model: stream stalls after its first token",
            f"noticed after the stall timeout ({STALL_SECONDS:g} s here); "
            "session.error(model_request_failed_error, retrying); clean resume",
        )
    )


async def test_a_400_no_retry_fixes_is_tried_once_and_the_next_message_works(stack: Stack, tmp_path: Path) -> None:
    """A 400 (invalid_request_error): one request, no retry, a `session.error` (model_request_failed_error,
    exhausted) and the turn ends (`retries_exhausted`); the session stays usable and the next message is answered."""
    n = chaos_n()
    refused = {
        "text": ANSWER,
        "fail": [{"status": 400, "type": "invalid_request_error", "message": "scripted: no retry fixes this"}],
    }
    sessions = await start_sessions(stack, tmp_path, n, refused)
    turns = await finish(sessions)
    for session, events in zip(sessions, turns, strict=True):
        assert_log_is_whole(events)
        given_up = ["span.model_request_start", "span.model_request_end", "session.error", "session.status_idle"]
        assert [e.type for e in events] == [*BEFORE_THE_FAULT, *given_up]
        assert errors_of(events) == [("model_request_failed_error", "exhausted")]
        error = next(e for e in events if isinstance(e, SessionError)).error
        assert "400" in error.message and "no retry fixes this" in error.message
        assert stop_reason(events[-1]).type == "retries_exhausted"
        assert len(stack.requests(session.model)) == 2, "a 400 must be tried once"
    for session in sessions:
        await send_text(session.handle, "again")
    after = [turn[-1].position for turn in turns]
    nexts = await asyncio.gather(
        *(wait_for_idle(s.handle, after=a, within_seconds=WAIT) for s, a in zip(sessions, after, strict=True))
    )
    for session, events in zip(sessions, nexts, strict=True):
        assert texts(events) == [ANSWER] and stop_reason(events[-1]).type == "end_turn"
        assert len(stack.requests(session.model)) == 3
        assert tool_runs(session) == 1
        assert_log_is_whole(await read_events(session.handle))
    record(
        await outcome_of(
            stack,
            sessions,
            "model: 400 that no retry fixes",
            "session.error(model_request_failed_error, exhausted), tried once; the next message works",
        )
    )
