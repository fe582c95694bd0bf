"""Tests for the offline model server, driven through the real anthropic SDK over real HTTP."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anthropic
import httpx
import httpx2
import pytest

from modelserver import ModelServerThread, Script, ScriptStep, create_app
from modelserver.__main__ import build_parser
from modelserver.demo import MARKER, build_tool_input, plan_demo
from modelserver.scripts import (
    ApiError,
    Plan,
    ScriptBook,
    StreamBreak,
    TextBlock,
    ToolUseBlock,
    default_tool_use_id,
    plan_step,
    split_json_pieces,
    split_text_tokens,
    step_index_for,
)

USER_HI: list[Any] = [{"role": "user", "content": "hi"}]

CALC_TOOL = {
    "name": "calculate",
    "description": "Evaluate an arithmetic expression.",
    "input_schema": {
        "type": "object",
        "properties": {"expression": {"type": "string"}, "precision": {"type": "integer"}},
        "required": ["expression", "precision"],
    },
}
TIME_TOOL = {
    "name": "get_time",
    "description": "Current time in a timezone.",
    "input_schema": {"type": "object", "properties": {"timezone": {"type": "string"}}},
}


@pytest.fixture(scope="module")
def server() -> Iterator[ModelServerThread]:
    with ModelServerThread() as running:
        yield running


@pytest.fixture
def base_url(server: ModelServerThread) -> str:
    assert server.base_url is not None
    return server.base_url


@pytest.fixture
def client(base_url: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=base_url, api_key="test-key", max_retries=0)


@pytest.fixture
def script_name(request: pytest.FixtureRequest) -> str:
    return request.node.name.replace("[", "_").replace("]", "")


@pytest.fixture
async def http(base_url: str) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=base_url) as plain:
        yield plain


async def register(http: httpx.AsyncClient, name: str, script: dict[str, Any]) -> None:
    response = await http.put(f"/_corral/scripts/{name}", json=script)
    assert response.status_code == 200, response.text


def conversation(turns: int, last: str = "go") -> list[Any]:
    """A conversation with `turns` assistant messages, ending in a user message."""
    messages: list[Any] = []
    for i in range(turns):
        messages += [{"role": "user", "content": f"u{i}"}, {"role": "assistant", "content": f"a{i}"}]
    return [*messages, {"role": "user", "content": last}]


# --- streaming -----------------------------------------------------------------------------------


async def test_streaming_text(client: anthropic.AsyncAnthropic, http: httpx.AsyncClient, script_name: str) -> None:
    text = "Hello from the scripted stand-in, one word at a time."
    await register(http, script_name, {"steps": [{"text": text}]})
    chunks = []
    async with client.messages.stream(model=f"script:{script_name}", max_tokens=100, messages=USER_HI) as stream:
        async for chunk in stream.text_stream:
            chunks.append(chunk)
        final = await stream.get_final_message()
    assert len(chunks) > 3
    assert "".join(chunks) == text
    assert [b.type for b in final.content] == ["text"]
    assert final.content[0].text == text  # type: ignore[union-attr]
    assert final.stop_reason == "end_turn"
    assert final.model == f"script:{script_name}"
    assert final.id.startswith("msg_")
    assert final.usage.input_tokens >= 1
    assert final.usage.output_tokens == len(text) // 4


async def test_streaming_tool_use(client: anthropic.AsyncAnthropic, http: httpx.AsyncClient, script_name: str) -> None:
    tool_input = {"expression": "1+2", "options": {"exact": True, "digits": [1, 2, 3]}, "note": 'a "q" é'}
    await register(
        http,
        script_name,
        {
            "steps": [
                {
                    "text": "Let me calculate.",
                    "tool_uses": [
                        {"name": "calc", "input": tool_input},
                        {"name": "noop", "id": "toolu_fixed"},
                    ],
                }
            ]
        },
    )
    async with client.messages.stream(model=f"script:{script_name}", max_tokens=100, messages=USER_HI) as stream:
        final = await stream.get_final_message()
    assert [b.type for b in final.content] == ["text", "tool_use", "tool_use"]
    calc, noop = final.content[1], final.content[2]
    assert isinstance(calc, anthropic.types.ToolUseBlock)
    assert isinstance(noop, anthropic.types.ToolUseBlock)
    assert calc.name == "calc"
    assert calc.input == tool_input
    assert calc.id == default_tool_use_id(script_name, 0, 0)
    assert noop.id == "toolu_fixed"
    assert noop.input == {}
    assert final.stop_reason == "tool_use"


async def test_raw_event_sequence(client: anthropic.AsyncAnthropic, http: httpx.AsyncClient, script_name: str) -> None:
    await register(http, script_name, {"steps": [{"text": "two words", "tool_uses": [{"name": "t"}]}]})
    events = await client.messages.create(model=f"script:{script_name}", max_tokens=10, messages=USER_HI, stream=True)
    types = [event.type async for event in events]
    assert types == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    # The SDK hides ping; check the wire format directly, including headers.
    async with http.stream(
        "POST",
        "/v1/messages",
        headers={"x-api-key": "k", "anthropic-version": "2023-06-01"},
        json={"model": f"script:{script_name}", "max_tokens": 5, "messages": USER_HI, "stream": True},
    ) as response:
        raw = (await response.aread()).decode()
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["request-id"].startswith("req_")
    frames = [f for f in raw.split("\n\n") if f]
    names = [f.splitlines()[0].removeprefix("event: ") for f in frames]
    assert names[:2] == ["message_start", "ping"]
    start = json.loads(frames[0].splitlines()[1].removeprefix("data: "))
    message = start["message"]
    assert message["content"] == [] and message["stop_reason"] is None and message["role"] == "assistant"
    assert set(message["usage"]) == {
        "input_tokens", "output_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"
    }  # fmt: skip
    delta = json.loads(frames[-2].splitlines()[1].removeprefix("data: "))
    assert delta["delta"] == {"stop_reason": "tool_use", "stop_sequence": None}


async def test_non_streaming_create(
    client: anthropic.AsyncAnthropic, http: httpx.AsyncClient, script_name: str
) -> None:
    await register(http, script_name, {"steps": [{"text": "plain", "tool_uses": [{"name": "x", "input": {"a": 1}}]}]})
    message = await client.messages.create(model=f"script:{script_name}", max_tokens=10, messages=USER_HI)
    assert message.content[0].type == "text" and message.content[0].text == "plain"
    assert message.content[1].type == "tool_use" and message.content[1].input == {"a": 1}
    assert message.stop_reason == "tool_use"
    assert message.usage.output_tokens >= 1


# --- auth and validation -------------------------------------------------------------------------


async def test_auth_styles_are_logged(
    client: anthropic.AsyncAnthropic, http: httpx.AsyncClient, script_name: str
) -> None:
    await register(http, script_name, {"steps": [{"text": "ok"}], "loop": True})
    await client.messages.create(model=f"script:{script_name}", max_tokens=10, messages=USER_HI)
    response = await http.post(
        "/v1/messages",
        headers={"x-api-key": "k", "anthropic-version": "2023-06-01"},
        json={"model": f"script:{script_name}", "max_tokens": 10, "messages": USER_HI},
    )
    assert response.status_code == 200
    assert response.json()["content"] == [{"type": "text", "text": "ok"}]
    assert response.headers["request-id"].startswith("req_")
    log = (await http.get(f"/_corral/scripts/{script_name}/requests")).json()
    assert [entry["auth"] for entry in log] == ["bearer", "x-api-key"]
    assert log[0]["body"]["messages"] == USER_HI
    assert log[0]["step"] == 0


@pytest.mark.parametrize("headers", [{}, {"x-api-key": ""}, {"authorization": "Basic abc"}])
def test_missing_key_is_401(base_url: str, headers: dict[str, str]) -> None:
    response = httpx.post(
        f"{base_url}/v1/messages", headers=headers, json={"model": "m", "max_tokens": 1, "messages": USER_HI}
    )
    assert response.status_code == 401
    body = response.json()
    assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
    assert "API key" in body["error"]["message"]
    assert response.headers["request-id"]


@pytest.mark.parametrize(
    ("body", "complaint"),
    [
        ({"max_tokens": 1, "messages": USER_HI}, "model"),
        ({"model": "m", "messages": USER_HI}, "max_tokens"),
        ({"model": "m", "max_tokens": 1, "messages": []}, "messages"),
        ({"model": "m", "max_tokens": 1, "messages": [{"role": "system", "content": "x"}]}, "role"),
    ],
)
def test_invalid_body_is_400(base_url: str, body: dict[str, Any], complaint: str) -> None:
    response = httpx.post(f"{base_url}/v1/messages", headers={"x-api-key": "k"}, json=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and complaint in error["message"]


# --- scripted failures ---------------------------------------------------------------------------


async def test_fail_then_succeed(client: anthropic.AsyncAnthropic, http: httpx.AsyncClient, script_name: str) -> None:
    await register(
        http,
        script_name,
        {
            "steps": [
                {
                    "text": "recovered",
                    "fail": [{"status": 529, "type": "overloaded_error", "retry_after": 1.5}],
                }
            ]
        },
    )
    with pytest.raises(anthropic.APIStatusError) as caught:
        await client.messages.create(model=f"script:{script_name}", max_tokens=10, messages=USER_HI)
    assert caught.value.status_code == 529
    assert caught.value.response.headers["retry-after"] == "1.5"
    assert isinstance(caught.value.body, dict)
    assert caught.value.body["error"]["type"] == "overloaded_error"
    message = await client.messages.create(model=f"script:{script_name}", max_tokens=10, messages=USER_HI)
    assert message.content[0].text == "recovered"  # type: ignore[union-attr]


async def test_fail_mid_stream(client: anthropic.AsyncAnthropic, http: httpx.AsyncClient, script_name: str) -> None:
    text = "one two three four five six"
    await register(http, script_name, {"steps": [{"text": text, "fail_mid_stream": True}]})
    received = []
    with pytest.raises(anthropic.APIStatusError) as caught:
        async with client.messages.stream(model=f"script:{script_name}", max_tokens=10, messages=USER_HI) as stream:
            async for chunk in stream.text_stream:
                received.append(chunk)
    assert "overloaded_error" in str(caught.value)
    assert received and "".join(received) != text and text.startswith("".join(received))
    async with client.messages.stream(model=f"script:{script_name}", max_tokens=10, messages=USER_HI) as stream:
        assert await stream.get_final_text() == text


async def _read_broken(client: anthropic.AsyncAnthropic, model: str, **options: Any) -> tuple[str, Any]:
    """(the text received, then the final message or the exception the SDK raised)."""
    received: list[str] = []
    try:
        async with client.messages.stream(model=model, max_tokens=10, messages=USER_HI, **options) as stream:
            async for event in stream:
                if event.type == "content_block_delta" and event.delta.type == "text_delta":
                    received.append(event.delta.text)
            return "".join(received), await stream.get_final_message()
    except Exception as exc:
        return "".join(received), exc


def transport_error(error: object) -> object:
    """The transport's own error behind what the SDK raised: anthropic 2.16 let it through as it was, 2.17 wraps a
    stream's transport failure in its `APIConnectionError` (`APITimeoutError` for a timeout), caused by it."""
    if isinstance(error, anthropic.APIConnectionError) and error.__cause__ is not None:
        return error.__cause__
    return error


