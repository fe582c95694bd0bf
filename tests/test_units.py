"""Unit tests of pure functions: context building, the log, input validation, error mapping, the utility hand."""

from __future__ import annotations

import itertools
import json
import re
from datetime import UTC, datetime
from typing import Any

import anthropic
import httpx
import httpx2
import pytest
from pydantic import ValidationError

from activities.context import build_messages, build_tools
from activities.errors import (
    ModelErrorInfo,
    ModelStreamBroken,
    classify,
    closed_before_answer,
    model_error,
    parse_retry_after,
    stream_broken,
)
from corral.contract.events import (
    AgentMessage,
    AgentToolResult,
    AgentToolUse,
    SessionStatusRunning,
    TextBlock,
    UserMessage,
)
from corral.contract.session import AgentConfig, EventsQuery, SendEventsInput, SessionInput, parse_user_events
from corral.hands.output import cut_output
from corral.hands.utility import calculate
from workflows import SessionLog


def _log() -> SessionLog:
    counter = itertools.count(1)
    return SessionLog(new_id=lambda: f"sevt_{next(counter)}", now=lambda: datetime(2026, 1, 1, tzinfo=UTC))


def test_context_merges_roles_and_puts_tool_results_first() -> None:
    log = _log()
    first = log.append(UserMessage, content=[TextBlock(text="hi")])
    log.append(SessionStatusRunning)
    said = log.append(AgentMessage, content=[TextBlock(text="calling")])
    use = log.append(AgentToolUse, name="calc", input={"x": 1})
    late = log.append(UserMessage, content=[TextBlock(text="queued while the tool ran")])
    result = log.append(AgentToolResult, tool_use_id=use.id, content=[TextBlock(text="2")])
    for event in (first, said, use, late, result):  # `late` entered the conversation before the result
        log.add_to_conversation(event)
    messages = build_messages(log.conversation_entries(0, 5))
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"] == [
        {"type": "text", "text": "calling"},
        {"type": "tool_use", "id": use.id, "name": "calc", "input": {"x": 1}},
    ]
    assert [b["type"] for b in messages[2]["content"]] == ["tool_result", "text"]
    assert messages[2]["content"][0]["tool_use_id"] == use.id


def test_tools_expand_the_utility_toolset() -> None:
    agent = AgentConfig.model_validate({"model": "m", "tools": [{"type": "corral_utility"}]})
    assert [t["name"] for t in build_tools(agent)] == ["get_time", "calculate"]
    with pytest.raises(ValidationError, match="repeated: calculate"):
        AgentConfig.model_validate(
            {"model": "m", "tools": [{"type": "corral_utility"}, {"type": "custom", "name": "calculate"}]}
        )


def test_session_input_needs_only_a_model_and_rejects_unknown_fields() -> None:
    assert SessionInput.model_validate({"agent": {"model": "m"}}).agent.max_tokens == 4096
    with pytest.raises(ValidationError, match=r"agent\.model"):
        SessionInput.model_validate({"agent": {}})
    with pytest.raises(ValidationError, match="Extra inputs"):
        SessionInput.model_validate({"agent": {"model": "m"}, "mesage": "typo"})
    with pytest.raises(ValidationError, match="authorization_token must never be in workflow input"):
        repository = {"type": "github_repository", "url": "https://git.example/a.git", "authorization_token": "t"}
        SessionInput.model_validate({"agent": {"model": "m"}, "resources": [repository]})
    with pytest.raises(ValidationError, match=r"not in agent\.mcp_servers"):
        AgentConfig.model_validate({"model": "m", "tools": [{"type": "mcp_toolset", "mcp_server_name": "docs"}]})
    with pytest.raises(ValidationError, match="credentials in a vault"):
        AgentConfig.model_validate({"model": "m", "mcp_servers": [{"name": "d", "url": "https://u:p@h/mcp"}]})


def test_event_pages_by_count_type_and_bytes() -> None:
    log = _log()
    for n in range(10):
        log.append(UserMessage, content=[TextBlock(text=f"m{n}")])
        log.append(SessionStatusRunning)
    page = log.page(EventsQuery(after=0, limit=3))
    assert [e.position for e in page.events] == [1, 2, 3] and page.has_more and page.next_after == 3
    page = log.page(EventsQuery(after=3, types=["user.message"], limit=100))
    assert [e.position for e in page.events] == [5, 7, 9, 11, 13, 15, 17, 19] and not page.has_more
    assert [e.position for e in log.page(EventsQuery(after=2, before=5)).events] == [3, 4]


