"""Live token streaming: model text reaches clients while a turn runs, without touching workflow history.

A model worker publishes each attempt's deltas to a small relay (the *stream hub*) and clients subscribe to it.
The channel is plain HTTP — NDJSON request bodies in, Server-Sent Events out — because it must cross machines
(the model worker and the client may be far apart) yet needs no infrastructure beyond one small process: no
broker, no database, nothing to install that corral does not already ship (starlette, uvicorn, httpx), and SSE
passes proxies and is readable with `curl`. Deltas are ephemeral and held only in the relay's memory; the
durable record of each turn stays the `agent.message` in the session's history, so losing the relay costs the
live view and nothing else. The relay absorbs Temporal retries: a retried attempt never shows a second copy.

Beyond one relay (still no broker): `CORRAL_STREAM_URL` / `--stream-url` may list several relays, comma-separated,
the same list for every model worker. Sessions are partitioned over them by rendezvous hashing of the session id
(`partition.relay_order`): every publisher computes the same preference order of the relays for a session, whatever
the order of the list, and removing a relay moves only its own sessions. An attempt publishes to the first relay of
its session's order; if that relay refuses it or the connection breaks, the attempt moves to the next one, sends it
the attempt's whole text so far (kept per block while the attempt runs, bounded like the relay's memory), and goes
on. Subscribers (the gateway, `corral tail`) follow every relay of the list at once and merge what they get
(`merge.LiveMerge`): per span and block the text already shown is kept, and from any relay only text beyond it is
passed on, so a relay catching up after a failover adds just the excess; a `reset` counts from the relay feeding
the span (or announcing a newer attempt); a relay that is down is retried in the background without ending the
stream. Losing a relay therefore costs a pause in the live text, until the publisher's next delta reaches the next
relay; nothing is shown twice and nothing is skipped. With one URL none of this runs: the one-relay path is as
before.
"""

from relay.app import create_stream_app
from relay.client import AttemptStream, StreamPublisher
from relay.errors import (
    InvalidRecordError,
    InvalidSinceError,
    StreamAuthError,
    StreamError,
    StreamRelayError,
)
from relay.hub import StreamHub, Subscription
from relay.merge import LiveMerge
from relay.partition import relay_order, relay_urls
from relay.protocol import (
    DeltaRecord,
    EndRecord,
    PublishRecord,
    StartRecord,
    StreamEvent,
    StreamMessage,
)
from relay.server import StreamRelayThread
from relay.subscriber import subscribe

__all__ = [
    "AttemptStream",
    "DeltaRecord",
    "EndRecord",
    "InvalidRecordError",
    "InvalidSinceError",
    "LiveMerge",
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
    "relay_order",
    "relay_urls",
    "subscribe",
]
