"""Property tests (hypothesis) of the contract models: whatever a client sends, validation either succeeds or raises
pydantic's ValidationError (never another exception), and a model that validates crosses every boundary unchanged:
JSON, and corral's Temporal data converter (the payload converter and the blob store for large payloads).

Two kinds of input, as they reach corral:
- Python objects, for the models a producer builds (the CLI, corral.client, the HTTP API): the start input, the agent,
  the signal and update inputs, the events query. A string here may hold a lone surrogate (Python's decoding of
  invalid UTF-8 arguments gives one) and a dict may be nested past what JSON parsers and pydantic's serializer take.
- JSON text, for every model, as history and raw clients (the `temporal` CLI, another SDK) give it.

Inputs are mutations of valid examples (a value replaced by a wrong type, a 2 MB string, NUL characters, a lone
surrogate, a huge integer, deep nesting; a field removed or added) and arbitrary JSON values.
"""

from __future__ import annotations

import asyncio
import copy
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, TypeAdapter, ValidationError
from temporalio.api.common.v1 import Payload
from temporalio.exceptions import ApplicationError

from corral.contract.activities import ExecuteInput, ModelContextQuery, ModelTurnInput, ModelTurnResult
from corral.contract.carry import SessionCarry
from corral.contract.events import SessionEvent
from corral.contract.limits import MAX_JSON_DEPTH
from corral.contract.sandbox import Environment
from corral.contract.session import (
    AgentConfig,
    EventsQuery,
    ForkSource,
    InterruptSignal,
    SendEventsInput,
    SessionInput,
    UserMessageSignal,
)
from corral.converter import INVALID_INPUT, CorralPayloadConverter
from corral.temporal import data_converter

