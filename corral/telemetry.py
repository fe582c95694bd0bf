"""Traces, metrics and log format of every corral process, from its environment, set up once by `setup(service)`.

- Traces: with `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) set, a tracer provider
  exports over OTLP/HTTP as `service.name` = the process's role (`corral-harness`, `corral-gateway`, ...), and every
  Temporal client (so every worker made from it) carries the SDK's `TracingInterceptor`: one trace runs from the
  gateway's request through the workflow to its activities. Unset: no provider, no interceptor, nothing imported.
- Metrics: with `CORRAL_METRICS_ADDRESS` (host:port) set, the process's Temporal runtime serves Prometheus there:
  the SDK's own metrics (`temporal_*`) and corral's (`corral_*`), recorded through `activity.metric_meter()` and
  `workflow.metric_meter()` (replay-safe: a replayed workflow task records nothing). Unset: the default runtime,
  whose meters do nothing.
- Logs: `CORRAL_LOG_FORMAT=json` prints one JSON object per line, with the session id (the workflow id), the
  activity type or the workflow's history length, and the trace id where known. Default: the human format.

Spans carry ids, names and types, never a payload: the interceptor's attributes are workflow, run and activity ids,
and the gateway's server span has the method, the route and the status code (no query string, no header).
"""

from __future__ import annotations

import contextvars
import json
import logging
import os
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import temporalio.client
from temporalio import activity, workflow
from temporalio.worker import ActivityInboundInterceptor, ExecuteActivityInput, Interceptor

from corral.names import ACTIVITY_EXECUTE, ACTIVITY_MCP_CALL_TOOL

if TYPE_CHECKING:
    from temporalio.runtime import Runtime

ENV_METRICS_ADDRESS = "CORRAL_METRICS_ADDRESS"
ENV_LOG_FORMAT = "CORRAL_LOG_FORMAT"
OTLP_ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
"""The OpenTelemetry SDK's own variables; the exporter reads them (and `OTEL_EXPORTER_OTLP_HEADERS`, ...) itself."""

HUMAN_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

session_id_var: contextvars.ContextVar[str | None] = contextvars.ContextVar("corral_session_id", default=None)
"""The session a gateway request is about (set by its middleware): the JSON log lines of the request carry it."""


@dataclass
class Telemetry:
    """What `setup` made for this process: the client interceptors and the runtime every `connect` uses."""

    service: str
    tracing: bool = False
    json_logs: bool = False
    metrics_address: str | None = None
    interceptors: list[temporalio.client.Interceptor] = field(default_factory=list)
    runtime: Runtime | None = None


_current: Telemetry | None = None


def setup(service: str, environ: Mapping[str, str] | None = None) -> Telemetry:
    """Set up this process's logs, traces and metrics from the environment, once (a second call returns the first
    one's). Call it before the first `corral.temporal.connect`: the clients made after it are traced and metered."""
    global _current
    if _current is not None:
        return _current
    env = os.environ if environ is None else environ
    log_format = env.get(ENV_LOG_FORMAT, "")
    setup_logging(log_format)
    telemetry = Telemetry(service, json_logs=_is_json(log_format))
    if any(env.get(name) for name in OTLP_ENDPOINT_VARIABLES):
        telemetry.interceptors.append(_start_tracing(service))
        telemetry.tracing = True
    address = env.get(ENV_METRICS_ADDRESS)
    if address:
        telemetry.runtime = _prometheus_runtime(service, address)
        telemetry.metrics_address = address
        telemetry.interceptors.append(ToolLatencyInterceptor())
    _current = telemetry
    return telemetry


def current() -> Telemetry | None:
    """This process's telemetry, or None when `setup` was not called (a library user, a test, the CLI)."""
    return _current


def tracing_enabled() -> bool:
    return _current is not None and _current.tracing