@pytest.mark.parametrize(
    ("kind", "raised"),
    [
        ("cut", httpx2.RemoteProtocolError),  # the transport's error (anthropic 2.17 wraps it as its own, below)
        ("malformed", json.JSONDecodeError),
        ("stall", httpx2.ReadTimeout),  # only a read timeout ends the wait
    ],
)
async def test_a_broken_stream_is_what_the_sdk_sees(
    client: anthropic.AsyncAnthropic, http: httpx.AsyncClient, script_name: str, kind: str, raised: type
) -> None:
    text = "one two three four five six"
    await register(http, script_name, {"steps": [{"text": text, "break_stream": [{"kind": kind, "after_deltas": 2}]}]})
    model = f"script:{script_name}"
    timeout = httpx2.Timeout(30, read=0.5) if kind == "stall" else httpx2.Timeout(30)
    received, outcome = await _read_broken(client, model, timeout=timeout)
    assert isinstance(transport_error(outcome), raised), repr(outcome)
    assert received == "one two "  # the two deltas before the break, and nothing after it
    received, outcome = await _read_broken(client, model)  # one break per use: the next use is whole
    assert received == text and outcome.stop_reason == "end_turn"


async def test_a_stream_that_ends_early_has_no_stop_reason(
    client: anthropic.AsyncAnthropic, http: httpx.AsyncClient, script_name: str
) -> None:
    """A body that ends cleanly but before `message_stop`: the SDK raises nothing and hands over the partial message
    (stop_reason None), so a client must check for it."""
    steps = [{"text": "one two three", "break_stream": [{"kind": "end"}, {"kind": "end", "after_deltas": 9}]}]
    await register(http, script_name, {"steps": steps})
    received, message = await _read_broken(client, f"script:{script_name}")
    assert received == "one " and message.stop_reason is None
    received, message = await _read_broken(client, f"script:{script_name}")  # due after the last delta
    assert received == "one two three" and message.stop_reason is None


