"""Starlette app for the offline model server: Messages-API routes, auth, script admin and paced SSE.

The HTTP layer only encodes plans made by `scripts`/`demo`, so behaviour stays deterministic and testable; how a
plan is written on the wire (JSON, SSE frames, pacing, breaks) is `modelserver/wire.py`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import math
import uuid
from collections.abc import AsyncIterator
from typing import Any

from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from modelserver.cache import PromptCache
from modelserver.demo import plan_demo
from modelserver.scripts import (
    ApiError,
    Plan,
    Script,
    ScriptBook,
    TextBlock,
    content_to_dict,
    estimate_input_tokens,
    is_summary_request,
    plan_summary,
    prompt_too_long,
    script_name_of,
)
from modelserver.wire import (
    MID_STREAM_ERROR,
    BrokenOff,
    ClosingStreamingResponse,
    Pacer,
    block_deltas,
    break_frames,
    error_response,
    input_usage,
    message_json,
    sse,
    stop_details,
)

logger = logging.getLogger("modelserver")

STAND_IN_MODEL_ID = "corral-offline-stand-in"


class RequestIdMiddleware:
    """Adds a `request-id` header to every response, as the real API does, so clients can log it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = f"req_{uuid.uuid4().hex[:24]}".encode()

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", []))
                if not any(k.lower() == b"request-id" for k, _ in headers):
                    headers.append((b"request-id", request_id))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_id)


STAND_IN_MAX_INPUT_TOKENS = 200_000


def _invalid(message: str) -> JSONResponse:
    return error_response(ApiError(400, "invalid_request_error", message))


def auth_scheme(request: Request) -> str | None:
    """Which credential style the client used ("x-api-key" or "bearer"), or None if it sent no key."""
    if request.headers.get("x-api-key", "").strip():
        return "x-api-key"
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return "bearer"
    return None


def _unauthenticated() -> JSONResponse:
    return error_response(
        ApiError(
            401,
            "authentication_error",
            "missing API key: send `x-api-key: KEY` or `Authorization: Bearer KEY` "
            "(any non-empty key is accepted by the corral offline stand-in)",
        )
    )


def validate_message_request(body: Any) -> str | None:
    """A clear complaint about the request body, or None if it is good enough to answer."""
    if not isinstance(body, dict):
        return "request body must be a JSON object"
    model = body.get("model")
    if not isinstance(model, str) or not model:
        return "model: field required (a non-empty string)"
    max_tokens = body.get("max_tokens")
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        return "max_tokens: field required (an integer >= 1)"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        return "messages: field required (a non-empty list)"
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            return f"messages.{i}: must be an object"
        if message.get("role") not in ("user", "assistant"):
            return f"messages.{i}.role: must be 'user' or 'assistant'"
        if not isinstance(message.get("content"), str | list):
            return f"messages.{i}.content: must be a string or a list of content blocks"
    if "stream" in body and not isinstance(body["stream"], bool):
        return "stream: must be a boolean"
    return None


