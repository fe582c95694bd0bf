"""Webhook delivery latency: from an event emitted (`Webhooks.emit`) to its arrival at a receiver, on the stack
`corral up` starts (its harness worker runs the delivery workflow, its proxy worker signs with the secret from its
OpenBao and POSTs), beside the same signed POST sent directly from this process, in one run, as ratios.

The direct POST is the floor: the same body, signed the same way (`proxy.signed_request`), to the same receiver.
corral adds a database read of the subscribers, a workflow start, a workflow task on the harness, an activity on
the proxy (an endpoint lookup, a Vault read, the deliveries table's writes) and the POST. Each rate runs both arms,
one after the other, each event started on its own schedule (1 and 50 a second), so a slow one never delays the
next. The receiver is in this process and stamps each arrival on the clock that stamped the emit. Every delivery is
verified with the SDK (`client.beta.webhooks.unwrap`) after the run. Run from the repository root:

    python -m bench.webhooks [--slow-events 30] [--fast-events 500] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from datetime import datetime
from typing import Any

import anthropic
import httpx
from pydantic import SecretStr
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from bench import _stack
from bench._report import add_run_options, begin_run, markdown_table, percentile, write_results
from corral.knowledge_db import open_knowledge_db
from corral.serving import ServerThread
from corral.temporal import connect
from corral.webhook_deliveries import WebhookDeliveries
from corral.webhooks import WebhookEndpoints, Webhooks, webhook_event, webhook_event_id
from proxy import signed_request

WORKSPACE = "bench-webhooks"


class Receiver:
    """Stamps each arrival (by `webhook-id`) and answers 204; keeps bodies and headers to verify afterwards."""

    def __init__(self) -> None:
        self.arrived: dict[str, float] = {}
        self.kept: list[tuple[str, dict[str, str]]] = []
        self.server = ServerThread(Starlette(routes=[Route("/{path:path}", self.handle, methods=["POST"])]),
                                   name="bench-receiver")  # fmt: skip

    async def handle(self, request: Request) -> Response:
        body = await request.body()
        webhook_id = request.headers.get("webhook-id", "")
        self.arrived.setdefault(webhook_id, time.perf_counter())
        self.kept.append((body.decode(), dict(request.headers)))
        return Response(status_code=204)


async def run_arm(send: Any, rate: float, count: int, receiver: Receiver) -> tuple[list[float], list[float]]:
    """Start `count` sends `rate` a second (each on its own schedule); each one's latency to its arrival, and to the
    send's return (for corral: the emit, a database read and a workflow start), in seconds."""
    started: dict[str, float] = {}
    returned: dict[str, float] = {}
    tasks = []

    async def timed(event_id: str) -> None:
        await send(event_id)
        returned[event_id] = time.perf_counter()

    origin = time.perf_counter()
    for i in range(count):
        delay = origin + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        event_id = webhook_event_id()
        started[event_id] = time.perf_counter()
        tasks.append(asyncio.create_task(timed(event_id)))
    await asyncio.gather(*tasks)
    deadline = time.monotonic() + 300
    while not all(event_id in receiver.arrived for event_id in started):
        if time.monotonic() > deadline:
            missing = sum(event_id not in receiver.arrived for event_id in started)
            raise SystemExit(f"bench: {missing} of {count} deliveries did not arrive within 300 s")
        await asyncio.sleep(0.05)
    return ([receiver.arrived[event_id] - started[event_id] for event_id in started],
            [returned[event_id] - started[event_id] for event_id in started])  # fmt: skip


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--slow-events", type=int, default=30, help="events sent at 1 a second, per arm")
    parser.add_argument("--fast-events", type=int, default=500, help="events sent at 50 a second, per arm")
    parser.add_argument("--quick", action="store_true", help="10 and 100 events")
    parser.add_argument("--output", default=None, help="results file name in bench/results/")
    add_run_options(parser)
    args = parser.parse_args()
    if args.quick:
        args.slow_events, args.fast_events = 10, 100
    output = args.output or ("webhooks-quick" if args.quick else "webhooks")
    begin_run(args.allow_dirty)
    receiver = Receiver()
    receiver_url = receiver.server.start()
    stack = _stack.up()
    results: dict[tuple[float, str], list[float]] = {}
    sent: dict[tuple[float, str], list[float]] = {}
    emitted: dict[str, tuple[float, datetime]] = {}
    """Each corral event's rate, and when it was made (its `created_at`)."""
    phases: dict[float, tuple[list[float], list[float]]] = {}
    """Per rate, from the deliveries table: event to the proxy's first attempt, and that attempt to its answer."""
    rate_now = [0.0]
    try:
        secret = SecretStr(stack.corral("webhook", "add", f"{receiver_url}/corral", "--workspace", WORKSPACE,
                                        "--events", "all").stdout.strip())  # fmt: skip
        client = await connect(f"127.0.0.1:{stack.ports['--temporal-port']}")
        emitter = Webhooks(client, open_knowledge_db(stack.state_dir / "knowledge.db"))
        async with httpx.AsyncClient(timeout=30) as http:

            async def through_corral(event_id: str) -> None:
                event = webhook_event("session.status_idled", "sesn_bench0000000000000000000", WORKSPACE)
                event = event.model_copy(update={"id": event_id})
                emitted[event_id] = (rate_now[0], event.created_at)
                await emitter.emit([event])

            async def direct(event_id: str) -> None:
                event = webhook_event("session.status_idled", "sesn_bench0000000000000000000", WORKSPACE)
                body, headers = signed_request(secret, event_id, event.model_copy(update={"id": event_id}).payload())
                response = await http.post(f"{receiver_url}/direct", content=body, headers=headers)
                response.raise_for_status()

            await run_arm(through_corral, 5, 5, receiver)  # warm-up: workers' caches, connections, the database
            await run_arm(direct, 5, 5, receiver)
            for rate, count in ((1.0, args.slow_events), (50.0, args.fast_events)):
                rate_now[0] = rate
                for arm, send in (("corral", through_corral), ("direct", direct)):
                    results[(rate, arm)], sent[(rate, arm)] = await run_arm(send, rate, count, receiver)
        [endpoint] = WebhookEndpoints(emitter.endpoints.db).in_workspace(WORKSPACE)
        for row in WebhookDeliveries(emitter.endpoints.db).of_endpoint(endpoint.id, None, 100_000):
            rate, made = emitted[row.event_id]
            if rate and row.delivered_at:
                first = datetime.fromisoformat(row.created_at)
                waits, attempts = phases.setdefault(rate, ([], []))
                waits.append((first - made).total_seconds())
                attempts.append((datetime.fromisoformat(row.delivered_at) - first).total_seconds())
    finally:
        _stack.down(stack)
        receiver.server.stop()

    sdk = anthropic.Anthropic(api_key="unused", base_url="http://127.0.0.1:9")
    verified = 0
    for body, headers in receiver.kept:
        sdk.beta.webhooks.unwrap(body, headers=headers, key=secret.get_secret_value())  # raises if one does not verify
        verified += 1

    rows, summary = [], {}
    for rate in (1.0, 50.0):
        corral_p = [percentile(results[(rate, "corral")], f) for f in (0.5, 0.95)]
        direct_p = [percentile(results[(rate, "direct")], f) for f in (0.5, 0.95)]
        ratio = [c / d if d > 0 else float("inf") for c, d in zip(corral_p, direct_p, strict=True)]
        emit_p50 = percentile(sent[(rate, "corral")], 0.5)
        wait_p50, attempt_p50 = (percentile(values, 0.5) for values in phases[rate])
        rows.append([f"{rate:g}/s", len(results[(rate, "corral")]), f"{corral_p[0] * 1000:.0f}",
                     f"{corral_p[1] * 1000:.0f}", f"{emit_p50 * 1000:.0f}", f"{wait_p50 * 1000:.0f}",
                     f"{attempt_p50 * 1000:.0f}", f"{direct_p[0] * 1000:.1f}",
                     f"{direct_p[1] * 1000:.1f}",
                     f"{ratio[0]:.0f}x", f"{ratio[1]:.0f}x"])  # fmt: skip
        summary[f"{rate:g}_per_s"] = {"corral_p50_ms": round(corral_p[0] * 1000, 1),
                                      "corral_p95_ms": round(corral_p[1] * 1000, 1),
                                      "emit_p50_ms": round(emit_p50 * 1000, 1),
                                      "to_first_attempt_p50_ms": round(wait_p50 * 1000, 1),
                                      "attempt_p50_ms": round(attempt_p50 * 1000, 1),
                                      "direct_p50_ms": round(direct_p[0] * 1000, 2),
                                      "direct_p95_ms": round(direct_p[1] * 1000, 2)}  # fmt: skip
    columns = ["rate", "events per arm", "corral p50 ms", "corral p95 ms", "emit returned p50 ms",
               "to the proxy's attempt p50 ms", "the attempt p50 ms", "direct p50 ms", "direct p95 ms", "p50 ratio",
               "p95 ratio"]  # fmt: skip
    body = (
        "Latency from `Webhooks.emit` (an event of the workspace, one subscribed endpoint) to the receiver's arrival "
        "stamp, through the stack `corral up` starts (harness and proxy workers, its OpenBao, the default delivery "
        "policy), vs the same signed POST sent directly from the bench process, at each rate, one arm after the "
        f"other, after a warm-up of 5 each. All {verified} deliveries verified with `client.beta.webhooks.unwrap`.\n\n"
        + markdown_table(columns, rows)
        + "\n\nWhere corral's time goes, from the deliveries table (corral.webhook_deliveries, wall clock): from the "
        "event's `created_at` to the proxy's first attempt (the emit, the workflow's start and first task on the "
        "harness, the activity's dispatch to the proxy), and from that attempt's start to its recorded answer (an "
        "endpoint lookup, a Vault read, the signed POST, the table's writes).\n"
    )
    print(body)
    title = "Webhooks: delivery latency through corral vs a direct signed POST"
    print(f"written to {write_results(output, title, body, summary=summary)}")


if __name__ == "__main__":
    asyncio.run(main())