def test_event_pages_stay_under_the_query_size_cap() -> None:
    log = _log()
    for _ in range(8):
        log.append(UserMessage, content=[TextBlock(text="x" * 200_000)])
    page = log.page(EventsQuery(limit=1000))
    assert 0 < len(page.events) < 8 and page.has_more
    assert sum(len(e.model_dump_json()) for e in page.events) <= 1_000_000


def test_model_context_pages_by_bytes() -> None:
    log = _log()
    for _ in range(8):
        log.add_to_conversation(log.append(UserMessage, content=[TextBlock(text="y" * 200_000)]))
    agent = AgentConfig(model="m")
    pages, start, seen = 0, 0, []
    while start < 8:
        page = log.model_context(agent, start, 8)
        assert page.entries, "a page must make progress"
        seen += [e.position for e in page.entries]
        start, pages = page.next_start, pages + 1
    assert seen == list(range(1, 9)) and pages > 1


@pytest.mark.parametrize(
    ("events", "message"),
    [
        ([{"type": "user.message", "content": [{"type": "text"}]}], "events[0].user.message.content"),
        ([{"type": "nope"}], "does not match any of the expected tags"),
        ([{"type": "user.message", "content": "hi"}] * 51, "at most 50 events"),
    ],
)
def test_parse_user_events_explains_what_is_wrong(events: list[dict[str, Any]], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_user_events(SendEventsInput(events=events))


def _status_error(status: int, headers: dict[str, str] | None = None, body: Any = None) -> anthropic.APIStatusError:
    request = httpx.Request("POST", "http://model/v1/messages")
    response = httpx.Response(status, headers=headers or {}, request=request)
    return anthropic.APIStatusError("boom", response=response, body=body)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("status", "error_type", "retryable"),
    [
        (429, "model_rate_limited_error", True),
        (529, "model_overloaded_error", True),
        (500, "model_request_failed_error", True),
        (503, "model_request_failed_error", True),
        (408, "model_request_failed_error", True),
        (400, "model_request_failed_error", False),
        (401, "model_request_failed_error", False),
        (403, "model_request_failed_error", False),
        (404, "model_request_failed_error", False),
        (402, "billing_error", False),
    ],
)
def test_classify_status_codes(status: int, error_type: str, retryable: bool) -> None:
    info = classify(_status_error(status, {"retry-after": "7"}))
    assert info is not None
    assert (info.error_type, info.retryable) == (error_type, retryable)
    if retryable:
        assert info.retry_after == 7


def test_classify_errors_inside_a_stream_by_body_type() -> None:
    info = classify(_status_error(200, body={"type": "error", "error": {"type": "overloaded_error"}}))
    assert info is not None and info.error_type == "model_overloaded_error" and info.retryable


def wrapped(cause: httpx2.HTTPError) -> anthropic.APIConnectionError:
    """The SDK's connection error for `cause`, raised from it, as anthropic 2.17 raises it while reading a stream."""
    try:
        raise anthropic.APIConnectionError(message=f"Connection failed: {cause}", request=cause.request) from cause
    except anthropic.APIConnectionError as error:
        return error


def test_a_broken_stream_is_a_retryable_error_that_says_how_it_broke() -> None:
    request = httpx2.Request("POST", "http://model/v1/messages")
    cases = [
        (httpx2.ReadTimeout("", request=request), "the stream stalled: no data for 90 s"),
        (httpx2.RemoteProtocolError("peer closed connection", request=request), "the stream broke off: peer closed"),
        (json.JSONDecodeError("Expecting value", "{x", 1), "the stream was malformed: Expecting value"),
        # anthropic 2.17 wraps a stream's transport failure as its own connection error, caused by it
        (anthropic.APITimeoutError(request=request), "the stream stalled: no data for 90 s"),
        (wrapped(httpx2.RemoteProtocolError("peer closed connection", request=request)), "the stream broke off: peer"),
    ]
    for raised, says in cases:
        broken = stream_broken(raised, stall_seconds=90)
        assert isinstance(broken, ModelStreamBroken) and says in str(broken)
        info = classify(broken)
        assert info == ModelErrorInfo(error_type="model_request_failed_error", status=None, retryable=True)
        assert model_error(broken, info).message.startswith("model request failed (broken stream): the stream ")
    assert stream_broken(_status_error(529), stall_seconds=90) is None  # an `error` event: the SDK typed it
    assert stream_broken(KeyError("ours"), stall_seconds=90) is None  # not the stream's


