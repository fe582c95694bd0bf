"""Live token streaming: model text reaches clients while a turn runs, without touching workflow history.

A model worker publishes each attempt's deltas to a small relay (the *stream hub*) and clients subscribe to it.
The channel is plain HTTP — NDJSON request bodies in, Server-Sent Events out — because it must cross machines
(the model worker and the client may be far apart) yet needs no infrastructure beyond one small process: no
broker, no database, nothing to install that corral does not already ship (starlette, uvicorn, httpx), and SSE
passes proxies and is readable with `curl`. Deltas are ephemeral and held only in the relay's memory; the
durable record of each turn stays the `agent.message` in the session's history, so losing the relay costs the
live view and nothing else. The relay absorbs Temporal retries: a retried attempt never shows a second copy.
"""

from corral.streaming.app import create_stream_app
from corral.streaming.client import AttemptStream, StreamPublisher, subscribe
from corral.streaming.errors import (
    InvalidRecordError,
    InvalidSinceError,
    StreamAuthError,
    StreamError,
    StreamRelayError,
)
from corral.streaming.hub import StreamHub, Subscription
from corral.streaming.protocol import (
    DeltaRecord,
    EndRecord,
    PublishRecord,
    StartRecord,
    StreamEvent,
    StreamMessage,
)
from corral.streaming.server import StreamRelayThread

__all__ = [
    "AttemptStream",
    "DeltaRecord",
    "EndRecord",
    "InvalidRecordError",
    "InvalidSinceError",
    "PublishRecord",
    "StartRecord",
    "StreamAuthError",
    "StreamError",
    "StreamEvent",
    "StreamHub",
    "StreamMessage",
    "StreamPublisher",
    "StreamRelayError",
    "StreamRelayThread",
    "Subscription",
    "create_stream_app",
    "subscribe",
]
