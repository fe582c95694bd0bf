"""A red-team pass over the HTTP API, against a real gateway process (logged in to the OpenBao dev server) on the
real Temporal dev server: oversized and deeply nested bodies, unicode in every string field, path traversal in
every path-like field, CR/LF aimed at response headers, and a flood of event streams from one key. Every answer is
a clear 4xx in the API's error shape or a faithful round trip; none is a 500, and the gateway logs no traceback.

Another workspace's id in every id position is `tests/test_gateway_isolation.py`; prompt injection through a
session's tools is `tests/test_red_team.py`.
"""

from __future__ import annotations

import asyncio
import contextlib
import posixpath
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import anthropic
import httpx
import pytest

from corral.apikeys import create_key
from corral.records import Records
from gateway.http import MAX_BODY_BYTES, MAX_JSON_DEPTH, STREAM_RETRY_AFTER_SECONDS
from tests.chaos._processes import RoleProcess, role_process, until_healthy
from tests.conftest import Stack, unique
from tests.ports import free_port
from tests.proxy_servers.devvault import shared_dev_vault

pytestmark = pytest.mark.timeout(600)

STREAMS_PER_KEY = 2
"""The bound this module's gateway is started with (`CORRAL_GATEWAY_MAX_STREAMS_PER_KEY`)."""

UNICODE = [
    "héllo wörld",
    "日本語のテキスト",
    "🦀🔥 astral \U0010fffd",
    "مرحبا بالعالم",
    "e\u0301 combining, zero\u200bwidth, \ufeffbom",
    "nul\u0000byte",
    "tab\tnew\nline\r\nreturn",
    "\u202eright-to-left override",
]
"""Strings that are valid Unicode: each round-trips, or is refused with a 400 naming its field."""


@dataclass
class Gateway:
    url: str
    process: RoleProcess
    records: Records
    key: str = ""

    async def new_key(self, workspace: str | None = None) -> str:
        key, _ = await create_key(self.records, workspace or unique("red-team"))
        return key

    def client(self, key: str) -> anthropic.AsyncAnthropic:
        return anthropic.AsyncAnthropic(base_url=self.url, api_key=key, max_retries=0)

    def http(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=self.url, headers={"x-api-key": self.key}, timeout=60)


@pytest.fixture
async def gateway(stack: Stack, tmp_path: Path) -> AsyncIterator[Gateway]:
    """A gateway with Vault and a stream bound of `STREAMS_PER_KEY`; at the end, its log holds no traceback."""
    dev_vault = shared_dev_vault()
    port = free_port()
    address = stack.client.service_client.config.target_host
    argv = [sys.executable, "-m", "gateway", "--port", str(port), "--temporal", address,
            "--harness-queue", stack.harness_queue, "--model-queue", stack.model_queue]  # fmt: skip
    env = {"VAULT_ADDR": dev_vault.address, "VAULT_TOKEN": dev_vault.root_token.get_secret_value(),
           "CORRAL_VAULT_MOUNT": dev_vault.mount,
           "CORRAL_GATEWAY_MAX_STREAMS_PER_KEY": str(STREAMS_PER_KEY)}  # fmt: skip
    with role_process("gateway", argv, tmp_path, **env) as process:
        url = f"http://127.0.0.1:{port}"
        await until_healthy(url, process)
        gateway = Gateway(url, process, Records(stack.client, task_queue=stack.harness_queue))
        gateway.key = await gateway.new_key()
        yield gateway
        log = process.log.read_text()
        assert "Traceback" not in log, f"the gateway failed on a request:\n{log[-4000:]}"


def refused(response: httpx.Response, *statuses: int) -> str:
    """The error message of a response that must be one of `statuses`, in the API's error shape."""
    assert response.status_code in statuses, (response.status_code, response.text[:500])
    body = response.json()
    assert body["type"] == "error" and isinstance(body["error"]["message"], str), body
    return str(body["error"]["message"])


async def agent_environment_session(stack: Stack, http: httpx.AsyncClient) -> tuple[str, str, str]:
    agent = await http.post("/v1/agents", json={"name": "a", "model": stack.script([{"text": "ok"}], loop=True)})
    environment = await http.post("/v1/environments", json={"name": "e"})
    ids = agent.json()["id"], environment.json()["id"]
    session = await http.post("/v1/sessions", json={"agent": ids[0], "environment_id": ids[1]})
    assert session.status_code == 200, session.text
    return ids[0], ids[1], session.json()["id"]


# ---- bodies -----------------------------------------------------------------------------------------------------