class ModelServer:
    """Holds options, scripts and stream statistics for one app instance."""

    def __init__(self, book: ScriptBook, first_token_latency: float, tokens_per_second: float) -> None:
        self.book = book
        self.first_token_latency = first_token_latency
        self.tokens_per_second = tokens_per_second
        self.stats = {"active_streams": 0, "completed_streams": 0, "cancelled_streams": 0}
        self.cache = PromptCache()

    def _pacer(self, plan: Plan) -> Pacer:
        ftl = plan.first_token_latency if plan.first_token_latency is not None else self.first_token_latency
        tps = plan.tokens_per_second if plan.tokens_per_second is not None else self.tokens_per_second
        return Pacer(ftl, tps)

    async def messages(self, request: Request) -> Response:
        auth = auth_scheme(request)
        if auth is None:
            return _unauthenticated()
        try:
            body = json.loads(await request.body())
        except ValueError as exc:
            return _invalid(f"request body is not valid JSON: {exc}")
        problem = validate_message_request(body)
        if problem is not None:
            return _invalid(problem)

        name = script_name_of(body["model"])
        if name is None:  # the stand-in has the window of the Claude models it stands in for
            demo = plan_summary(body) if is_summary_request(body) else plan_demo(body)
            outcome = prompt_too_long(body, STAND_IN_MAX_INPUT_TOKENS) or demo
        else:
            outcome = self.book.play(name, body, auth)
        if isinstance(outcome, ApiError):
            return error_response(outcome)
        cached = self.cache.account(body, outcome.input_tokens)
        outcome = dataclasses.replace(
            outcome,
            input_tokens=cached.input_tokens,
            cache_read_input_tokens=cached.cache_read_input_tokens,
            cache_creation_input_tokens=cached.cache_creation_input_tokens,
        )

        message_id = f"msg_{uuid.uuid4().hex[:24]}"
        if body.get("stream"):
            return ClosingStreamingResponse(
                self._stream(outcome, body["model"], message_id),
                media_type="text/event-stream",
                headers={"cache-control": "no-cache"},
            )
        if outcome.fail_mid_stream or outcome.stream_break is not None:
            return error_response(MID_STREAM_ERROR)
        pacer = self._pacer(outcome)
        n_deltas = sum(len(block_deltas(b)) for b in outcome.blocks)
        total = pacer.first_token_latency + pacer.gap * max(0, n_deltas - 1)
        if total > 0:
            await asyncio.sleep(total)
        return JSONResponse(message_json(outcome, body["model"], message_id))

    async def _stream(self, plan: Plan, model: str, message_id: str) -> AsyncIterator[bytes]:
        self.stats["active_streams"] += 1
        finished = False
        try:
            start = message_json(plan, model, message_id)
            start.update(content=[], stop_reason=None)
            start["usage"] = {"output_tokens": 1, **input_usage(plan)}
            yield sse("message_start", {"type": "message_start", "message": start})
            yield sse("ping", {"type": "ping"})

            pacer = self._pacer(plan)
            pending = plan.stream_break
            sent = 0
            blocks = plan.blocks[:1] if plan.fail_mid_stream else plan.blocks
            for index, block in enumerate(blocks):
                shell: dict[str, Any] = content_to_dict(block)
                if isinstance(block, TextBlock):
                    shell["text"] = ""
                else:
                    shell["input"] = {}
                yield sse(
                    "content_block_start",
                    {"type": "content_block_start", "index": index, "content_block": shell},
                )
                deltas = block_deltas(block)
                if plan.fail_mid_stream:
                    deltas = deltas[: math.ceil(len(deltas) / 2)]
                for delta in deltas:
                    if pending is not None and sent == pending.after_deltas:
                        async for frame in break_frames(pending):
                            yield frame
                        pending = None
                    await pacer.tick()
                    yield sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
                    sent += 1
                if not plan.fail_mid_stream:
                    yield sse("content_block_stop", {"type": "content_block_stop", "index": index})
            if pending is not None:  # due after more deltas than the answer has: before its end
                async for frame in break_frames(pending):
                    yield frame

            if plan.fail_mid_stream:
                # Break off mid-generation, as an overloaded API does, so clients exercise their error path.
                yield sse("error", MID_STREAM_ERROR.body())
                finished = True
                return
            if not pacer.started:
                await pacer.tick()
            yield sse(
                "message_delta",
                {
                    "type": "message_delta",
                    "delta": {"stop_reason": plan.stop_reason, "stop_sequence": None, **stop_details(plan)},
                    "usage": {"output_tokens": plan.output_tokens},
                },
            )
            yield sse("message_stop", {"type": "message_stop"})
            finished = True
        except BrokenOff:
            finished = True  # the server sent all it meant to
            raise
        finally:
            self.stats["active_streams"] -= 1
            self.stats["completed_streams" if finished else "cancelled_streams"] += 1
            if not finished:
                logger.info("client went away mid-stream for %s; generation stopped", message_id)

    async def count_tokens(self, request: Request) -> Response:
        if auth_scheme(request) is None:
            return _unauthenticated()
        try:
            body = json.loads(await request.body())
        except ValueError as exc:
            return _invalid(f"request body is not valid JSON: {exc}")
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list):
            return _invalid("messages: field required (a list)")
        return JSONResponse({"input_tokens": estimate_input_tokens(body)})

    async def models(self, request: Request) -> Response:
        if auth_scheme(request) is None:
            return _unauthenticated()
        ids = [STAND_IN_MODEL_ID] + [f"script:{n}" for n in self.book.names()]
        data = [
            {
                "type": "model",
                "id": model_id,
                "display_name": f"{model_id} (corral offline stand-in, not a real model)",
                "created_at": "2025-01-01T00:00:00Z",
                "lifecycle": "active",
            }
            for model_id in ids
        ]
        return JSONResponse({"data": data, "has_more": False, "first_id": ids[0], "last_id": ids[-1]})

    async def healthz(self, request: Request) -> Response:
        return JSONResponse({"ok": True, "stand_in": True})

    async def stats_route(self, request: Request) -> Response:
        return JSONResponse(dict(self.stats))

    async def put_script(self, request: Request) -> Response:
        name = request.path_params["name"]
        try:
            raw = json.loads(await request.body())
        except ValueError as exc:
            return _invalid(f"script {name}: body is not valid JSON: {exc}")
        try:
            script = Script.model_validate(raw)
        except ValidationError as exc:
            details = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or '(body)'}: {err['msg']}" for err in exc.errors()
            )
            return _invalid(f"script {name} is invalid: {details}")
        self.book.register(name, script)
        return JSONResponse({"name": name, "steps": len(script.steps), "loop": script.loop})

    async def script_requests(self, request: Request) -> Response:
        name = request.path_params["name"]
        log = self.book.requests_for(name)
        if log is None:
            return error_response(ApiError(404, "not_found_error", f"no script named {name!r} is registered"))
        return JSONResponse(log)

    async def delete_script(self, request: Request) -> Response:
        name = request.path_params["name"]
        if not self.book.delete(name):
            return error_response(ApiError(404, "not_found_error", f"no script named {name!r} is registered"))
        return JSONResponse({"deleted": name})


def create_app(
    *, first_token_latency: float = 0.0, tokens_per_second: float = 0.0, book: ScriptBook | None = None
) -> Starlette:
    """Build the ASGI app; `book` lets in-process callers register scripts without HTTP."""
    server = ModelServer(book or ScriptBook(), first_token_latency, tokens_per_second)
    routes = [
        Route("/v1/messages", server.messages, methods=["POST"]),
        Route("/v1/messages/count_tokens", server.count_tokens, methods=["POST"]),
        Route("/v1/models", server.models, methods=["GET"]),
        Route("/healthz", server.healthz, methods=["GET"]),
        Route("/_corral/stats", server.stats_route, methods=["GET"]),
        Route("/_corral/scripts/{name}", server.put_script, methods=["PUT"]),
        Route("/_corral/scripts/{name}", server.delete_script, methods=["DELETE"]),
        Route("/_corral/scripts/{name}/requests", server.script_requests, methods=["GET"]),
    ]
    app = Starlette(routes=routes)
    app.add_middleware(RequestIdMiddleware)
    app.state.model_server = server
    app.state.book = server.book
    return app