NOW = "2026-12-01T00:00:00Z"
AGENT: dict[str, Any] = {
    "model": "claude-sonnet-4-5",
    "name": "helper",
    "system": "Be brief.",
    "max_tokens": 2048,
    "context_budget_tokens": 50_000,
    "tools": [
        {"type": "custom", "name": "lookup", "description": "d", "input_schema": {"type": "object", "properties": {}}},
        {"type": "hand", "name": "spew", "input_schema": {"type": "object"}, "task_queue": "q", "timeout_seconds": 5},
        {"type": "corral_utility"},
        {"type": "agent_toolset_20260401", "configs": [{"name": "bash", "enabled": True}]},
        {"type": "mcp_toolset", "mcp_server_name": "docs", "configs": [{"name": "search", "enabled": False}]},
    ],
    "mcp_servers": [{"type": "url", "name": "docs", "url": "https://mcp.example.com/mcp"}],
}
BLOCKS: list[Any] = [
    {"type": "text", "text": "hello"},
    {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
    {"type": "document", "source": {"type": "text", "data": "a doc"}, "title": "t"},
]
SESSION_INPUT: dict[str, Any] = {
    "agent": AGENT,
    "title": "a title",
    "metadata": {"team": "blue"},
    "environment": {
        "packages": {"apt": ["jq"], "pip": ["requests==2.32.0"]},
        "working_dir": "/workspace/src",
        "limits": {"cpus": 0.5, "memory_mb": 512, "pids": 64, "tmp_mb": 32},
        "networking": {"type": "limited", "allowed_hosts": ["*.example.com"]},
        "bash_timeout_seconds": 30,
    },
    "resources": [{"type": "git_repository", "url": "https://git.example.com/r.git", "repository_id": "repo1"}],
    "vault_ids": ["vlt_1"],
    "message": BLOCKS,
    "model_retry": {"max_attempts": 3, "initial_delay_seconds": 0.5, "max_delay_seconds": 10},
    "fork": {"session_id": "sesn_source", "position": 7},
    "continue_as_new_after_events": 500,
}
COMMON = {"created_at": NOW, "processed_at": NOW}
EVENTS: list[dict[str, Any]] = [
    {"type": "user.message", "id": "e1", "position": 1, **COMMON, "content": BLOCKS, "client_id": "c1"},
    {"type": "user.interrupt", "id": "e2", "position": 2, **COMMON},
    {"type": "user.custom_tool_result", "id": "e3", "position": 3, **COMMON, "custom_tool_use_id": "e9",
     "content": [{"type": "text", "text": "r"}], "is_error": True},
    {"type": "agent.message", "id": "e4", "position": 4, **COMMON, "content": [{"type": "text", "text": "hi"}]},
    {"type": "agent.tool_use", "id": "e5", "position": 5, **COMMON, "name": "spew", "input": {"n": [1, {"a": None}]}},
    {"type": "agent.tool_result", "id": "e6", "position": 6, **COMMON, "tool_use_id": "e5",
     "content": [{"type": "text", "text": "out"}]},
    {"type": "agent.mcp_tool_use", "id": "e7", "position": 7, **COMMON, "mcp_server_name": "docs", "name": "search",
     "input": {}},
    {"type": "agent.thread_context_compacted", "id": "e8", "position": 8, **COMMON, "summary": "s",
     "start_position": 1, "end_position": 7},
    {"type": "session.status_idle", "id": "e9", "position": 9, **COMMON,
     "stop_reason": {"type": "requires_action", "event_ids": ["e5"]}},
    {"type": "session.error", "id": "e10", "position": 10, **COMMON,
     "error": {"type": "model_overloaded_error", "message": "m", "retry_status": {"type": "retrying"}}},
    {"type": "span.model_request_end", "id": "e11", "position": 11, **COMMON, "model_request_start_id": "e0",
     "model_usage": {"input_tokens": 5, "output_tokens": 7}},
]  # fmt: skip
USER_EVENTS: list[dict[str, Any]] = [
    {"type": "user.message", "content": "hi", "id": "c1"},
    {"type": "user.message", "content": BLOCKS},
    {"type": "user.interrupt"},
    {"type": "user.custom_tool_result", "custom_tool_use_id": "e9", "content": "done", "is_error": False},
    {"type": "user.tool_confirmation", "tool_use_id": "e5", "result": "deny", "deny_message": "no"},
]
HANDLE = {"session_id": "s", "container_id": "c", "container_name": "n", "volume": "v", "image": "i",
          "task_queue": "q", "generation": 2}  # fmt: skip

ENTRY_SEEDS: dict[Any, dict[str, Any]] = {
    SessionInput: SESSION_INPUT,
    AgentConfig: AGENT,
    UserMessageSignal: {"content": BLOCKS, "id": "c1"},
    SendEventsInput: {"events": USER_EVENTS},
    EventsQuery: {"after": 3, "before": 40, "limit": 10, "types": ["user.message", "agent.message"]},
    InterruptSignal: {"id": "i1"},
}
"""What producers build from Python values: validated where they are made, before anything is sent."""
INTERNAL_SEEDS: dict[Any, dict[str, Any]] = {
    ForkSource: {"session_id": "sesn_x", "position": 3},
    Environment: SESSION_INPUT["environment"],
    ModelContextQuery: {"start": 0, "end": 5},
    ModelTurnInput: {"session_id": "s", "run_id": "r", "turn": 1, "conversation_length": 3, "delta_start": 0,
                     "delta": EVENTS[:4], "agent": AGENT, "stream_id": "e0", "delta_by_reference": [2]},
    ModelTurnResult: {"content": [{"type": "text", "text": "t"}, {"type": "tool_use", "name": "n", "input": {"a": 1}},
                                  {"type": "thinking"}],
                      "usage": {"input_tokens": 1}, "model": "m", "stop_reason": "max_tokens"},
    ExecuteInput: {"session_id": "s", "tool_use_id": "t", "name": "bash", "input": {"command": "ls"},
                   "sandbox": HANDLE},
    SessionCarry: {"run": 2, "phase": "turn", "archive": {"through": 4, "chunks": [1]}, "tail": EVENTS[4:],
                   "conversation": EVENTS, "pending": [5], "custom_results": {"e9": 6}, "client_ids": {"c1": "e1"},
                   "sandbox": {"handle": HANDLE, "generation": 2}, "created_at": NOW},
}  # fmt: skip
"""What only ever arrives as JSON (history, a raw client) or is built by corral from validated values."""
for index, event in enumerate(EVENTS):
    INTERNAL_SEEDS[(SessionEvent, index)] = event


def adapter(model: Any) -> TypeAdapter[Any]:
    return TypeAdapter(model[0] if isinstance(model, tuple) else model)


def nested(depth: int) -> Any:
    value: Any = "deep"
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


TWO_MB = "x" * (2 * 1024 * 1024)
HOSTILE_STRINGS = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["", " ", "\x00", "a\x00b", "\ud800", "x\udcff", "\ud83d", "\u202e\u0007\x1b[2J", "..", "/"]),
    st.just(TWO_MB),
    st.just("\x00" * 1000),
)
HUGE_INTS = st.sampled_from([10**30, -(10**30), 2**63, 2**64, -(2**63) - 1, 10**400])
LEAVES = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False, allow_infinity=False), HOSTILE_STRINGS
)
JSON_VALUES = st.recursive(
    LEAVES,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(HOSTILE_STRINGS, children, max_size=4),
    max_leaves=12,
)
HOSTILE_VALUES = st.one_of(JSON_VALUES, HUGE_INTS, st.integers(min_value=MAX_JSON_DEPTH - 2, max_value=400).map(nested))


def paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """The path of every node in a JSON value, the root included."""
    found = [prefix]
    if isinstance(value, dict):
        for key, child in value.items():
            found += paths(child, (*prefix, key))
    elif isinstance(value, list):
        for index, child in enumerate(value):
            found += paths(child, (*prefix, index))
    return found


def at(value: Any, path: tuple[Any, ...]) -> Any:
    for part in path:
        value = value[part]
    return value


@st.composite
def mutations(draw: st.DrawFn, seed: Any) -> Any:
    """`seed` with one to three changes: a value replaced, a field or item removed, a field added."""
    value = copy.deepcopy(seed)
    for _ in range(draw(st.integers(min_value=1, max_value=3))):
        path = draw(st.sampled_from(paths(value)))
        if not path:
            return draw(HOSTILE_VALUES)
        parent, key = at(value, path[:-1]), path[-1]
        action = draw(st.sampled_from(["replace", "replace", "remove", "add"]))
        if action == "replace":
            parent[key] = draw(HOSTILE_VALUES)
        elif action == "remove":
            del parent[key]
        elif isinstance(parent, dict):
            parent[draw(HOSTILE_STRINGS)] = draw(HOSTILE_VALUES)
        else:
            parent.append(draw(HOSTILE_VALUES))
    return value


def validated(model: Any, data: Any, *, from_json: bool) -> Any | None:
    """The model `data` makes, or None when validation refuses it; any other exception fails the test."""
    try:
        if from_json:
            return adapter(model).validate_json(json.dumps(data))
        return adapter(model).validate_python(data)
    except ValidationError as exc:
        assert exc.errors(), "a rejection says what is wrong"
        return None


def converter_round_trip(model: Any, value: Any) -> Any:
    """`value` encoded and decoded by corral's data converter (payloads over 256 KiB go to the blob store)."""
    converter = data_converter()

    async def go() -> Any:
        payloads = await converter.encode([value])
        (decoded,) = await converter.decode(payloads, [model[0] if isinstance(model, tuple) else model])
        return decoded

    return asyncio.run(go())


def assert_round_trips(model: Any, value: Any) -> None:
    hint = adapter(model)
    assert hint.validate_json(hint.dump_json(value)) == value, "JSON round trip"
    assert converter_round_trip(model, value) == value, "data converter round trip"


def strings_of(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for key, child in value.items() for s in (*strings_of(key), *strings_of(child))]
    if isinstance(value, list):
        return [s for child in value for s in strings_of(child)]
    return []