async def test_a_break_fails_a_non_streaming_request_once(
    client: anthropic.AsyncAnthropic, http: httpx.AsyncClient, script_name: str
) -> None:
    await register(http, script_name, {"steps": [{"text": "whole", "break_stream": [{"kind": "cut"}]}]})
    with pytest.raises(anthropic.APIStatusError) as caught:
        await client.messages.create(model=f"script:{script_name}", max_tokens=10, messages=USER_HI)
    assert caught.value.status_code == 529
    message = await client.messages.create(model=f"script:{script_name}", max_tokens=10, messages=USER_HI)
    assert message.content[0].text == "whole"  # type: ignore[union-attr]


async def test_a_stalled_stream_is_stopped_when_the_client_goes_away(
    client: anthropic.AsyncAnthropic, http: httpx.AsyncClient, script_name: str
) -> None:
    await register(http, script_name, {"steps": [{"text": "a b", "break_stream": [{"kind": "stall"}]}]})
    before = (await http.get("/_corral/stats")).json()
    received, outcome = await _read_broken(client, f"script:{script_name}", timeout=httpx2.Timeout(30, read=0.2))
    assert isinstance(transport_error(outcome), httpx2.ReadTimeout) and received == "a "
    for _ in range(200):
        stats = (await http.get("/_corral/stats")).json()
        if stats["cancelled_streams"] > before["cancelled_streams"]:
            break
        await asyncio.sleep(0.05)
    assert stats["cancelled_streams"] > before["cancelled_streams"], stats


