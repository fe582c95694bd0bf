"""The model-turn activity: one streaming Messages API call through the official `anthropic` SDK.

Credentials and endpoint come from this worker's environment only (`ANTHROPIC_API_KEY`, `ANTHROPIC_BASE_URL`).
The SDK's own retries are off (`max_retries=0`): the session workflow owns retries, see `errors.py`. One case is
sent again here, once: a request that met its kept-alive connection closed by the server before any answer (the
server's close of an idle connection crossing it in the socket; nothing of the turn happened). A stream that
sends no byte for the stall timeout ends the attempt (the SDK's per-read timeout), so a stalled endpoint costs that
long, not the activity's 10-minute timeout; a stream that breaks in any other way ends it too, as a retryable error.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import anthropic
from anthropic.lib.streaming import AsyncMessageStream, ParsedMessageStreamEvent
from temporalio import activity
from temporalio.client import Client

from activities.context import build_messages, build_system, build_tools, with_cache_breakpoints
from activities.errors import ModelStreamBroken, classify, closed_before_answer, model_error, stream_broken
from corral.contract.activities import (
    ModelContext,
    ModelContextQuery,
    ModelOutputBlock,
    ModelTextOutput,
    ModelThinkingOutput,
    ModelToolUseOutput,
    ModelTurnInput,
    ModelTurnResult,
)
from corral.contract.context import SUMMARIZER_SYSTEM, SUMMARY_REQUEST, view
from corral.contract.events import (
    AgentThreadContextCompacted,
    ModelUsage,
    RefusalStopDetails,
    SessionEvent,
    SystemMessage,
)
from corral.contract.proxy import McpToolSpec
from corral.contract.session import AgentConfig
from corral.hands.heartbeat import heartbeating
from corral.names import (
    ACTIVITY_MODEL_TURN,
    DEFAULT_MODEL_STALL_TIMEOUT_SECONDS,
    QUERY_MODEL_CONTEXT,
)
from relay import AttemptStream, StreamPublisher

log = logging.getLogger(__name__)

KEEPALIVE_SECONDS = 30.0
HEARTBEAT_INTERVAL_SECONDS = 0.25
"""How often a model turn records a heartbeat. The SDK core sends the latest one at most once a second (workers/roles.py
MODEL_HEARTBEAT_THROTTLE) from its own thread; recording several per second means a busy event loop has to stall
for most of the heartbeat timeout (workflows/policies.py MODEL_HEARTBEAT_TIMEOUT, 2 s) before the server misses one."""


@dataclass
class _CachedSession:
    agent: AgentConfig
    entries: list[SessionEvent] = field(default_factory=list)
    mcp_tools: list[McpToolSpec] = field(default_factory=list)


class ConversationCache:
    """Per-run conversation entries this worker has seen, so a turn only needs the entries added since."""

    def __init__(self, max_sessions: int = 256) -> None:
        self._sessions: OrderedDict[tuple[str, str], _CachedSession] = OrderedDict()
        self._max_sessions = max_sessions

    def get(self, key: tuple[str, str]) -> _CachedSession | None:
        cached = self._sessions.get(key)
        if cached is not None:
            self._sessions.move_to_end(key)
        return cached

    def put(self, key: tuple[str, str], value: _CachedSession) -> None:
        self._sessions[key] = value
        self._sessions.move_to_end(key)
        while len(self._sessions) > self._max_sessions:
            self._sessions.popitem(last=False)


class ModelActivities:
    """Holds the Temporal client (to read the log) and the model client; both are made once per worker. With a
    `worker_task_queue` (this worker's own queue), each result names it, so the session routes its next turn here,
    where the conversation is cached (workflows/_hands.py `ModelRoute`)."""

    def __init__(
        self,
        temporal: Client,
        model: anthropic.AsyncAnthropic | None = None,
        stream: StreamPublisher | None = None,
        stall_timeout_seconds: float = DEFAULT_MODEL_STALL_TIMEOUT_SECONDS,
        worker_task_queue: str | None = None,
    ) -> None:
        self._temporal = temporal
        self._worker_task_queue = worker_task_queue
        self._model = model or anthropic.AsyncAnthropic(max_retries=0, http_client=warm_http_client())
        self._cache = ConversationCache()
        self._stream = stream
        self._stall_seconds = stall_timeout_seconds
        self._timeout = _with_read_timeout(self._model.timeout, stall_timeout_seconds)

    async def _context(self, input: ModelTurnInput) -> tuple[_CachedSession, list[SessionEvent]]:
        """The agent and the full conversation for this turn: cached entries + the input's delta."""
        key = (input.session_id, input.run_id)
        cached = self._cache.get(key)
        if cached is None and input.agent is not None and input.delta_start == 0:
            cached = _CachedSession(agent=input.agent, mcp_tools=list(input.mcp_tools))
        if cached is None or len(cached.entries) < input.delta_start:
            cached = await self._read_log(input, cached)
        entries = cached.entries[: input.delta_start] + list(input.delta)
        if input.delta_by_reference:
            await self._fill_in(input, entries)
        if len(entries) != input.conversation_length:
            raise RuntimeError(f"conversation has {len(entries)} entries, the turn expects {input.conversation_length}")
        self._cache.put(key, _CachedSession(agent=cached.agent, entries=entries, mcp_tools=cached.mcp_tools))
        return cached, entries

    async def _fill_in(self, input: ModelTurnInput, entries: list[SessionEvent]) -> None:
        """Read the delta's entries sent by reference (large tool results) from the session, in place."""
        handle = self._temporal.get_workflow_handle(input.session_id, run_id=input.run_id)
        start = input.delta_start + min(input.delta_by_reference)
        end = input.delta_start + max(input.delta_by_reference) + 1
        position = start
        while position < end:
            page = await handle.query(
                QUERY_MODEL_CONTEXT, ModelContextQuery(start=position, end=end), result_type=ModelContext
            )
            for offset, entry in enumerate(page.entries):
                if position + offset - input.delta_start in input.delta_by_reference:
                    entries[position + offset] = entry
            if page.next_start <= position:
                raise RuntimeError(f"the session returned no entries from {position} on (expected up to {end})")
            position = page.next_start

    async def _read_log(self, input: ModelTurnInput, cached: _CachedSession | None) -> _CachedSession:
        """Page the entries this worker lacks out of the session through the `model_context` query."""
        handle = self._temporal.get_workflow_handle(input.session_id, run_id=input.run_id)
        entries = list(cached.entries) if cached else []
        agent = cached.agent if cached else None
        mcp_tools = cached.mcp_tools if cached else []
        while True:
            page = await handle.query(
                QUERY_MODEL_CONTEXT,
                ModelContextQuery(start=len(entries), end=input.delta_start),
                result_type=ModelContext,
            )
            agent, mcp_tools = page.agent, page.mcp_tools
            entries.extend(page.entries)
            if page.next_start >= input.delta_start:
                break
        return _CachedSession(agent=agent, entries=entries, mcp_tools=mcp_tools)

    @activity.defn(name=ACTIVITY_MODEL_TURN)
    async def model_turn(self, input: ModelTurnInput) -> ModelTurnResult:
        """Stream one model response and return its blocks, stop reason and usage."""
        async with heartbeating(HEARTBEAT_INTERVAL_SECONDS):
            session, entries = await self._context(input)
            agent = session.agent
            if input.summarize_through is None:
                shown = view(entries, input.elide_before, input.max_block_chars)
                messages, system = build_messages(shown), build_system(agent.system, shown)
            else:
                messages, system = _summary_request(entries, input, agent.system)
            request: dict[str, Any] = {"model": agent.model, "max_tokens": agent.max_tokens, "messages": messages}
            if system:
                request["system"] = system
            tools = build_tools(agent, session.mcp_tools)
            if tools:
                request["tools"] = tools
            with_cache_breakpoints(request)
            metrics = _TurnMetrics(agent.model, summary=input.summarize_through is not None)
            try:
                async with (
                    self._live(input) as live,
                    self._response(request) as stream,
                    contextlib.aclosing(_whole(stream, self._stall_seconds)) as events,
                ):
                    async for event in events:
                        if event.type == "content_block_delta":
                            metrics.first_token()
                        if live is not None and event.type == "content_block_delta":
                            if event.delta.type == "text_delta":
                                await live.delta(event.index, "text", event.delta.text)
                            elif event.delta.type == "thinking_delta":
                                await live.delta(event.index, "thinking", event.delta.thinking)
                    message = await stream.get_final_message()
            except (anthropic.APIStatusError, anthropic.APIConnectionError, ModelStreamBroken) as exc:
                info = classify(exc)
                assert info is not None
                log.warning("model turn %s of %s failed: %s", input.turn, input.session_id, exc)
                metrics.ended(info.error_type)
                raise model_error(exc, info) from exc
        metrics.ended("ok")
        return _result(message, self._worker_task_queue)

    @contextlib.asynccontextmanager
    async def _response(self, request: dict[str, Any]) -> AsyncIterator[AsyncMessageStream[Any]]:
        """The response stream. A request that met its kept-alive connection closed by the server before any
        answer (the server's idle close crossing it) is sent once more, on a new connection: nothing of the turn
        happened, so that costs no visible retry (a `session.error`, a turn sent back to the queue)."""
        async with contextlib.AsyncExitStack() as opened:
            try:
                stream = await opened.enter_async_context(self._model.messages.stream(**request, timeout=self._timeout))
            except anthropic.APIConnectionError as exc:
                if not closed_before_answer(exc):
                    raise
                log.info("the connection to the model was closed as a request went out (%r): sent again", exc.__cause__)
                stream = await opened.enter_async_context(self._model.messages.stream(**request, timeout=self._timeout))
            yield stream

    def _live(self, input: ModelTurnInput) -> contextlib.AbstractAsyncContextManager[AttemptStream | None]:
        """Live deltas for clients (ephemeral, never in history); nothing when no relay is configured."""
        if self._stream is None or input.stream_id is None:
            return contextlib.nullcontext(None)
        # Attempts grow across both retry layers: the workflow's own (visible) and Temporal's (lost workers). A
        # routed turn comes before any attempt on the shared queue, which replaces it if its worker was lost.
        attempt = input.stream_attempt * 1000 + (0 if input.routed else activity.info().attempt)
        return self._stream.attempt(input.session_id, input.stream_id, attempt)


class _TurnMetrics:
    """A model turn's metrics, through the activity's meter (a no-op unless `CORRAL_METRICS_ADDRESS` is set):
    `corral_model_turns` by model and outcome, `corral_model_time_to_first_token` from the request to the first
    content delta; `kind` tells a compaction's summary from a turn of the conversation."""

    def __init__(self, model: str, summary: bool) -> None:
        kind = "summary" if summary else "turn"
        self._meter = activity.metric_meter().with_additional_attributes({"model": model, "kind": kind})
        self._started = time.monotonic()
        self._first_token_seen = False

    def first_token(self) -> None:
        if not self._first_token_seen:
            self._first_token_seen = True
            self._meter.create_histogram_timedelta(
                "corral_model_time_to_first_token", "From a model request to its first content delta", "duration"
            ).record(timedelta(seconds=time.monotonic() - self._started))

    def ended(self, outcome: str) -> None:
        self._meter.create_counter("corral_model_turns", "Model turns streamed, by outcome").add(
            1, {"outcome": outcome}
        )


def warm_http_client() -> anthropic.DefaultAsyncHttpxClient:
    """The `anthropic` SDK's own HTTP client, but an idle connection stays in the pool for `KEEPALIVE_SECONDS`
    (httpx's default is 5 s): a user's next message usually comes later than that, and should not pay a new
    connection (TCP and TLS) before its first token. A connection the server closed meanwhile is not reused."""
    limits = copy.copy(anthropic.DEFAULT_CONNECTION_LIMITS)  # the SDK's own class of its own HTTP library
    limits.keepalive_expiry = KEEPALIVE_SECONDS
    return anthropic.DefaultAsyncHttpxClient(limits=limits)


async def warm_up(model: anthropic.AsyncAnthropic, timeout_seconds: float = 5.0) -> bool:
    """Open a connection to the model API before the first turn needs one (`GET /v1/models`, which costs no
    tokens), so the first turn pays no connect. True if it answered; an endpoint that does not is only logged:
    the worker starts anyway, and the first turn connects as it would have."""
    try:
        await model.models.list(limit=1, timeout=timeout_seconds)
    except anthropic.APIStatusError:
        return True  # it answered: the connection is open and pooled all the same
    except anthropic.APIError as exc:
        log.info("model API not reachable at start (%s); the first turn will connect", type(exc).__name__)
        return False
    return True


async def _whole(
    stream: AsyncMessageStream[Any], stall_seconds: float
) -> AsyncGenerator[ParsedMessageStreamEvent[Any]]:
    """The stream's events, to its `message_stop`; a stream that breaks before (cut off, a frame that is not JSON, no
    byte for `stall_seconds`, or a clean end too early, which the SDK takes for a whole message) is ModelStreamBroken.
    Only the stream's own failures are translated: what the caller does with an event is not run in here."""
    stopped = False
    try:
        async for event in stream:
            stopped = event.type == "message_stop"
            yield event
    except Exception as exc:
        broken = stream_broken(exc, stall_seconds)
        if broken is None:
            raise
        raise broken from exc
    if not stopped:
        raise ModelStreamBroken("the stream ended before its message_stop event")


def _with_read_timeout(timeout: float | anthropic.Timeout | None, read_seconds: float) -> anthropic.Timeout:
    """The client's own timeouts, but at most `read_seconds` between two reads of a response (the stall timeout)."""
    base = timeout if isinstance(timeout, anthropic.Timeout) else anthropic.Timeout(timeout)
    return anthropic.Timeout(connect=base.connect, read=read_seconds, write=base.write, pool=base.pool)


def _summary_request(
    entries: list[SessionEvent], input: ModelTurnInput, agent_system: str | None
) -> tuple[list[dict[str, Any]], str]:
    """The conversation up to `summarize_through` as the model sees it, then the request for a summary."""
    assert input.summarize_through is not None
    through = input.summarize_through
    shown = [
        entry
        for entry in view(entries, input.elide_before, input.max_block_chars)
        if entry.position <= through or isinstance(entry, AgentThreadContextCompacted)
    ]
    messages = build_messages(shown)
    ask = {"type": "text", "text": SUMMARY_REQUEST}
    if messages and messages[-1]["role"] == "user":
        messages[-1]["content"].append(ask)
    else:
        messages.append({"role": "user", "content": [ask]})
    added = "\n\n".join(block.text for e in shown if isinstance(e, SystemMessage) for block in e.content)
    instructions = "\n\n".join(part for part in (agent_system, added) if part)
    system = SUMMARIZER_SYSTEM + (f"\n\nThe agent's own instructions:\n{instructions}" if instructions else "")
    return messages, system


def _result(message: anthropic.types.Message, worker_task_queue: str | None) -> ModelTurnResult:
    content: list[ModelOutputBlock] = []
    for block in message.content:
        if block.type == "text":
            content.append(ModelTextOutput(text=block.text))
        elif block.type == "tool_use":
            content.append(ModelToolUseOutput(name=block.name, input=dict(block.input or {})))
        elif block.type in ("thinking", "redacted_thinking"):
            content.append(ModelThinkingOutput())
    usage = message.usage
    return ModelTurnResult(
        content=content,
        usage=ModelUsage(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cache_creation_input_tokens=usage.cache_creation_input_tokens or 0,
            cache_read_input_tokens=usage.cache_read_input_tokens or 0,
        ),
        model=message.model,
        request_id=getattr(message, "_request_id", None),
        stop_reason=message.stop_reason,
        refusal=_refusal(message),
        worker_task_queue=worker_task_queue,
    )


def _refusal(message: anthropic.types.Message) -> RefusalStopDetails | None:
    details = getattr(message, "stop_details", None)  # anthropic >= 2.14; a server may send none
    if message.stop_reason != "refusal":
        return None
    if details is None:
        return RefusalStopDetails()
    return RefusalStopDetails(category=details.category, explanation=details.explanation)