def test_only_a_kept_alive_connection_closed_before_any_answer_is_sent_again() -> None:
    request = httpx2.Request("POST", "http://model/v1/messages")
    again = [
        httpx2.ReadError("[Errno 104] Connection reset by peer", request=request),
        httpx2.WriteError("[Errno 32] Broken pipe", request=request),
        httpx2.RemoteProtocolError("Server disconnected without sending a response.", request=request),
    ]
    not_again = [
        httpx2.ConnectError("[Errno 111] Connection refused", request=request),
        httpx2.ReadTimeout("", request=request),
        httpx2.PoolTimeout("", request=request),
    ]
    assert [closed_before_answer(wrapped(cause)) for cause in again] == [True, True, True]
    assert [closed_before_answer(wrapped(cause)) for cause in not_again] == [False, False, False]
    assert not closed_before_answer(anthropic.APITimeoutError(request=request))


def test_retry_after_forms() -> None:
    assert parse_retry_after(httpx.Headers({"retry-after-ms": "1500"})) == 1.5
    assert parse_retry_after(httpx.Headers({"retry-after": "3"})) == 3
    assert parse_retry_after(httpx.Headers({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"})) == 0
    assert parse_retry_after(httpx.Headers({})) is None


def test_calculate_is_safe() -> None:
    assert calculate({"expression": "2*(3+4) - 1"}) == "2*(3+4) - 1 = 13"
    for bad in ("__import__('os')", "a + 1", "2 ** 100000", "", "1/0"):
        with pytest.raises((ValueError, ArithmeticError)):
            calculate({"expression": bad})
    # A result too large is refused before it is computed, at once (the hand's event loop never stalls on it).
    assert calculate({"expression": "2**9999"}).startswith("2**9999 = 9975")
    for huge in ("(9**9999)**9999", "(2**13000)*(2**13000)", "2**9000*2**9000", "-(3**9000)**2"):
        with pytest.raises(ValueError, match="too large"):
            calculate({"expression": huge})


def test_cut_output_keeps_head_and_tail_and_says_how_much_was_cut() -> None:
    assert cut_output("abcde", head=3, tail=2) == "abcde"
    assert cut_output("abc" + "x" * 7 + "yz", head=3, tail=2) == "abc\n[output truncated: 7 of 12 characters cut]\nyz"


def test_an_update_the_server_did_not_take_is_sent_again() -> None:
    """What the server answered (raw bytes, as seen in a run) when an update met a workflow task it refused during
    a continue-as-new: WorkflowNotReady, safe to send again; other refusals are not."""
    from temporalio.service import RPCError, RPCStatusCode

    from corral.client import _not_taken

    raw = (
        b"\x08\t\x12TUnable to perform workflow execution update due to unexpected workflow task failure.\x1aJ\n"
        b"Htype.googleapis.com/temporal.api.errordetails.v1.WorkflowNotReadyFailure"
    )
    assert _not_taken(RPCError("not ready", RPCStatusCode.FAILED_PRECONDITION, raw))
    assert _not_taken(RPCError("busy", RPCStatusCode.RESOURCE_EXHAUSTED, b""))
    assert not _not_taken(RPCError("other", RPCStatusCode.FAILED_PRECONDITION, b""))
    assert not _not_taken(RPCError("bad", RPCStatusCode.INVALID_ARGUMENT, b""))


def test_every_payload_converter_shares_one_cache_of_type_adapters(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK makes a converter per workflow run: a session's input must not build its adapter again each time."""
    import pydantic
    import temporalio.contrib.pydantic

    from corral.converter import CorralPayloadConverter

    built: list[object] = []

    def counting_type_adapter(*args: Any, **kwargs: Any) -> pydantic.TypeAdapter[Any]:
        built.append(args[0])
        return pydantic.TypeAdapter(*args, **kwargs)

    payloads = CorralPayloadConverter().to_payloads([SessionInput(agent=AgentConfig(model="m"), message="hi")])
    CorralPayloadConverter().from_payloads(payloads, [SessionInput])
    monkeypatch.setattr(temporalio.contrib.pydantic, "TypeAdapter", counting_type_adapter)  # what each SDK cache makes
    for _ in range(3):
        [decoded] = CorralPayloadConverter().from_payloads(payloads, [SessionInput])
        assert decoded.message == "hi"
    assert built == [], "a new converter built the adapter again"


def test_a_payload_converter_shares_its_encoding_converters() -> None:
    """The SDK makes two payload converters per workflow activation (and drops them): none builds its own."""
    from temporalio.contrib.pydantic import PydanticPayloadConverter

    from corral.converter import CorralPayloadConverter

    one, two = CorralPayloadConverter(), CorralPayloadConverter()
    assert list(one.converters) == list(PydanticPayloadConverter().converters)  # the SDK's encodings, in its order
    assert all(two.converters[encoding] is converter for encoding, converter in one.converters.items())