# --- step selection ------------------------------------------------------------------------------


async def test_step_selected_by_assistant_count(
    client: anthropic.AsyncAnthropic, http: httpx.AsyncClient, script_name: str
) -> None:
    await register(http, script_name, {"steps": [{"text": "zero"}, {"text": "one"}, {"text": "two"}]})
    model = f"script:{script_name}"
    for turns, expected in [(0, "zero"), (2, "two"), (1, "one"), (1, "one")]:
        message = await client.messages.create(model=model, max_tokens=10, messages=conversation(turns))
        assert message.content[0].text == expected  # type: ignore[union-attr]


async def test_loop_wraps(client: anthropic.AsyncAnthropic, http: httpx.AsyncClient, script_name: str) -> None:
    await register(http, script_name, {"steps": [{"text": "even"}, {"text": "odd"}], "loop": True})
    texts = []
    for turns in range(5):
        message = await client.messages.create(
            model=f"script:{script_name}", max_tokens=10, messages=conversation(turns)
        )
        texts.append(message.content[0].text)  # type: ignore[union-attr]
    assert texts == ["even", "odd", "even", "odd", "even"]


async def test_past_the_end(client: anthropic.AsyncAnthropic, http: httpx.AsyncClient, script_name: str) -> None:
    await register(http, script_name, {"steps": [{"text": "only"}]})
    with pytest.raises(anthropic.BadRequestError) as caught:
        await client.messages.create(model=f"script:{script_name}", max_tokens=10, messages=conversation(1))
    assert f"script {script_name} has 1 steps; this request is step 1" in str(caught.value)


async def test_unknown_script_is_404(client: anthropic.AsyncAnthropic) -> None:
    with pytest.raises(anthropic.NotFoundError) as caught:
        await client.messages.create(model="script:does-not-exist", max_tokens=10, messages=USER_HI)
    assert "does-not-exist" in str(caught.value)


@pytest.mark.parametrize(
    ("script", "complaint"),
    [
        ({"steps": []}, "steps"),
        ({"steps": [{"txt": "typo"}]}, "txt"),
        ({"steps": [{"fail": [{"status": 200}]}]}, "status"),
        ({"steps": [{"stop_reason": "bored"}]}, "stop_reason"),
        ({"steps": [{"break_stream": [{"kind": "explode"}]}]}, "break_stream.0.kind"),
        ({"steps": [{"fail_mid_stream": True, "break_stream": [{"kind": "cut"}]}]}, "use break_stream only"),
    ],
)
def test_bad_script_is_400(base_url: str, script: dict[str, Any], complaint: str) -> None:
    response = httpx.put(f"{base_url}/_corral/scripts/bad", json=script)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert "script bad is invalid" in error["message"] and complaint in error["message"]


async def test_requests_log_and_delete(
    client: anthropic.AsyncAnthropic, http: httpx.AsyncClient, script_name: str
) -> None:
    await register(http, script_name, {"steps": [{"text": "a"}, {"text": "b"}]})
    await client.messages.create(model=f"script:{script_name}", max_tokens=10, messages=USER_HI, system="be terse")
    await client.messages.create(model=f"script:{script_name}", max_tokens=10, messages=conversation(1, "next"))
    log = (await http.get(f"/_corral/scripts/{script_name}/requests")).json()
    assert [entry["step"] for entry in log] == [0, 1]
    assert log[0]["body"]["system"] == "be terse"
    assert log[1]["body"]["messages"][-1] == {"role": "user", "content": "next"}
    assert (await http.delete(f"/_corral/scripts/{script_name}")).status_code == 200
    assert (await http.get(f"/_corral/scripts/{script_name}/requests")).status_code == 404
    assert (await http.delete(f"/_corral/scripts/{script_name}")).status_code == 404


async def test_echo_last_user(client: anthropic.AsyncAnthropic, http: httpx.AsyncClient, script_name: str) -> None:
    await register(http, script_name, {"steps": [{"text": "saw:", "echo_last_user": True}], "loop": True})
    messages: list[Any] = [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_1", "name": "t", "input": {}}]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "42"},
                {"type": "text", "text": "and more"},
            ],
        },
    ]
    message = await client.messages.create(model=f"script:{script_name}", max_tokens=10, messages=messages)
    assert message.content[0].text == "saw:\n42\nand more"  # type: ignore[union-attr]


# --- demo behaviour ------------------------------------------------------------------------------


async def test_demo_plain_reply(client: anthropic.AsyncAnthropic) -> None:
    message = await client.messages.create(
        model="claude-anything",
        max_tokens=100,
        messages=[{"role": "user", "content": "What is the weather?"}],
        tools=[CALC_TOOL, TIME_TOOL],  # type: ignore[list-item]
    )
    text = message.content[0].text  # type: ignore[union-attr]
    assert text.startswith(MARKER)
    assert "stand-in" in text and "What is the weather?" in text
    assert "Ask me to use one of: calculate, get_time." in text
    assert message.stop_reason == "end_turn"