async def test_an_oversized_body_is_refused_before_it_is_read(gateway: Gateway) -> None:
    """A declared length over the limit is refused at once (no byte of the body sent); a chunked body once it
    passes the limit, though it never ends. The limit is the documented `MAX_BODY_BYTES`."""
    host, port = gateway.url.removeprefix("http://").split(":")
    head = (f"POST /v1/agents HTTP/1.1\r\nhost: {host}\r\nx-api-key: {gateway.key}\r\n"
            "content-type: application/json\r\n")  # fmt: skip
    for framing, body in (
        (f"content-length: {10**12}\r\n\r\n", [b'{"name": "']),  # a terabyte declared, a few bytes sent
        ("transfer-encoding: chunked\r\n\r\n", [b"100000\r\n" + b"x" * 0x100000 + b"\r\n"] * 40),  # no last chunk
    ):
        reader, writer = await asyncio.open_connection(host, int(port))

        async def send(writer: asyncio.StreamWriter = writer, framing: str = framing, body: list[bytes] = body) -> None:
            writer.write((head + framing).encode())
            for chunk in body:
                writer.write(chunk)
                await writer.drain()

        sending = asyncio.create_task(send())
        try:
            status_line = await asyncio.wait_for(reader.readline(), 120)
            headers = (await reader.readuntil(b"\r\n\r\n")).decode().lower()
        finally:
            sending.cancel()
            with contextlib.suppress(asyncio.CancelledError, ConnectionError):
                await sending
            writer.close()
        assert status_line.startswith(b"HTTP/1.1 413"), (framing, status_line)
        assert "request-id: req_" in headers
    async with gateway.http() as http:
        response = await http.post("/v1/agents", content=b'{"name": "' + b"x" * (MAX_BODY_BYTES + 1) + b'"}')
        assert str(MAX_BODY_BYTES) in refused(response, 413)
        assert (await http.get("/v1/agents")).json()["data"] == [], "nothing was made"


async def test_deep_json_nan_and_lone_surrogates_are_400_on_every_body(stack: Stack, gateway: Gateway) -> None:
    async with gateway.http() as http:
        agent, _, session = await agent_environment_session(stack, http)
        vault = (await http.post("/v1/vaults", json={"display_name": "v"})).json()["id"]
        routes = ["/v1/agents", "/v1/environments", "/v1/sessions", "/v1/vaults", f"/v1/agents/{agent}",
                  f"/v1/sessions/{session}", f"/v1/sessions/{session}/events",
                  f"/v1/vaults/{vault}/credentials"]  # fmt: skip
        deepest = b'{"metadata": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"  # past Python's own recursion limit
        just_past = b'{"metadata": ' + b"[" * MAX_JSON_DEPTH + b"]" * MAX_JSON_DEPTH + b"}"
        bodies = {
            deepest: "nests deeper",
            just_past: "nests deeper",
            b'{"name": NaN, "metadata": {"k": Infinity}}': "not JSON",
            b'{"name": "lone \\ud800 surrogate"}': "lone surrogate",
            b'{"metadata": {"\\udfff": "key"}}': "lone surrogate",
            b'{"name": 1' + b"0" * 5000 + b"}": "not JSON",  # past Python's int digit limit
        }
        for route in routes:
            for raw, reason in bodies.items():
                response = await http.post(route, content=raw, headers={"content-type": "application/json"})
                assert reason in refused(response, 400), (route, raw[:40])
        fits = (
            b'{"name": "fits", "model": "m", "metadata": {}, "tools": [{"type": "custom", "name": "t", '
            b'"input_schema": ' + b'{"type": "object", "properties": {"x": ' * 20 + b"{}" + b"}}" * 20 + b"}]}"
        )
        made = await http.post("/v1/agents", content=fits, headers={"content-type": "application/json"})
        assert made.status_code in (200, 400) and "nests deeper" not in made.text, made.text
        events = (await http.get(f"/v1/sessions/{session}/events")).json()["data"]
        assert events == [], "no event was written"


