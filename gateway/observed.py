"""Each HTTP request observed: an OpenTelemetry server span (with tracing on), and its session id for the JSON log
lines. Added to the app only when `corral.telemetry` is set up for traces or JSON logs."""

from __future__ import annotations

import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from corral import telemetry

_SESSION_PATH = re.compile(r"^/v1/sessions/([^/]+)")
_TRACE_HEADERS = (b"traceparent", b"tracestate", b"baggage")


class ObservedRequests:
    """Each HTTP request as an OpenTelemetry server span (with tracing on) whose context the handler's Temporal
    calls inherit, so a session's trace starts at the request that made it; and the request's session id for the
    JSON log lines. The span has the method, route, path and status, never a header (API keys) or a body."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        session = _SESSION_PATH.match(scope["path"])
        token = telemetry.session_id_var.set(session[1] if session else None)
        try:
            if telemetry.tracing_enabled():
                await self._traced(scope, receive, send)
            else:
                await self.app(scope, receive, send)
        finally:
            telemetry.session_id_var.reset(token)

    async def _traced(self, scope: Scope, receive: Receive, send: Send) -> None:
        from opentelemetry import propagate, trace

        carrier = {name.decode("latin-1"): value.decode("latin-1") for name, value in scope["headers"]
                   if name in _TRACE_HEADERS}  # fmt: skip
        method = scope["method"]
        status: list[int] = []

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                status.append(message["status"])
            await send(message)

        with trace.get_tracer("corral.gateway").start_as_current_span(
            f"{method} {scope['path']}",
            context=propagate.extract(carrier),
            kind=trace.SpanKind.SERVER,
            attributes={"http.request.method": method, "url.path": scope["path"]},
        ) as span:
            await self.app(scope, receive, sending)
            route = getattr(scope.get("route"), "path", None)
            if route is not None:  # the template, as the span's name: `POST /v1/sessions/{id}/events`
                span.update_name(f"{method} {route}")
                span.set_attribute("http.route", route)
            if status:
                span.set_attribute("http.response.status_code", status[0])
                if status[0] >= 500:
                    span.set_status(trace.StatusCode.ERROR)