async def test_demo_tool_loop(client: anthropic.AsyncAnthropic) -> None:
    tools: list[Any] = [CALC_TOOL, TIME_TOOL]
    messages: list[Any] = [{"role": "user", "content": "Please CALCULATE 2*(3+4)."}]
    async with client.messages.stream(
        model="corral-offline-stand-in", max_tokens=100, messages=messages, tools=tools
    ) as stream:
        first = await stream.get_final_message()
    assert first.stop_reason == "tool_use"
    assert first.content[0].text == f"{MARKER}Calling calculate."  # type: ignore[union-attr]
    call = first.content[1]
    assert isinstance(call, anthropic.types.ToolUseBlock)
    assert call.name == "calculate" and call.input == {"expression": "2*(3+4)", "precision": 0}

    messages += [
        first.to_param(),
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "14"}]},
    ]
    second = await client.messages.create(model="m", max_tokens=100, messages=messages, tools=tools)
    assert second.stop_reason == "end_turn"
    assert second.content[0].text == f"{MARKER}Tool result for calculate: 14"  # type: ignore[union-attr]


def test_demo_pure_functions() -> None:
    plan = plan_demo({"messages": [{"role": "user", "content": "please use get_time"}], "tools": [TIME_TOOL]})
    assert plan.stop_reason == "tool_use"
    assert isinstance(plan.blocks[1], ToolUseBlock) and plan.blocks[1].input == {"timezone": ""}
    assert plan == plan_demo({"messages": [{"role": "user", "content": "please use get_time"}], "tools": [TIME_TOOL]})
    schema = {
        "type": "object",
        "properties": {"flag": {"type": "boolean"}, "items": {"type": "array"}, "q": {"type": "string"}},
        "required": ["flag", "items"],
    }
    assert build_tool_input(schema, "x") == {"flag": False, "items": [], "q": "x"}
    assert build_tool_input(None, "x") == {}


# --- pacing and disconnects ----------------------------------------------------------------------


async def test_first_token_latency(client: anthropic.AsyncAnthropic, http: httpx.AsyncClient, script_name: str) -> None:
    await register(http, script_name, {"steps": [{"text": "slow start", "first_token_latency": 0.3}]})
    started = time.monotonic()
    async with client.messages.stream(model=f"script:{script_name}", max_tokens=10, messages=USER_HI) as stream:
        async for _ in stream.text_stream:
            first_token = time.monotonic() - started
            break
        await stream.until_done()
    assert first_token >= 0.3


async def test_tokens_per_second(client: anthropic.AsyncAnthropic, http: httpx.AsyncClient, script_name: str) -> None:
    await register(http, script_name, {"steps": [{"text": "a b c d e", "tokens_per_second": 20}]})
    started = time.monotonic()
    message = await client.messages.create(model=f"script:{script_name}", max_tokens=10, messages=USER_HI)
    assert time.monotonic() - started >= 4 / 20
    assert message.content[0].text == "a b c d e"  # type: ignore[union-attr]


async def test_client_disconnect_stops_generation(http: httpx.AsyncClient, script_name: str) -> None:
    await register(http, script_name, {"steps": [{"text": "never sent", "first_token_latency": 30}]})
    before = (await http.get("/_corral/stats")).json()
    async with http.stream(
        "POST",
        "/v1/messages",
        headers={"x-api-key": "k"},
        json={"model": f"script:{script_name}", "max_tokens": 5, "messages": USER_HI, "stream": True},
    ) as response:
        async for line in response.aiter_lines():
            if line.startswith("event: message_start"):
                break
    deadline = time.monotonic() + 5
    while True:
        stats = (await http.get("/_corral/stats")).json()
        if stats["cancelled_streams"] > before["cancelled_streams"] and stats["active_streams"] == 0:
            break
        assert time.monotonic() < deadline, stats
        await asyncio.sleep(0.05)
    assert (await http.get("/healthz")).json() == {"ok": True, "stand_in": True}


# --- misc endpoints and helpers ------------------------------------------------------------------


async def test_models_and_health(client: anthropic.AsyncAnthropic, http: httpx.AsyncClient) -> None:
    page = await client.models.list()
    assert "corral-offline-stand-in" in [m.id for m in page.data]
    health = await http.get("/healthz")
    assert health.json() == {"ok": True, "stand_in": True}
    assert health.headers["request-id"].startswith("req_")
    counted = await client.messages.count_tokens(model="m", messages=USER_HI)
    assert counted.input_tokens >= 1


