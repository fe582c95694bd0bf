"""The load benchmarks' stack, as `corral up` runs it, each part a process of its own: the Temporal dev server (in
memory), the offline model server, the stream relay and one worker process per role. Shared by `bench.load` and
`bench.capacity`, so that both measure the same stack."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import docker
import httpx
from temporalio.client import Client

from activities.sandbox import engine_task_queue
from bench._load_clients import Load, RpcErrors, Session
from bench._report import child_pid
from bench._stack import free_port
from bench._workers import (
    WorkerConfig,
    WorkerProcess,
    spawn_server,
    spawn_worker,
    wait_until_healthy,
    wait_until_polling,
)
from corral.temporal import start_local_temporal
from relay import StreamPublisher
from sandbox.sessions import SESSION_LABEL, remove_session


def add_stack_options(parser: argparse.ArgumentParser) -> None:
    """The model server's pace and how long a turn may take: `--first-token-latency`, `--tokens-per-second`,
    `--turn-timeout`."""
    parser.add_argument("--first-token-latency", type=float, default=0.3, help="model, seconds (default 0.3)")
    parser.add_argument("--tokens-per-second", type=float, default=50.0, help="model streaming rate (default 50)")
    parser.add_argument("--turn-timeout", type=float, default=600.0, help="seconds a turn may take (default 600)")


@contextlib.contextmanager
def output_to(log: Path) -> Iterator[None]:
    """Point this process's stdout and stderr at `log` while a child process starts, so that the child writes
    there: the SDK starts the Temporal dev server with our own output and has no option to change it."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = [os.dup(1), os.dup(2)]
    with log.open("ab") as out:
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
    try:
        yield
    finally:
        for fd, copy in zip((1, 2), saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)


async def clean_up(load: Load, sessions: Sequence[Session] | None = None) -> None:
    """Terminate the sessions (by default every session made) and remove their sandboxes; counts the containers of
    ours left behind."""
    gate = asyncio.Semaphore(8)
    sessions = load.sessions if sessions is None else sessions

    async def one(session: Session) -> None:
        async with gate:
            if session.listener is not None:
                session.listener.cancel()
            with contextlib.suppress(Exception):  # already closed
                await session.handle.terminate("load benchmark done")
            if session.sandbox and load.engine is not None:
                await asyncio.to_thread(remove_session, load.engine, session.id, True)

    await asyncio.gather(*(one(session) for session in sessions))
    if load.engine is not None:
        ours = {session.id for session in sessions}
        left = await asyncio.to_thread(load.engine.containers.list, all=True, filters={"label": SESSION_LABEL})
        load.checked.containers_left = sum(1 for c in left if c.labels.get(SESSION_LABEL) in ours)


async def register_script(model_url: str, name: str, script: dict[str, object]) -> None:
    """Give the model server a script under `name` (a session's model is then `script:<name>`)."""
    async with httpx.AsyncClient() as http:
        (await http.put(f"{model_url}/_corral/scripts/{name}", json=script)).raise_for_status()


@contextlib.asynccontextmanager
async def corral_stack(
    args: argparse.Namespace,
    log_dir: Path,
    *,
    engine: docker.DockerClient | None = None,
    image: str | None = None,
) -> AsyncIterator[tuple[Load, str]]:
    """The stack up and every worker polling; yields the run's `Load` and the model server's URL. On the way out
    every session is terminated and every process stopped. The model server paces its stream by
    `args.first_token_latency` and `args.tokens_per_second`; the sandbox role runs when `engine` is given."""
    paced = [f"--first-token-latency={args.first_token_latency}", f"--tokens-per-second={args.tokens_per_second}"]
    model_server, model_url = spawn_server("modelserver", "model-server", log_dir, *paced, "--log-level=warning")
    relay, relay_url = spawn_server("relay", "stream-relay", log_dir, "--log-level=warning")
    metrics_port = free_port(set())
    with output_to(log_dir / "temporal.log"):
        env = await start_local_temporal(
            dev_server_log_level="warn", dev_server_extra_args=["--metrics-port", str(metrics_port)]
        )
    rpc_errors = RpcErrors()
    client = Client(
        env.client.service_client,
        namespace=env.client.namespace,
        data_converter=env.client.data_converter,
        interceptors=[rpc_errors],
    )
    engine_queue = engine_task_queue(engine) if engine is not None else None
    config = WorkerConfig.fresh(
        env.client, log_dir, model_url=model_url, stream_url=relay_url, image=image, engine_queue=engine_queue
    )
    roles = ["harness", "model", "utility"] + (["sandbox"] if engine is not None else [])
    workers = {f"{role} worker": spawn_worker(config, (role,), role) for role in roles}
    processes: dict[str, WorkerProcess | int] = {**workers, "model server": model_server, "stream relay": relay}
    temporal = child_pid("temporal")
    if temporal is not None:
        processes["Temporal dev server"] = temporal
    load = Load(args, client, config, relay_url, StreamPublisher(relay_url), engine, processes, rpc_errors)
    load.logs = {name: process.log for name, process in processes.items() if isinstance(process, WorkerProcess)}
    load.logs["Temporal dev server"] = log_dir / "temporal.log"
    load.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    if getattr(args, "profile", False):
        load.profile_dir = log_dir / "profile"
    try:
        for server, url in ((model_server, model_url), (relay, relay_url)):
            await wait_until_healthy(server, url)
        for worker in workers.values():
            await wait_until_polling(client, config, worker)
        yield load, model_url
    finally:
        with contextlib.suppress(Exception):
            await clean_up(load)
        await load.publisher.aclose()
        for worker in workers.values():
            worker.stop()
        await env.shutdown()
        relay.stop()
        model_server.stop()