def _start_tracing(service: str) -> temporalio.client.Interceptor:
    """The global tracer provider, exporting in batches over OTLP/HTTP; the interceptor that uses it. Imported here
    only: a process without an endpoint loads none of the SDK."""
    from opentelemetry import trace
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from temporalio.contrib.opentelemetry import TracingInterceptor

    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))  # endpoint, headers: OTEL_EXPORTER_OTLP_*
    trace.set_tracer_provider(provider)
    return TracingInterceptor(trace.get_tracer("corral"))


def _prometheus_runtime(service: str, address: str) -> Runtime:
    from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

    config = PrometheusConfig(bind_address=address, durations_as_seconds=True)
    return Runtime(telemetry=TelemetryConfig(metrics=config, global_tags={"corral_service": service}))


# ---- corral's own metrics ---------------------------------------------------------------------------------------


class ToolLatencyInterceptor(temporalio.client.Interceptor, Interceptor):
    """Times every tool call a worker runs (`corral_tool_latency`, by hand): the `execute` activity of every hand
    (sandbox, utility, custom hands; the hand is its task queue) and MCP calls through the proxy (hand `mcp`). A
    client interceptor too (one that changes nothing), so that every worker made from the client has it."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _ToolLatency(next)


class _ToolLatency(ActivityInboundInterceptor):
    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = activity.info()
        if info.activity_type not in (ACTIVITY_EXECUTE, ACTIVITY_MCP_CALL_TOOL):
            return await self.next.execute_activity(input)
        hand = "mcp" if info.activity_type == ACTIVITY_MCP_CALL_TOOL else info.task_queue
        started = time.monotonic()
        outcome = "error"
        try:
            result = await self.next.execute_activity(input)
            outcome = "ok"
            return result
        finally:
            activity.metric_meter().create_histogram_timedelta(
                "corral_tool_latency", "Time a tool call took in its hand's worker", "duration"
            ).record(timedelta(seconds=time.monotonic() - started), {"hand": hand, "outcome": outcome})


# ---- logs ---------------------------------------------------------------------------------------------------


def setup_logging(log_format: str | None = None) -> None:
    """The root logger at INFO, as `CORRAL_LOG_FORMAT` says: `json`, one object per line, or the human format."""
    if log_format is None:
        log_format = os.environ.get(ENV_LOG_FORMAT, "")
    if not _is_json(log_format):
        logging.basicConfig(level=logging.INFO, format=HUMAN_LOG_FORMAT)
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    for existing in list(root.handlers):
        root.removeHandler(existing)
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):  # uvicorn's own handlers print the human way
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True


def _is_json(log_format: str) -> bool:
    return log_format.strip().lower() == "json"


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, and what is known of where it was logged (the
    temporalio loggers' `temporal_workflow` / `temporal_activity` extras, the running activity, the gateway
    request's session, the current span)."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        line.update(_where(record))
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def _where(record: logging.LogRecord) -> dict[str, Any]:
    where: dict[str, Any] = {}
    in_workflow: Mapping[str, Any] | None = getattr(record, "temporal_workflow", None)
    in_activity: Mapping[str, Any] | None = getattr(record, "temporal_activity", None)
    if in_activity is None and activity.in_activity():  # a module's own logger, called inside an activity
        info = activity.info()
        in_activity = {"activity_type": info.activity_type, "workflow_id": info.workflow_id,
                       "attempt": info.attempt}  # fmt: skip
    if in_workflow:
        where["session_id"] = in_workflow.get("workflow_id")
        where["workflow_type"] = in_workflow.get("workflow_type")
        where["run_id"] = in_workflow.get("run_id")
        if workflow.in_workflow():  # logged from workflow code: the position in its history
            where["history_length"] = workflow.info().get_current_history_length()
    elif in_activity:
        where["session_id"] = in_activity.get("workflow_id")
        where["activity_type"] = in_activity.get("activity_type")
        where["attempt"] = in_activity.get("attempt")
    else:
        session = session_id_var.get()
        if session is not None:
            where["session_id"] = session
    if tracing_enabled():
        from opentelemetry import trace

        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            where["trace_id"] = format(context.trace_id, "032x")
            where["span_id"] = format(context.span_id, "016x")
    return {key: value for key, value in where.items() if value is not None}