def test_thread_helper_with_custom_app() -> None:
    book = ScriptBook()
    with ModelServerThread(create_app(book=book)) as running:
        running.register("direct", {"steps": [{"text": "in-process"}]})
        assert book.get("direct") is not None
        assert running.base_url is not None and running.base_url.startswith("http://127.0.0.1:")
        response = httpx.post(
            f"{running.base_url}/v1/messages",
            headers={"authorization": "Bearer k"},
            json={"model": "script:direct", "max_tokens": 5, "messages": USER_HI},
        )
        assert response.json()["content"][0]["text"] == "in-process"
    assert running.base_url is None


def test_cli_defaults() -> None:
    args = build_parser().parse_args([])
    assert (args.host, args.port, args.first_token_latency, args.tokens_per_second) == (
        "127.0.0.1",
        8765,
        0,
        0,
    )
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--tokens-per-second", "-1"])


# --- pure unit tests of scripts.py ---------------------------------------------------------------


def test_plan_step_failures_then_success() -> None:
    step = ScriptStep.model_validate({"text": "hi", "fail": [{"status": 500, "type": "api_error"}, {}]})
    body = {"messages": USER_HI}
    first = plan_step(body, "s", 0, step, 0)
    second = plan_step(body, "s", 0, step, 1)
    third = plan_step(body, "s", 0, step, 2)
    assert isinstance(first, ApiError) and (first.status, first.type) == (500, "api_error")
    assert isinstance(second, ApiError) and (second.status, second.type) == (529, "overloaded_error")
    assert second.body()["error"]["message"]
    assert isinstance(third, Plan) and third.blocks == [TextBlock("hi")] and third.stop_reason == "end_turn"


def test_stream_breaks_apply_to_the_uses_after_the_failures_in_order() -> None:
    breaks = [{"kind": "stall"}, {"kind": "cut", "after_deltas": 3}]
    step = ScriptStep.model_validate({"text": "hi", "fail": [{}], "break_stream": breaks})
    plans = [plan_step({"messages": USER_HI}, "s", 0, step, hit) for hit in range(4)]
    assert isinstance(plans[0], ApiError)
    assert [p.stream_break for p in plans[1:] if isinstance(p, Plan)] == [
        StreamBreak(kind="stall", after_deltas=1),
        StreamBreak(kind="cut", after_deltas=3),
        None,
    ]


def test_script_book_counts_hits_per_step() -> None:
    book = ScriptBook()
    book.register("s", Script.model_validate({"steps": [{"text": "x", "fail": [{}]}]}))
    assert isinstance(book.play("s", {"messages": USER_HI}, "bearer"), ApiError)
    assert isinstance(book.play("s", {"messages": USER_HI}, "bearer"), Plan)
    missing = book.play("nope", {"messages": USER_HI}, "bearer")
    assert isinstance(missing, ApiError) and missing.status == 404
    book.register("s", Script.model_validate({"steps": [{"text": "x", "fail": [{}]}]}))
    assert isinstance(book.play("s", {"messages": USER_HI}, "bearer"), ApiError)  # counters reset


def test_step_index_and_splitting() -> None:
    script = Script.model_validate({"steps": [{"text": "a"}, {"text": "b"}]})
    assert step_index_for({"messages": conversation(1)}, "s", script) == 1
    past = step_index_for({"messages": conversation(2)}, "s", script)
    assert isinstance(past, ApiError) and past.message == "script s has 2 steps; this request is step 2"
    text = "  leading space, then words\nand lines  "
    assert "".join(split_text_tokens(text)) == text
    assert split_text_tokens("a b") == ["a ", "b"]
    value = {"k": [1, 2, 3], "s": "x" * 40}
    assert json.loads("".join(split_json_pieces(value))) == value


@pytest.mark.parametrize(
    ("text", "tool", "argument"),
    [
        ("Hello! Please calculate 6*7 and then tell me the time with get_time.", "calculate", "6*7"),
        ("calculate 2*(3+4).", "calculate", "2*(3+4)"),
        ("what is 2**10? use calculate", "calculate", "what is 2**10"),
        ("now please use get_time", "get_time", ""),
    ],
)
def test_demo_takes_the_clause_next_to_the_tool_name(text: str, tool: str, argument: str) -> None:
    from modelserver.demo import _mentioned_tool

    found = _mentioned_tool(text, [{"name": "calculate"}, {"name": "get_time"}])
    assert found is not None and (found[0]["name"], found[1]) == (tool, argument)


def test_demo_takes_named_arguments_when_every_word_is_one() -> None:
    from modelserver.demo import named_arguments

    schema = {"properties": {"file_path": {"type": "string"}, "old_string": {"type": "string"},
                             "new_string": {"type": "string"}, "replace_all": {"type": "boolean"}}}  # fmt: skip
    text = 'now use edit file_path=a.md old_string="# demo" new_string="# corral" replace_all=true'
    assert named_arguments(text, "edit", schema) == {
        "file_path": "a.md", "old_string": "# demo", "new_string": "# corral", "replace_all": True,
    }  # fmt: skip
    assert named_arguments("edit the file please", "edit", schema) is None
    assert named_arguments("edit colour=red", "edit", schema) is None