async def test_unicode_in_every_string_field_round_trips_or_is_a_clear_400(stack: Stack, gateway: Gateway) -> None:
    async with gateway.http() as http:
        agent, environment, _ = await agent_environment_session(stack, http)
        vault = (await http.post("/v1/vaults", json={"display_name": "v"})).json()["id"]
        outcomes: dict[str, list[str]] = {}
        for text in UNICODE:
            key = text[:16]
            requests: list[tuple[str, dict[str, Any], dict[str, str]]] = [
                ("/v1/agents", {"name": text, "description": text, "system": text, "model": text,
                                "metadata": {key: text}},
                 {"name": "name", "description": "description", "system": "system", "model.id": "model"}),
                ("/v1/environments", {"name": text, "description": text, "metadata": {key: text}},
                 {"name": "name", "description": "description"}),
                ("/v1/vaults", {"display_name": text, "metadata": {key: text}}, {"display_name": "display_name"}),
                (f"/v1/vaults/{vault}/credentials",
                 {"display_name": text, "metadata": {key: text},
                  "auth": {"type": "static_bearer", "mcp_server_url": f"https://mcp.example/{uuid.uuid4().hex}",
                           "token": text}},
                 {"display_name": "display_name"}),
                ("/v1/sessions", {"agent": agent, "environment_id": environment, "title": text,
                                  "metadata": {key: text}}, {"title": "title"}),
            ]  # fmt: skip
            for route, request, shown in requests:
                response = await http.post(route, json=request)
                assert response.status_code in (200, 400), (route, text, response.status_code, response.text[:300])
                if response.status_code == 400:
                    outcomes.setdefault(route, []).append(refused(response, 400))
                    continue
                view = response.json()
                for path, field in shown.items():
                    value = view
                    for part in path.split("."):
                        value = value[part]
                    assert value == request[field], (route, path, text)
                assert view["metadata"] == {key: text}, (route, text)
                if route == "/v1/sessions":
                    sent = await http.post(f"/v1/sessions/{view['id']}/events", json={"events": [
                        {"type": "user.message", "content": [{"type": "text", "text": text}]}]})  # fmt: skip
                    assert sent.status_code == 200, sent.text
                    assert sent.json()["data"][0]["content"][0]["text"] == text
        for route, messages in outcomes.items():  # a refusal says which field, in words
            assert all(":" in message or "must" in message for message in messages), (route, messages)
        for text in map(quote, UNICODE):  # in ids and query values (percent-encoded): a 404 or a 400, never a 500
            for target in (f"/v1/agents/agent_{text}", f"/v1/sessions/{text}", f"/v1/vaults?page={text}",
                           f"/v1/sessions?created_at[gte]={text}", f"/v1/agents?page={text}",
                           f"/v1/vaults/vlt_{text}/credentials/vcrd_{text}"):  # fmt: skip
                refused(await http.get(target), 400, 404)


# ---- paths and headers ------------------------------------------------------------------------------------------


async def raw_get(http: httpx.AsyncClient, target: str) -> httpx.Response:
    """A GET of `target` exactly as written: no client-side normalisation of `..` or of percent-escapes."""
    request = http.build_request("GET", target)
    request.extensions["target"] = target.encode()
    return await http.send(request)


async def test_path_traversal_reaches_nothing(stack: Stack, gateway: Gateway) -> None:
    async with gateway.http() as http:
        agent, environment, session = await agent_environment_session(stack, http)
        vault = (await http.post("/v1/vaults", json={"display_name": "v"})).json()["id"]
        for target in (
            "/v1/agents/../sessions", "/v1/agents/..%2F..%2Fv1%2Fsessions", "/v1/sessions/%2e%2e",
            "/v1/sessions/%2e%2e%2f%2e%2e%2fetc%2fpasswd", "/v1/sessions//etc/passwd", "/v1/vaults/vlt_..%2F..%2Fx",
            f"/v1/vaults/{vault}/credentials/vcrd_..%2F..%2F..%2Fvaults%2F{vault}",
            f"/v1/vaults/{vault}/credentials/..%2F..%2F{vault}", f"/v1/vaults/{vault}/credentials/%2Fetc%2Fpasswd",
            f"/v1/sessions/{session}/resources/..%2F..%2F{session}", f"/v1/sessions/{session}/resources/%2Fetc",
            f"/v1/sessions/sesn_..%2F{session}", f"/v1/agents/agent_..%2F{agent}",
            f"/v1/environments/{environment}%2F..",
        ):  # fmt: skip
            refused(await raw_get(http, target), 400, 404)
        repository = {"type": "github_repository", "url": "https://git.example/acme/widgets.git",
                      "authorization_token": "ghp_" + uuid.uuid4().hex}  # fmt: skip
        for mount in ("/workspace/../etc", "/workspace/./../../etc", "/etc", "workspace/x", "/workspace/x/../../etc",
                      "/workspace/%2e%2e/etc", "/workspace/\u2025/etc", "../workspace/x",
                      "/workspace/..\\etc"):  # fmt: skip
            resources = [{**repository, "mount_path": mount}]
            response = await http.post("/v1/sessions", json={"agent": agent, "environment_id": environment,
                                                              "resources": resources})  # fmt: skip
            if response.status_code == 200:  # a literal name under /workspace, never a way out of it
                shown = response.json()["resources"][0]["mount_path"]
                assert shown == mount and posixpath.normpath(shown).startswith("/workspace/"), (mount, shown)
                assert ".." not in shown.split("/"), shown
            else:
                assert "mount_path" in refused(response, 400), mount
        assert refused(await http.post("/v1/sessions", json={"agent": agent, "environment_id": environment,
            "resources": [{**repository, "url": "file:///etc/passwd"}]}), 400)  # fmt: skip


