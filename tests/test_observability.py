"""Traces, metrics and logs of a real session: a gateway process and harness and model worker processes, each set up
as deployed (`corral.telemetry.setup`), exporting spans over OTLP/HTTP to a receiver in this test, serving
Prometheus metrics and logging JSON. One trace runs from the gateway's request to the workflow and its model
activity; the metrics count what the session did; the log lines name the session; and a canary that the session
carried (the user's message, a tool's input and result, the model's answer) is in none of them. A second session
calls an MCP tool through a proxy worker process with a bearer token held in Vault (written there through the
gateway): the server got the token, and it is in no span, metric or log of any process, no event and no history."""

from __future__ import annotations

import asyncio
import gzip
import json
import re
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from temporalio.testing import WorkflowEnvironment

from corral.names import ACTIVITY_MCP_CALL_TOOL, ENV_TEMPORAL_ADDRESS, SESSION_WORKFLOW, SIGNAL_USER_MESSAGE
from corral.serving import ServerThread
from modelserver import ModelServerThread
from proxy.devvault import DevVault
from proxy.layout import secret_path
from relay import StreamRelayThread
from tests.chaos._processes import RoleProcess, role_process, worker_argv
from tests.conftest import Stack, history_text, unique
from tests.ports import free_port
from tests.proxy_servers.devvault import scan_for, shared_dev_vault
from tests.proxy_servers.mcp_server import create_mcp_app
from tests.proxy_servers.tokens import TokenAuthority
from tests.test_gateway import Gateway, running_gateway
from tests.waits import until

pytestmark = pytest.mark.timeout(300)

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class ExportedSpan:
    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    attributes: dict[str, Any]


@dataclass
class OtlpReceiver:
    """A tiny OTLP/HTTP trace receiver: what the exporters posted, raw (for the canary scan) and decoded."""

    bodies: list[bytes] = field(default_factory=list)
    spans: list[ExportedSpan] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def receive(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        spans = []
        for resource_spans in request.resource_spans:
            resource = {a.key: a.value.string_value for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    attributes = {a.key: str(a.value).strip() for a in span.attributes}
                    spans.append(ExportedSpan(resource.get("service.name", ""), span.name, span.trace_id.hex(),
                                              span.span_id.hex(), span.parent_span_id.hex(), attributes))  # fmt: skip
        with self.lock:
            self.bodies.append(body)
            self.spans.extend(spans)

    def named(self, name: str, service: str) -> list[ExportedSpan]:
        with self.lock:
            return [s for s in self.spans if s.name == name and s.service == service]


@contextmanager
def otlp_receiver() -> Iterator[tuple[str, OtlpReceiver]]:
    receiver = OtlpReceiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path == "/v1/traces":
                receiver.receive(body)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", receiver
    finally:
        server.shutdown()
        server.server_close()


def metric_samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """The samples of one metric in Prometheus text: (labels, value)."""
    samples = []
    for line in text.splitlines():
        match = re.fullmatch(r"(\w+)(?:\{(.*)\})? (\S+)", line.strip())
        if match and match[1] == name:
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match[2] or ""))
            samples.append((labels, float(match[3])))
    return samples


def total(text: str, name: str, **labels: str) -> float:
    return sum(value for got, value in metric_samples(text, name) if labels.items() <= got.items())


def json_lines(log: Path) -> list[dict[str, Any]]:
    """The JSON objects a process logged (the lines the test harness or the Temporal core wrote otherwise: left)."""
    lines = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


@dataclass
class Observed:
    stack: Stack
    receiver: OtlpReceiver
    processes: dict[str, RoleProcess]
    metrics: dict[str, str]
    """Each process's Prometheus address, by role."""