async def test_a_prompt_over_the_window_is_the_real_400(
    client: anthropic.AsyncAnthropic, http: httpx.AsyncClient, script_name: str
) -> None:
    """Like the real API: 400 invalid_request_error "prompt is too long: N tokens > M maximum", for a script's
    `max_input_tokens` and for the stand-in's 200,000."""
    await register(http, script_name, {"steps": [{"text": "fits"}], "max_input_tokens": 100})
    fits = await client.messages.create(model=f"script:{script_name}", max_tokens=10, messages=conversation(0, "hi"))
    assert fits.content[0].type == "text"
    for model, text in ((f"script:{script_name}", "x" * 1_000), ("corral-offline-stand-in", "x" * 900_000)):
        with pytest.raises(anthropic.BadRequestError) as refused:
            await client.messages.create(model=model, max_tokens=10, messages=conversation(0, text))
        body = refused.value.body
        assert isinstance(body, dict) and body["error"]["type"] == "invalid_request_error"
        assert "prompt is too long:" in body["error"]["message"] and "maximum" in body["error"]["message"]


# --- multi-agent scripts: a coordinator that waits for its threads, subagents that reply ---------------------------

REPLY = r"Message from thread sthr_\w+ \((\w+)\):\n"
COORDINATOR = {
    "steps": [
        {"tool_uses": [
            {"name": "spawn_thread", "input": {"agent": "counter", "message": "count"}},
            {"name": "spawn_thread", "input": {"agent": "clock", "message": "time"}},
        ]},
        {"tool_uses": [{"name": "wait_for_threads"}], "repeat_until": {"pattern": REPLY, "count": 2}},
        {"text": "Both threads replied:", "echo_matches": REPLY + r"([^\n]*)"},
    ]
}  # fmt: skip


def coordinator_conversation(replies_per_wait: list[list[tuple[str, str]]]) -> list[dict[str, Any]]:
    """A coordinator's conversation as corral's context renders it: spawns, then one wait per entry, each wait's
    result followed by the replies (name, text) that came with it."""

    def used(name: str, n: int) -> dict[str, Any]:
        return {"role": "assistant", "content": [
            {"type": "tool_use", "id": f"toolu_{name}{i}", "name": name, "input": {}} for i in range(n)
        ]}  # fmt: skip

    def result(name: str, n: int, replies: list[tuple[str, str]] = []) -> dict[str, Any]:  # noqa: B006 - read only
        content: list[dict[str, Any]] = [
            {"type": "tool_result", "tool_use_id": f"toolu_{name}{i}", "content": "ok"} for i in range(n)
        ]
        for agent, text in replies:
            content += [{"type": "text", "text": f"Message from thread sthr_{agent} ({agent}):"},
                        {"type": "text", "text": text}]  # fmt: skip
        return {"role": "user", "content": content}

    messages = [{"role": "user", "content": "ask the counter and the clock"}, used("spawn", 2), result("spawn", 2)]
    for replies in replies_per_wait:
        messages += [used("wait", 1), result("wait", 1, replies)]
    return messages


@pytest.mark.parametrize(
    ("replies_per_wait", "step"),
    [
        ([], 1),  # spawned: wait
        ([[]], 1),  # a wait that timed out with no reply: wait again
        ([[("counter", "3 words")]], 1),  # one reply: wait for the other
        ([[("counter", "3 words")], [("clock", "noon")]], 2),  # both, one a wait: sum up
        ([[("counter", "3 words"), ("clock", "noon")]], 2),  # both after one wait: sum up
    ],
)
def test_a_repeated_step_is_played_until_the_conversation_matches(
    replies_per_wait: list[list[tuple[str, str]]], step: int
) -> None:
    """The wait step answers as many requests as it takes the replies to arrive; then the next step does."""
    script = Script.model_validate(COORDINATOR)
    assert step_index_for({"messages": coordinator_conversation(replies_per_wait)}, "coord", script) == step


def test_without_repeats_the_step_is_the_count_of_assistant_messages() -> None:
    script = Script.model_validate({"steps": [{"text": str(i)} for i in range(4)]})
    for turns in range(4):
        assert step_index_for({"messages": conversation(turns)}, "s", script) == turns
    looping = Script.model_validate({"steps": [{"text": "a"}, {"text": "w", "repeat_until": {"pattern": r"u\d"}}],
                                     "loop": True})  # fmt: skip
    assert [step_index_for({"messages": conversation(turns, "x")}, "s", looping) for turns in range(4)] == [0, 1, 0, 1]