async def test_cr_lf_never_reaches_a_response_header(stack: Stack, gateway: Gateway) -> None:
    injected = "%0d%0ax-injected:%20yes%0d%0aset-cookie:%20pwned=1"
    async with gateway.http() as http:
        agent, environment, session = await agent_environment_session(stack, http)
        vault = (await http.post("/v1/vaults", json={"display_name": "v"})).json()["id"]
        responses = [
            await raw_get(http, target)
            for target in (
                f"/v1/agents/agent_x{injected}", f"/v1/environments/{injected}", f"/v1/sessions/sesn_{injected}",
                f"/v1/sessions/{session}/resources/repo1{injected}", f"/v1/vaults/vlt_{injected}",
                f"/v1/vaults/{vault}/credentials/vcrd_{injected}", f"/v1/agents?page={injected}",
                f"/v1/sessions/{session}/events?page={injected}", f"/v1/agents/{agent}?version=1{injected}",
                f"/v1/sessions/{session}/events/stream?event_deltas[]={injected}",
            )
        ]  # fmt: skip
        crlf = "env_\r\nx-injected: yes"
        responses += [
            await http.post("/v1/sessions", json={"agent": agent, "environment_id": crlf}),
            await http.post("/v1/sessions", json={"agent": agent, "environment_id": environment, "vault_ids": [crlf]}),
            await http.post(f"/v1/sessions/{session}/events", json={"events": [
                {"type": "user.tool_confirmation", "tool_use_id": "sevt_\r\nx-injected: yes", "result": "allow"}]}),
        ]  # fmt: skip
    for response in responses:
        refused(response, 400, 404)
        assert "x-injected" not in response.headers and "set-cookie" not in response.headers, response.headers
        assert all("\r" not in value and "\n" not in value for value in response.headers.values())


# ---- streams ----------------------------------------------------------------------------------------------------


async def test_a_flood_of_streams_from_one_key_is_bounded_and_a_closed_stream_frees_its_slot(
    stack: Stack, gateway: Gateway
) -> None:
    workspace = unique("flood")
    flooder = gateway.client(await gateway.new_key(workspace))
    neighbour = gateway.client(await gateway.new_key(workspace))  # another key of the same workspace
    agent = await flooder.beta.agents.create(name="a", model=stack.script([{"text": "still here"}]))
    environment = await flooder.beta.environments.create(name="e")
    session = await flooder.beta.sessions.create(agent=agent.id, environment_id=environment.id)
    for _ in range(STREAMS_PER_KEY + 1):  # refused before they open: they hold no slot
        with pytest.raises(anthropic.BadRequestError, match="event_deltas"):
            await flooder.beta.sessions.events.stream(session.id, extra_query={"event_deltas[]": "bogus"})
    held = [await flooder.beta.sessions.events.stream(session.id) for _ in range(STREAMS_PER_KEY)]
    with pytest.raises(anthropic.RateLimitError) as over:
        await flooder.beta.sessions.events.stream(session.id)
    assert over.value.response.headers["retry-after"] == str(STREAM_RETRY_AFTER_SECONDS)
    assert over.value.body["error"]["type"] == "rate_limit_error"  # type: ignore[index]
    assert str(STREAMS_PER_KEY) in over.value.body["error"]["message"]  # type: ignore[index]
    other = await neighbour.beta.sessions.events.stream(session.id)  # another key of the same workspace: unaffected
    await other.close()

    await held.pop().close()
    held.append(await when_free(flooder, session.id))
    with pytest.raises(anthropic.RateLimitError):
        await flooder.beta.sessions.events.stream(session.id)

    await flooder.beta.sessions.events.send(
        session.id, events=[{"type": "user.message", "content": [{"type": "text", "text": "hi"}]}]
    )
    for stream in held:  # the streams held are real ones: each sees the turn
        seen = []
        async for event in stream:
            seen.append(event)
            if event.type == "session.status_idle":
                break
        assert [e.content[0].text for e in seen if e.type == "agent.message"] == ["still here"]  # type: ignore[union-attr]
        await stream.close()
    again = [await when_free(flooder, session.id) for _ in range(STREAMS_PER_KEY)]  # every slot was given back
    for stream in again:
        await stream.close()
    await flooder.close()
    await neighbour.close()


async def when_free(client: anthropic.AsyncAnthropic, session_id: str) -> Any:
    """A stream of the session, once the key has a free slot: the gateway gives one back when it sees a closed
    stream's client go, a moment after the client closed it."""
    for _ in range(300):
        try:
            return await client.beta.sessions.events.stream(session_id)
        except anthropic.RateLimitError:
            await asyncio.sleep(0.1)
    pytest.fail("a closed stream's slot was never given back")
