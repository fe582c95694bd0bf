"""The live channel beyond one process: two relay processes partitioned by session and two gateway processes, one of
each SIGKILLed mid-reply, and the client sees the reply's live text with no gap and no repeat, and every log event
once. Real processes throughout: the Temporal dev server, `python -m corral.streaming` twice, a model worker
(`python -m workers.model`, both relays in `CORRAL_STREAM_URL`) playing a slow offline script, `python -m gateway`
twice (both relays in `--stream-url`), driven by the official `anthropic` SDK."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import anthropic
import pytest

from corral.apikeys import create_key
from corral.contract.events import message_id_of
from corral.records import Records
from corral.streaming.partition import relay_order, relay_urls
from tests.chaos._processes import RoleProcess, free_port, role_process, temporal_env, until_healthy, worker_argv
from tests.conftest import Stack, unique
from tests.live_previews import Previews, read_until

pytestmark = pytest.mark.timeout(300)

REPLY = " ".join(f"word{n}" for n in range(200))  # ~25 s at 8 words a second: long enough for both faults
DELTAS_BEFORE_EACH_FAULT = 5


@contextlib.contextmanager
def relay_processes(tmp_path: Path) -> Iterator[list[tuple[str, RoleProcess]]]:
    with ExitStack() as stack:
        relays = []
        for index in range(2):
            port = free_port()
            argv = [sys.executable, "-m", "corral.streaming", "--host", "127.0.0.1", "--port", str(port)]
            relays.append(
                (f"http://127.0.0.1:{port}", stack.enter_context(role_process(f"relay-{index}", argv, tmp_path)))
            )
        yield relays


async def test_a_relay_and_a_gateway_killed_mid_reply_the_client_sees_no_gap_and_no_repeat(
    stack: Stack, tmp_path: Path
) -> None:
    address = stack.client.service_client.config.target_host
    model_queue = unique("model-relays")
    with relay_processes(tmp_path) as relays, ExitStack() as processes:
        for url, relay in relays:
            await until_healthy(url, relay)
        stream_url = ",".join(url for url, _ in relays)
        model_env = temporal_env(address) | {
            "ANTHROPIC_API_KEY": "test-key",  # the offline model server takes any key
            "ANTHROPIC_BASE_URL": str(stack.model_server.base_url),
            "CORRAL_STREAM_URL": stream_url,
            "CORRAL_MODEL_TASK_QUEUE": model_queue,
        }
        processes.enter_context(role_process("model", worker_argv("model"), tmp_path, **model_env))
        gateways: list[tuple[str, RoleProcess]] = []
        for name in ("gateway-a", "gateway-b"):
            port = free_port()
            argv = [sys.executable, "-m", "gateway", "--port", str(port), "--temporal", address,
                    "--harness-queue", stack.harness_queue, "--model-queue", model_queue,
                    "--stream-url", stream_url]  # fmt: skip
            gateway = processes.enter_context(role_process(name, argv, tmp_path))
            gateways.append((f"http://127.0.0.1:{port}", gateway))
        for url, gateway in gateways:
            await until_healthy(url, gateway)
        (url_a, gateway_a), (url_b, _) = gateways

        key, _ = await create_key(Records(stack.client, task_queue=stack.harness_queue), "team-failover")
        client_a = anthropic.AsyncAnthropic(base_url=url_a, api_key=key, max_retries=0)
        client_b = anthropic.AsyncAnthropic(base_url=url_b, api_key=key, max_retries=0)
        model = stack.script([{"text": REPLY, "first_token_latency": 0.3, "tokens_per_second": 8}])
        agent = await client_a.beta.agents.create(name="streamer", model=model)
        environment = await client_a.beta.environments.create(name="plain")
        session = await client_a.beta.sessions.create(agent=agent.id, environment_id=environment.id)
        owner = relay_order(session.id, relay_urls(stream_url))[0]
        owner_process = next(process for url, process in relays if url == owner)

        # Gateway A: the reply starts streaming through the session's relay.
        seen_a: list[Any] = []
        shown_a = Previews()
        stream_a = await client_a.beta.sessions.events.stream(session.id, event_deltas=["agent.message"])
        reading = asyncio.create_task(
            read_until(stream_a, seen_a, shown_a, lambda: shown_a.deltas >= DELTAS_BEFORE_EACH_FAULT)
        )
        await asyncio.sleep(0.3)  # the stream's relay subscriptions are open before the message goes in
        await client_a.beta.sessions.events.send(
            session.id, events=[{"type": "user.message", "content": [{"type": "text", "text": "go"}]}]
        )
        await asyncio.wait_for(reading, 60)
        [preview] = list(shown_a.texts)
        owner_process.kill()  # the relay holding the session's live text, mid-reply
        at_relay_kill = shown_a.text(preview)
        after = shown_a.deltas + DELTAS_BEFORE_EACH_FAULT
        await asyncio.wait_for(read_until(stream_a, seen_a, shown_a, lambda: shown_a.deltas >= after), 60)
        at_gateway_kill = shown_a.text(preview)
        gateway_a.kill()  # and then the gateway the client streams through
        with contextlib.suppress(Exception):  # whatever the SDK makes of a connection that died
            async for event in stream_a:
                seen_a.append(event)
                shown_a.feed(event)
        shown_at_a = shown_a.text(preview)
        assert "agent.message" not in [e.type for e in seen_a], "gateway A died before the reply was written"

        # Gateway B: the client reopens its stream there, then lists what it missed.
        seen_b: list[Any] = []
        shown_b = Previews()
        async with await client_b.beta.sessions.events.stream(session.id, event_deltas=["agent.message"]) as stream_b:
            listed = [event async for event in client_b.beta.sessions.events.list(session.id, limit=1000)]
            await asyncio.wait_for(
                read_until(stream_b, seen_b, shown_b, lambda: seen_b[-1].type == "session.status_idle"), 120
            )
        log = [event async for event in client_b.beta.sessions.events.list(session.id, limit=1000)]

    [message] = [event for event in log if event.type == "agent.message"]
    final = "".join(getattr(block, "text", "") for block in message.content)
    assert final == REPLY
    assert preview == message.id == message_id_of(next(e.id for e in log if e.type == "span.model_request_start"))
    # Through gateway A: the text grew after the relay died (the other relay took over), never repeated a piece.
    assert at_relay_kill and len(at_relay_kill) < len(at_gateway_kill), "no live text after the relay died"
    assert final.startswith(shown_at_a), f"gateway A showed {shown_at_a!r}: not the reply once, in order"
    # Through gateway B: the preview starts over with the text so far, then goes on; it ends as the message.
    assert list(shown_b.texts) == [message.id], "gateway B opened the same preview"
    assert shown_b.text(message.id) == final, "the preview assembled through gateway B is the message"
    assert len(shown_at_a) < len(final), "the reply was still being written when gateway A died"

    # Log events: every one once, in the log's order (the client drops ids it has already seen).
    logged = [event for event in seen_a + listed + seen_b if event.type not in ("event_start", "event_delta")]
    for stream_events in (seen_a, seen_b):
        ids = [e.id for e in stream_events if e.type not in ("event_start", "event_delta")]
        assert len(ids) == len(set(ids)), "a stream sent a log event twice"
    shown_ids: list[str] = []
    for event in logged:
        if event.id not in shown_ids:
            shown_ids.append(event.id)
    assert shown_ids == [event.id for event in log], "the log events seen are the whole log, in order"
    assert log[-1].type == "session.status_idle"
    await client_a.close()
    await client_b.close()
