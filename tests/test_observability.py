"""Traces, metrics and logs of a real session: a gateway process and harness and model worker processes, each set up
as deployed (`corral.telemetry.setup`), exporting spans over OTLP/HTTP to a receiver in this test, serving
Prometheus metrics and logging JSON. One trace runs from the gateway's request to the workflow and its model
activity; the metrics count what the session did; the log lines name the session; and a canary that the session
carried (the user's message, a tool's input and result, the model's answer) is in none of them."""

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
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from temporalio.testing import WorkflowEnvironment

from corral.modelserver import ModelServerThread
from corral.names import SESSION_WORKFLOW, SIGNAL_USER_MESSAGE
from corral.streaming import StreamRelayThread
from tests.chaos._processes import RoleProcess, free_port, role_process
from tests.conftest import Stack, unique
from tests.test_gateway import running_gateway

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


@pytest.fixture
async def observed(
    temporal_env: WorkflowEnvironment, model_server: ModelServerThread, stream_relay: StreamRelayThread,
    tmp_path: Path,
) -> AsyncIterator[tuple[Observed, Any]]:  # fmt: skip
    """Harness and model worker processes and a gateway process on fresh queues, all traced, metered and logging
    JSON; no in-process worker, so every task of the session runs in an observed process."""
    stack = Stack(temporal_env.client, model_server, unique("harness"), unique("model"), unique("hand"), stream_relay)
    with otlp_receiver() as (endpoint, receiver):
        common = {"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100",
                  "CORRAL_LOG_FORMAT": "json"}  # fmt: skip
        metrics = {role: f"127.0.0.1:{free_port()}" for role in ("harness", "model", "gateway")}
        address = temporal_env.client.service_client.config.target_host
        async with AsyncExitStack() as running:
            processes: dict[str, RoleProcess] = {}
            for role in ("harness", "model"):
                argv = [sys.executable, "-m", "tests.observed_worker_process", "--role", role, "--address", address,
                        "--model-url", str(model_server.base_url), "--harness-queue", stack.harness_queue,
                        "--model-queue", stack.model_queue, "--hand-queue", stack.hand_queue]  # fmt: skip
                processes[role] = running.enter_context(
                    role_process(role, argv, tmp_path, CORRAL_METRICS_ADDRESS=metrics[role], **common)
                )
            gateway = await running.enter_async_context(
                running_gateway(stack, tmp_path, CORRAL_METRICS_ADDRESS=metrics["gateway"], **common)
            )
            processes["gateway"] = gateway.process
            yield Observed(stack, receiver, processes, metrics), gateway
            for handle_id in [s.id for s in stack.started]:
                await temporal_env.client.get_workflow_handle(handle_id).terminate("test finished")


async def until(predicate: Any, what: str, within: float = 60) -> None:
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {within}s: {what}")
        await asyncio.sleep(0.1)


async def test_a_session_is_traced_metered_and_logged_and_no_canary_leaks(observed: tuple[Observed, Any]) -> None:
    world, gateway = observed
    stack = world.stack
    canary = f"canary-{uuid.uuid4().hex}"
    client = await gateway.client("observed")
    model = stack.script([
        # The first request is overloaded once (a session.error, retried), then asks for the test hand's echo.
        {"fail": [{"status": 529}], "tool_uses": [{"name": "echo", "input": {"text": canary}}]},
        {"text": f"the echo said {canary}"},
    ])  # fmt: skip
    echo = {"type": "hand", "name": "echo", "description": "echo text", "task_queue": stack.hand_queue,
            "input_schema": {"type": "object", "properties": {"text": {"type": "string"}}}}  # fmt: skip
    agent = await client.beta.agents.create(name="observed", model=model, tools=[echo])
    environment = await client.beta.environments.create(name="plain")
    session = await client.beta.sessions.create(agent=agent.id, environment_id=environment.id)
    stack.started.append(stack.client.get_workflow_handle(session.id))
    await client.beta.sessions.events.send(
        session.id, events=[{"type": "user.message", "content": [{"type": "text", "text": f"say {canary}"}]}]
    )
    events: list[Any] = []

    async def answered() -> bool:
        events[:] = [e async for e in client.beta.sessions.events.list(session.id)]
        return events[-1].type == "session.status_idle" and any(e.type == "agent.message" for e in events)

    deadline = time.monotonic() + 90
    while not await answered():
        assert time.monotonic() < deadline, [e.type for e in events]
        await asyncio.sleep(0.2)
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
    workflow_spans = [s for s in receiver.named(f"RunWorkflow:{SESSION_WORKFLOW}", "corral-harness")
                      if s.attributes.get("temporalWorkflowID", "").strip('"').endswith(session.id)]  # fmt: skip
    assert workflow_spans, "the workflow's span names its session"
    trace_id = workflow_spans[0].trace_id
    requests = [s for s in receiver.named("POST /v1/sessions", "corral-gateway") if s.trace_id == trace_id]
    assert requests, "the session's workflow runs in the trace of the gateway request that created it"
    assert requests[0].parent_id == "", "the gateway's server span is the trace's root"
    turns = [s for s in receiver.named("RunActivity:model_turn", "corral-model") if s.trace_id == trace_id]
    assert len(turns) >= 3, "every model turn (the overloaded one too) is in the session's trace"
    assert [s for s in receiver.named("RunActivity:execute", "corral-model") if s.trace_id == trace_id]
    with receiver.lock:
        services = {s.service for s in receiver.spans if s.trace_id == trace_id}
    assert services == {"corral-gateway", "corral-harness", "corral-model"}

    # ---- metrics: each process's Prometheus endpoint
    async with httpx.AsyncClient(timeout=10) as http:
        scraped = {role: (await http.get(f"http://{address}/metrics")).text for role, address in world.metrics.items()}
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