@asynccontextmanager
async def observing(
    temporal_env: WorkflowEnvironment, model_server: ModelServerThread, stream_relay: StreamRelayThread,
    tmp_path: Path, vault: DevVault | None = None,
) -> AsyncIterator[tuple[Observed, Gateway]]:  # fmt: skip
    """Harness and model worker processes and a gateway process on fresh queues, all traced, metered and logging
    JSON; no in-process worker, so every task of the session runs in an observed process. With `vault`, the gateway
    writes credentials to it and a proxy worker process (its own entrypoint, `workers.proxy`) serves MCP calls with
    them: on `corral-proxy`, the one queue sessions send proxy activities to (this run's dev server is its own)."""
    stack = Stack(temporal_env.client, model_server, unique("harness"), unique("model"), unique("hand"), stream_relay)
    with otlp_receiver() as (endpoint, receiver):
        common = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100",
                  "CORRAL_LOG_FORMAT": "json"}  # fmt: skip
        roles = ("harness", "model", "gateway", *(("proxy",) if vault is not None else ()))
        metrics = {role: f"127.0.0.1:{free_port()}" for role in roles}
        address = temporal_env.client.service_client.config.target_host
        vault_env = {} if vault is None else {"VAULT_ADDR": vault.address, "CORRAL_VAULT_MOUNT": vault.mount,
                                              "VAULT_TOKEN": vault.root_token.get_secret_value()}  # fmt: skip
        async with AsyncExitStack() as running:
            processes: dict[str, RoleProcess] = {}
            for role in ("harness", "model"):
                argv = [sys.executable, "-m", "tests.observed_worker_process", "--role", role, "--address", address,
                        "--model-url", str(model_server.base_url), "--harness-queue", stack.harness_queue,
                        "--model-queue", stack.model_queue, "--hand-queue", stack.hand_queue]  # fmt: skip
                processes[role] = running.enter_context(
                    role_process(role, argv, tmp_path, CORRAL_METRICS_ADDRESS=metrics[role], **common)
                )
            if vault is not None:
                # The git proxy it also serves listens on a free port of loopback, not on 0.0.0.0:8767.
                proxy_env = {ENV_TEMPORAL_ADDRESS: address, "CORRAL_METRICS_ADDRESS": metrics["proxy"],
                             "CORRAL_GIT_PROXY_HOST": "127.0.0.1",
                             "CORRAL_GIT_PROXY_PORT": str(free_port())}  # fmt: skip
                processes["proxy"] = running.enter_context(
                    role_process("proxy", worker_argv("proxy"), tmp_path, **proxy_env, **vault_env, **common)
                )
            gateway = await running.enter_async_context(
                running_gateway(stack, tmp_path, CORRAL_METRICS_ADDRESS=metrics["gateway"], **vault_env, **common)
            )
            processes["gateway"] = gateway.process
            yield Observed(stack, receiver, processes, metrics), gateway
            for handle_id in [s.id for s in stack.started]:
                await temporal_env.client.get_workflow_handle(handle_id).terminate("test finished")


@pytest.fixture
async def observed(
    temporal_env: WorkflowEnvironment, model_server: ModelServerThread, stream_relay: StreamRelayThread,
    tmp_path: Path,
) -> AsyncIterator[tuple[Observed, Gateway]]:  # fmt: skip
    async with observing(temporal_env, model_server, stream_relay, tmp_path) as running:
        yield running


@pytest.fixture
async def observed_with_proxy(
    temporal_env: WorkflowEnvironment, model_server: ModelServerThread, stream_relay: StreamRelayThread,
    tmp_path: Path,
) -> AsyncIterator[tuple[Observed, Gateway]]:  # fmt: skip
    """`observed` plus the OpenBao dev server, written to by the gateway and read by a proxy worker process."""
    async with observing(temporal_env, model_server, stream_relay, tmp_path, vault=shared_dev_vault()) as running:
        yield running


async def until_answered(client: anthropic.AsyncAnthropic, session_id: str, within: float = 90) -> list[Any]:
    """The session's events once it went idle after an agent message."""
    deadline = time.monotonic() + within
    while True:
        events = [e async for e in client.beta.sessions.events.list(session_id)]
        if events[-1].type == "session.status_idle" and any(e.type == "agent.message" for e in events):
            return events
        assert time.monotonic() < deadline, [e.type for e in events]
        await asyncio.sleep(0.2)


