"""The live channel beyond one process: two relay processes partitioned by session and two gateway processes, one of
each SIGKILLed mid-reply, and the client sees the reply's live text with no gap and no repeat, and every log event
once. Real processes throughout: the Temporal dev server, `python -m relay` twice, a model worker
(`python -m workers.model`, both relays in `CORRAL_STREAM_URL`) playing a slow offline script, `python -m gateway`
twice (both relays in `--stream-url`), driven by the official `anthropic` SDK."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import anthropic
import pytest

from corral.apikeys import create_key
from corral.records import Records
from relay.partition import relay_order, relay_urls
from tests.chaos._processes import RoleProcess, role_process, temporal_env, until_healthy, worker_argv
from tests.conftest import Stack, unique
from tests.live_previews import relay_then_gateway_killed
from tests.ports import free_port

pytestmark = pytest.mark.timeout(300)

REPLY = " ".join(f"word{n}" for n in range(200))  # ~25 s at 8 words a second: long enough for both faults


@contextlib.contextmanager
def relay_processes(tmp_path: Path) -> Iterator[list[tuple[str, RoleProcess]]]:
    with ExitStack() as stack:
        relays = []
        for index in range(2):
            port = free_port()
            argv = [sys.executable, "-m", "relay", "--host", "127.0.0.1", "--port", str(port)]
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

        async def kill_relay() -> None:
            owner_process.kill()

        async def kill_gateway() -> None:
            gateway_a.kill()

        log = await relay_then_gateway_killed(client_a, client_b, session.id, kill_relay, kill_gateway, within=60)
    [message] = [event for event in log if event.type == "agent.message"]
    assert "".join(getattr(block, "text", "") for block in message.content) == REPLY
    await client_a.close()
    await client_b.close()