async def test_a_coordinator_script_spawns_waits_and_sums_up_the_replies(
    client: anthropic.AsyncAnthropic, http: httpx.AsyncClient, script_name: str
) -> None:
    """Over the SDK: the spawns, a wait for each reply, and an answer that quotes every reply."""
    await register(http, script_name, COORDINATOR)
    model = f"script:{script_name}"

    first = await client.messages.create(model=model, max_tokens=100, messages=[{"role": "user", "content": "go"}])
    assert [(b.name, b.input) for b in first.content if b.type == "tool_use"] == [
        ("spawn_thread", {"agent": "counter", "message": "count"}),
        ("spawn_thread", {"agent": "clock", "message": "time"}),
    ]
    full = coordinator_conversation([[("counter", "3 words")], [("clock", "noon")]])
    waiting = await client.messages.create(model=model, max_tokens=100, messages=full[:5])  # type: ignore[arg-type]
    assert [b.name for b in waiting.content if b.type == "tool_use"] == ["wait_for_threads"]
    done = await client.messages.create(model=model, max_tokens=100, messages=full)  # type: ignore[arg-type]
    assert done.stop_reason == "end_turn"
    assert done.content[0].text == "Both threads replied:\ncounter: 3 words\nclock: noon"  # type: ignore[union-attr]
    log = (await http.get(f"/_corral/scripts/{script_name}/requests")).json()
    assert [entry["step"] for entry in log] == [0, 1, 2]


def test_echo_matches_quotes_every_match_or_its_groups() -> None:
    messages = coordinator_conversation([[("counter", "3 words"), ("clock", "noon")]])
    whole = plan_step({"messages": messages}, "s", 0, ScriptStep(echo_matches=r"sthr_\w+"), 0)
    assert isinstance(whole, Plan) and whole.blocks == [TextBlock("sthr_counter\nsthr_clock")]
    grouped = plan_step({"messages": messages}, "s", 0, ScriptStep(text="Replies:", echo_matches=REPLY + "(.*)"), 0)
    assert isinstance(grouped, Plan) and grouped.blocks == [TextBlock("Replies:\ncounter: 3 words\nclock: noon")]
    none = plan_step({"messages": USER_HI}, "s", 0, ScriptStep(text="Replies:", echo_matches="sthr_"), 0)
    assert isinstance(none, Plan) and none.blocks == [TextBlock("Replies:")]


def test_a_bad_repeat_pattern_is_400(base_url: str) -> None:
    response = httpx.put(f"{base_url}/_corral/scripts/bad", json={"steps": [{"repeat_until": {"pattern": "("}}]})
    assert response.status_code == 400
    assert "repeat_until.pattern" in response.json()["error"]["message"]
    assert "not a regular expression" in response.json()["error"]["message"]


def test_the_demos_multi_agent_scripts_spawn_wait_reply_and_sum_up() -> None:
    """`corral demo`'s coordinator spawns `shell` and `clock`, waits until both replied, and quotes both replies;
    each subagent runs its tool and replies with what it returned."""
    from modelserver.demo import THREAD_DEMO_SCRIPTS

    book = ScriptBook()
    for name, script in THREAD_DEMO_SCRIPTS.items():
        book.register(name, script)

    def played(name: str, messages: list[dict[str, Any]]) -> Plan:
        plan = book.play(name, {"messages": messages}, "x-api-key")
        assert isinstance(plan, Plan), plan
        return plan

    spawned = played("demo-coordinator", [{"role": "user", "content": "ask both"}]).blocks
    assert [(b.name, b.input["agent"]) for b in spawned if isinstance(b, ToolUseBlock)] == [
        ("spawn_thread", "shell"), ("spawn_thread", "clock"),
    ]  # fmt: skip
    halfway = coordinator_conversation([[("clock", "2026-12-03T16:00:00+00:00")]])
    assert [b.name for b in played("demo-coordinator", halfway).blocks if isinstance(b, ToolUseBlock)] == [
        "wait_for_threads"
    ]
    both = coordinator_conversation([[("clock", "2026-12-03T16:00:00+00:00")], [("shell", "Linux 6.1.0")]])
    (answer,) = played("demo-coordinator", both).blocks
    assert isinstance(answer, TextBlock) and answer.text.endswith(
        "Both threads replied:\nclock: 2026-12-03T16:00:00+00:00\nshell: Linux 6.1.0"
    )

    asked = [{"role": "user", "content": "Message from thread sthr_p (the coordinator):\nWhich kernel runs here?"}]
    (bash,) = played("demo-shell", asked).blocks
    assert isinstance(bash, ToolUseBlock) and (bash.name, bash.input) == ("bash", {"command": "uname -sr"})
    use = {"type": "tool_use", "id": bash.id, "name": "bash", "input": {}}
    result = {"type": "tool_result", "tool_use_id": bash.id, "content": "Linux 6.1.0"}
    ran: list[dict[str, Any]] = [*asked, {"role": "assistant", "content": [use]}, {"role": "user", "content": [result]}]
    assert played("demo-shell", ran).blocks == [TextBlock("Linux 6.1.0")]
    (get_time,) = played("demo-clock", asked).blocks
    assert isinstance(get_time, ToolUseBlock) and get_time.name == "get_time"