def depth_of(value: Any) -> int:
    if isinstance(value, dict):
        return 1 + max((depth_of(child) for child in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((depth_of(child) for child in value), default=0)
    return 0


def test_every_seed_is_valid_and_round_trips() -> None:
    """The seeds are valid, so a mutation that breaks one is what the properties below are about."""
    for model, seed in {**ENTRY_SEEDS, **INTERNAL_SEEDS}.items():
        value = adapter(model).validate_python(seed)
        assert_round_trips(model, value)


SURROGATE_START = {"agent": {"model": "m", "system": "\ud800"}}
DEEP_SCHEMA = {"agent": {"model": "m", "tools": [{"type": "custom", "name": "t", "input_schema": nested(300)}]}}
DEEP_SOURCE = {"events": [{"type": "user.message", "content": [{"type": "image", "source": nested(250)}]}]}


@pytest.mark.parametrize("model", list(ENTRY_SEEDS), ids=lambda m: m.__name__)
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_a_producer_gets_a_model_that_round_trips_or_a_validation_error(model: Any, data: st.DataObject) -> None:
    """Python values, as the CLI and corral.client build them: accepted values cross JSON and the converter
    unchanged; a lone surrogate or nesting past `MAX_JSON_DEPTH` is a ValidationError at once, not a failure to
    serialise later (where the CLI showed a traceback, or a workflow task failed on its own output)."""
    candidate = data.draw(st.one_of(mutations(ENTRY_SEEDS[model]), JSON_VALUES), label="input")
    value = validated(model, candidate, from_json=False)
    if value is not None:
        assert_round_trips(model, value)


@example(model=SessionInput, candidate=SURROGATE_START).via("a lone surrogate in an optional string")
@example(model=SessionInput, candidate={"agent": {"model": "m"}, "metadata": {"\udcff": "v"}}).via("in a key")
@example(model=SessionInput, candidate=DEEP_SCHEMA).via("an input schema nested 300 deep")
@example(model=SendEventsInput, candidate=DEEP_SOURCE).via("an image source nested 250 deep")
@example(model=UserMessageSignal, candidate={"content": "lone \udcff"}).via("a signal with a lone surrogate")
@settings(max_examples=1, deadline=None)
@given(model=st.just(SessionInput), candidate=st.just(SESSION_INPUT))
def test_hostile_text_and_nesting_are_refused_when_the_model_is_made(model: Any, candidate: Any) -> None:
    """The examples each failed before the limits (corral.contract.limits): they validated, then could not be
    serialised (PydanticSerializationError) or came back changed (a lone surrogate in a key)."""
    value = validated(model, candidate, from_json=False)
    hostile = depth_of(candidate) > MAX_JSON_DEPTH or any(
        not s.encode("utf-8", "surrogatepass").decode("utf-8", "ignore") == s for s in strings_of(candidate)
    )
    assert (value is None) == hostile
    if value is not None:
        assert_round_trips(model, value)


@pytest.mark.parametrize("model", list(ENTRY_SEEDS) + list(INTERNAL_SEEDS), ids=str)
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_json_from_any_client_is_a_model_or_a_validation_error(model: Any, data: st.DataObject) -> None:
    """JSON text, as history and raw clients give it: the same, for every contract model."""
    seed = {**ENTRY_SEEDS, **INTERNAL_SEEDS}[model]
    candidate = data.draw(st.one_of(mutations(seed), JSON_VALUES), label="input")
    value = validated(model, candidate, from_json=True)
    if value is not None:
        assert_round_trips(model, value)


RAW_PAYLOADS = st.one_of(
    st.binary(max_size=64),
    JSON_VALUES.map(lambda value: json.dumps(value).encode()),
    mutations(SESSION_INPUT).map(lambda value: json.dumps(value).encode()),
    st.just(b'{"content": "lone \\ud800"}'),
    st.just(b'{"content": "x\x00"}'),
)
ENCODINGS = st.sampled_from(
    [
        {"encoding": b"json/plain"},
        {"encoding": b"json/plain"},
        {"encoding": b"binary/null"},
        {"encoding": b"binary/plain"},
        {"encoding": b"json/protobuf", "messageType": b"temporal.api.common.v1.Payload"},
        {"encoding": b"binary/protobuf", "messageType": b"temporal.api.common.v1.Payloads"},
        {"encoding": b"nonsense"},
        {},
    ]
)


@example(hint=SessionInput, metadata={"encoding": b"binary/null"}, data=b"").via("None for a start input")
@example(hint=UserMessageSignal, metadata={"encoding": b"binary/plain"}, data=b"\xff").via("bytes for a signal")
@example(hint=SendEventsInput, metadata={"encoding": b"nonsense"}, data=b"{}").via("an unknown encoding")
@settings(max_examples=300, deadline=None)
@given(
    hint=st.sampled_from([SessionInput, UserMessageSignal, SendEventsInput, EventsQuery, InterruptSignal | None]),
    metadata=ENCODINGS,
    data=RAW_PAYLOADS,
)
def test_a_raw_payload_is_its_model_or_a_typed_invalid_input(
    hint: Any, metadata: dict[str, bytes], data: bytes
) -> None:
    """Whatever payload a raw client sends (any encoding, any bytes), corral's payload converter returns the type
    the handler declares, or raises the non-retryable `InvalidInput` that says what is wrong. Before, a
    `binary/null` or `binary/plain` payload came back as None or bytes (the handler then failed on them, failing its
    workflow task), and an unknown encoding or a broken protobuf raised KeyError or RuntimeError (a start input
    with one retried its first workflow task forever)."""
    try:
        (value,) = CorralPayloadConverter().from_payloads([Payload(metadata=metadata, data=data)], [hint])
    except ApplicationError as exc:
        assert exc.type == INVALID_INPUT and exc.non_retryable and exc.message.strip()
        return
    if isinstance(hint, type) and issubclass(hint, BaseModel):
        assert isinstance(value, hint)
    else:
        assert value is None or isinstance(value, InterruptSignal)
