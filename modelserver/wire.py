"""How the offline model server's answers go over the wire: Anthropic-shaped errors, the message JSON, and its SSE
frames, paced (first-token latency, tokens per second) and broken off as a script asks.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import anyio
from starlette.responses import JSONResponse, StreamingResponse
from starlette.types import Send

from modelserver.scripts import (
    ApiError,
    Plan,
    PlannedBlock,
    StreamBreak,
    TextBlock,
    content_to_dict,
    split_json_pieces,
    split_text_tokens,
)

MID_STREAM_ERROR = ApiError(529, "overloaded_error", "Overloaded (scripted mid-stream failure)")
MALFORMED_FRAME = b"event: content_block_delta\ndata: {this frame is not JSON\n\n"
STALL_SECONDS = 24 * 3600.0
"""A stalled stream sends nothing for this long: until the client goes away, in practice."""


class BrokenOff(Exception):
    """A scripted stream stops here: `cut` leaves the body unfinished, so the connection drops; else it ends cleanly."""

    def __init__(self, cut: bool) -> None:
        super().__init__("cut" if cut else "end")
        self.cut = cut


class ClosingStreamingResponse(StreamingResponse):
    """A StreamingResponse that always closes its generator, so a disconnect runs its cleanup at once, and that
    can break off as its generator asks (`BrokenOff`)."""

    async def stream_response(self, send: Send) -> None:
        try:
            await super().stream_response(send)
        except BrokenOff as off:
            if not off.cut:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
            # A cut returns with the body unfinished: uvicorn then closes the connection (and logs one line that
            # the response was incomplete), and the client sees a chunked body that never ends.
        finally:
            closer = getattr(self.body_iterator, "aclose", None)
            if closer is not None:
                with anyio.CancelScope(shield=True):
                    await closer()


def error_response(error: ApiError) -> JSONResponse:
    """An Anthropic-shaped error response, with retry-after when the error carries one."""
    headers = {}
    if error.retry_after is not None:
        headers["retry-after"] = f"{error.retry_after:g}"
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


def sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def message_json(plan: Plan, model: str, message_id: str) -> dict[str, Any]:
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [content_to_dict(b) for b in plan.blocks],
        "stop_reason": plan.stop_reason,
        "stop_sequence": None,
        **stop_details(plan),
        "usage": {"output_tokens": plan.output_tokens, **input_usage(plan)},
    }


def input_usage(plan: Plan) -> dict[str, int]:
    return {
        "input_tokens": plan.input_tokens,
        "cache_read_input_tokens": plan.cache_read_input_tokens,
        "cache_creation_input_tokens": plan.cache_creation_input_tokens,
    }


def block_deltas(block: PlannedBlock) -> list[dict[str, Any]]:
    """The content deltas that stream one block: word-ish text chunks or partial JSON pieces."""
    if isinstance(block, TextBlock):
        return [{"type": "text_delta", "text": t} for t in split_text_tokens(block.text)]
    return [{"type": "input_json_delta", "partial_json": p} for p in split_json_pieces(block.input)]


class Pacer:
    """Sleeps first-token latency before the first delta and 1/tps between later ones."""

    def __init__(self, first_token_latency: float, tokens_per_second: float) -> None:
        self.first_token_latency = first_token_latency
        self.gap = 1.0 / tokens_per_second if tokens_per_second > 0 else 0.0
        self.started = False

    async def tick(self) -> None:
        delay = self.gap if self.started else self.first_token_latency
        self.started = True
        if delay > 0:
            await asyncio.sleep(delay)


async def break_frames(how: StreamBreak) -> AsyncIterator[bytes]:
    """The frames of a scripted break: a frame that is not JSON, or a stall; a cut or an early end stops the stream."""
    if how.kind == "malformed":
        yield MALFORMED_FRAME
    elif how.kind == "stall":
        await asyncio.sleep(STALL_SECONDS)  # cancelled when the client goes away
    else:
        raise BrokenOff(cut=how.kind == "cut")


def stop_details(plan: Plan) -> dict[str, Any]:
    """A refusal's `stop_details` (the Messages API's); other responses carry none."""
    return {} if plan.stop_details is None else {"stop_details": plan.stop_details}