def session_trace(receiver: OtlpReceiver, session_id: str) -> str:
    """The id of the trace the session's workflow runs in (its span names the session)."""
    workflow_spans = [s for s in receiver.named(f"RunWorkflow:{SESSION_WORKFLOW}", "corral-harness")
                      if s.attributes.get("temporalWorkflowID", "").strip('"').endswith(session_id)]  # fmt: skip
    assert workflow_spans, "the workflow's span names its session"
    return workflow_spans[0].trace_id


async def scrape(metrics: dict[str, str]) -> dict[str, str]:
    """Each process's Prometheus text, by role."""
    async with httpx.AsyncClient(timeout=10) as http:
        return {role: (await http.get(f"http://{address}/metrics")).text for role, address in metrics.items()}


async def test_a_session_is_traced_metered_and_logged_and_no_canary_leaks(observed: tuple[Observed, Gateway]) -> None:
    world, gateway = observed
    stack = world.stack
    canary = f"canary-{uuid.uuid4().hex}"
    client = await gateway.client("observed")
    model = stack.script([
        # The first request is overloaded once (a session.error, retried), then asks for the test hand's echo.
        {"fail": [{"status": 529}], "tool_uses": [{"name": "echo", "input": {"text": canary}}]},
        {"text": f"the echo said {canary}"},
    ])  # fmt: skip
    echo: Any = {"type": "hand", "name": "echo", "description": "echo text", "task_queue": stack.hand_queue,
                 "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}}}  # fmt: skip
    await gateway.allow_hand(stack.hand_queue, "observed")  # the operator's registration of the test hand
    agent = await client.beta.agents.create(name="observed", model=model, tools=[echo])
    environment = await client.beta.environments.create(name="plain")
    session = await client.beta.sessions.create(agent=agent.id, environment_id=environment.id)
    stack.started.append(stack.client.get_workflow_handle(session.id))
    await client.beta.sessions.events.send(
        session.id, events=[{"type": "user.message", "content": [{"type": "text", "text": f"say {canary}"}]}]
    )
    events = await until_answered(client, session.id)
    dumped = json.dumps([e.model_dump(mode="json") for e in events])
    assert dumped.count(canary) >= 3, "the canary went through the session (message, tool call and result, answer)"
    assert "session.error" in [e.type for e in events]
    # A workflow log line: the session drops a user_message signal without content, with a warning.
    await stack.client.get_workflow_handle(session.id).signal(SIGNAL_USER_MESSAGE)

    # ---- traces: the gateway's request, the workflow and its model activity are one trace
    receiver = world.receiver
    await until(lambda: receiver.named("RunActivity:model_turn", "corral-model")
                and receiver.named("RunActivity:execute", "corral-model")
                and receiver.named(f"RunWorkflow:{SESSION_WORKFLOW}", "corral-harness")
                and receiver.named("POST /v1/sessions", "corral-gateway"), "the session's spans exported")  # fmt: skip
    trace_id = session_trace(receiver, session.id)
    requests = [s for s in receiver.named("POST /v1/sessions", "corral-gateway") if s.trace_id == trace_id]
    assert requests, "the session's workflow runs in the trace of the gateway request that created it"
    assert requests[0].parent_id == "", "the gateway's server span is the trace's root"

    def turns() -> list[Any]:
        return [s for s in receiver.named("RunActivity:model_turn", "corral-model") if s.trace_id == trace_id]

    # Each process exports its spans in batches of its own, so the last turn's may come a moment after the others.
    await until(lambda: len(turns()) >= 3, "every model turn (the overloaded one too) in the session's trace")
    assert [s for s in receiver.named("RunActivity:execute", "corral-model") if s.trace_id == trace_id]
    with receiver.lock:
        services = {s.service for s in receiver.spans if s.trace_id == trace_id}
    assert services == {"corral-gateway", "corral-harness", "corral-model"}

    # ---- metrics: each process's Prometheus endpoint
    scraped = await scrape(world.metrics)
    model_metrics, harness_metrics = scraped["model"], scraped["harness"]
    assert total(model_metrics, "corral_model_turns", model=model, kind="turn", outcome="ok") == 2
    assert total(model_metrics, "corral_model_turns", model=model, outcome="model_overloaded_error") == 1
    assert total(model_metrics, "corral_model_time_to_first_token_count", model=model) == 2
    assert total(model_metrics, "corral_model_time_to_first_token_sum", model=model) > 0
    assert total(model_metrics, "corral_tool_latency_count", hand=stack.hand_queue, outcome="ok") == 1
    assert total(harness_metrics, "corral_session_errors", error_type="model_overloaded_error") == 1
    assert total(harness_metrics, "temporal_workflow_task_execution_latency_count") > 0, "the SDK's own metrics"
    assert total(scraped["gateway"], "temporal_request", operation="StartWorkflowExecution") >= 1

    # ---- logs: JSON objects, and the session's lines name it
    logs = {role: json_lines(process.log) for role, process in world.processes.items()}
    assert all(logs.values()), "every process logs JSON"
    model_lines = [line for line in logs["model"] if line.get("session_id") == session.id]
    assert any(line.get("activity_type") == "model_turn" and line["level"] == "WARNING" for line in model_lines), (
        "the overloaded model turn's warning names its session and activity"
    )
    harness_log = world.processes["harness"].log
    await until(lambda: any(line.get("session_id") == session.id for line in json_lines(harness_log)),
                "the workflow's warning logged")  # fmt: skip
    dropped = [line for line in json_lines(harness_log) if line.get("session_id") == session.id]
    assert dropped[0]["workflow_type"] == SESSION_WORKFLOW and dropped[0]["history_length"] > 0

    # ---- the canary: in none of the exported spans, metrics or log lines
    with receiver.lock:
        exported = b"".join(receiver.bodies)
    assert canary.encode() not in exported
    assert not [role for role, text in scraped.items() if canary in text]
    assert not [role for role, process in world.processes.items() if canary in process.log.read_text(errors="replace")]


async def test_a_vault_credential_the_proxy_process_used_is_in_no_span_metric_log_event_or_history(
    observed_with_proxy: tuple[Observed, Gateway],
) -> None:
    """The canary is an MCP server's bearer token, written to Vault through the gateway and used by the proxy worker
    process for the session's MCP call: the server saw it, and no process (the proxy included) exported or logged
    it."""
    world, gateway = observed_with_proxy
    stack, receiver = world.stack, world.receiver
    dev_vault = shared_dev_vault()
    authority = TokenAuthority()
    token = authority.issue_access_token(prefix="at-canary")
    proxy_log = world.processes["proxy"].log
    await until(lambda: "worker on task queue corral-proxy started" in proxy_log.read_text(errors="replace"),
                f"the proxy worker serving (see {proxy_log})")  # fmt: skip
    with ServerThread(lambda url: create_mcp_app(authority, url), name="mcp", lifespan="on", app_takes_url=True) as mcp:
        mcp_url = f"{mcp.base_url}/mcp"
        client = await gateway.client("observed-vault")
        vault = await client.beta.vaults.create(display_name="observed")
        credential = await client.beta.vaults.credentials.create(
            vault.id, auth={"type": "static_bearer", "mcp_server_url": mcp_url, "token": token}
        )
        stored = dev_vault.client().secrets.kv.v2.read_secret_version(
            path=secret_path(vault.id, credential.id), mount_point=dev_vault.mount, raise_on_deleted_version=True
        )["data"]["data"]
        raw_secret = json.dumps(stored)
        assert token in raw_secret, "the gateway wrote the token to Vault"
        model = stack.script([
            {"tool_uses": [{"name": "mcp__tools__add", "input": {"a": 2, "b": 40}}]},
            {"text": "sum:", "echo_last_user": True},
        ])  # fmt: skip
        toolset: Any = {"type": "mcp_toolset", "mcp_server_name": "tools",
                        "default_config": {"permission_policy": {"type": "always_allow"}}}  # fmt: skip
        agent = await client.beta.agents.create(
            name="observed-mcp", model=model, mcp_servers=[{"type": "url", "name": "tools", "url": mcp_url}],
            tools=[toolset],
        )  # fmt: skip
        environment = await client.beta.environments.create(name="plain")
        session = await client.beta.sessions.create(agent=agent.id, environment_id=environment.id, vault_ids=[vault.id])
        handle = stack.client.get_workflow_handle(session.id)
        stack.started.append(handle)
        await client.beta.sessions.events.send(
            session.id, events=[{"type": "user.message", "content": [{"type": "text", "text": "add"}]}]
        )
        events = await until_answered(client, session.id)
    [result] = [e for e in events if e.type == "agent.mcp_tool_result"]
    assert not result.is_error and result.content[0].text == "42"
    assert authority.tool_calls == [("add", token)], "the MCP server saw the token from Vault: the proxy used it"

    # ---- the proxy process is in the session's trace (the MCP call), so the scan of spans covered it
    mcp_call = f"RunActivity:{ACTIVITY_MCP_CALL_TOOL}"
    await until(lambda: receiver.named(f"RunWorkflow:{SESSION_WORKFLOW}", "corral-harness")
                and receiver.named(mcp_call, "corral-proxy"), "the MCP call's span exported")  # fmt: skip
    trace_id = session_trace(receiver, session.id)
    calls = [s for s in receiver.named(mcp_call, "corral-proxy") if s.trace_id == trace_id]
    assert calls, "the proxy process's span of the MCP call is in the session's trace"
    with receiver.lock:
        services = {s.service for s in receiver.spans if s.trace_id == trace_id}
    assert services == {"corral-gateway", "corral-harness", "corral-model", "corral-proxy"}

    # ---- the proxy's metrics counted the call, its log is JSON like every other process's
    scraped = await scrape(world.metrics)
    assert total(scraped["proxy"], "corral_tool_latency_count", hand="mcp", outcome="ok") == 1
    logs = {role: json_lines(process.log) for role, process in world.processes.items()}
    assert all(logs.values()), "every process logs JSON"

    # ---- the canaries (the token, the secret as Vault holds it, and the Vault token the gateway and the proxy log
    # in with): in none of the spans, metrics, log lines, events or workflow histories
    listed = json.dumps([e.model_dump(mode="json") for e in events])
    assert "agent.mcp_tool_use" in listed and session.vault_ids == [vault.id]
    workflows = [w.id async for w in stack.client.list_workflows(f"TaskQueue = '{stack.harness_queue}'")]
    assert session.id in workflows
    histories = [await history_text(stack.client.get_workflow_handle(workflow_id)) for workflow_id in workflows]
    with receiver.lock:
        exported = b"".join(receiver.bodies).decode("latin-1")
    places = {"spans": [exported], "metrics": list(scraped.values()), "events": [listed], "histories": histories,
              "logs": [process.log.read_text(errors="replace") for process in world.processes.values()]}  # fmt: skip
    canaries = [token, raw_secret, dev_vault.root_token.get_secret_value()]
    leaks = {where: scan_for(canaries, *texts) for where, texts in places.items()}
    assert leaks == {where: [] for where in places}, f"a Vault-held canary leaked: {leaks}"


def test_without_the_variables_nothing_is_set_up() -> None:
    """No endpoint, no metrics address: no tracer provider, no interceptor, no runtime, no OpenTelemetry SDK loaded,
    and the log format stays the human one."""
    probe = (
        "import sys, logging\n"
        "from corral import telemetry\n"
        "t = telemetry.setup('corral-harness', {})\n"
        "from opentelemetry import trace\n"
        "print(t.tracing, t.interceptors, t.runtime, 'opentelemetry.sdk' in sys.modules,\n"
        "      type(trace.get_tracer_provider()).__name__, type(logging.getLogger().handlers[0].formatter).__name__)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "[]", "None", "False", "ProxyTracerProvider", "Formatter"]
