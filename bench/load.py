"""Load: many sessions doing turns with tool calls at once on this machine, and every event accounted for.

`--sessions` sessions (default 200) each do `--turns` turns (default 10), all sessions at once, each session's
turns back to back. A turn: the client sends a user message with the `send_events` update (a client id per
message), the scripted model streams a one-line preamble and calls one tool, then answers. Most sessions call the
utility hand's `calculate`; `--sandbox-sessions` of them (default 20) call `bash` in their own Docker sandbox,
with a command that appends a line to `/workspace/runs` (so a command run twice shows).

The stack, as `corral up` runs it: the Temporal dev server (in memory), the offline model server (first token after
`--first-token-latency`, default 0.3 s, then `--tokens-per-second`, default 50) and the stream relay as processes
of their own, and one worker process per role (harness, model, utility hand, sandbox hand) built by
`workers.roles` as shipped. The clients run in this process.

Measured:
  - TTFT per turn at the client: the message sent -> the turn's first text delta from the stream relay
    (`relay.subscribe`, opened before the first message and proven live by a probe record);
  - turn latency as the client sees it: the message sent -> the turn's `session.status_idle` read from the log;
  - both also for one session alone (one utility session, then one sandbox session), measured in the same run
    before the load, so the report prints ratios, not absolute times;
  - throughput (turns and events per second), each process's RSS (before, peak, after) and CPU time per turn.
Then every session's whole log is read and checked: positions 1..N with no gap and no repeat, unique ids, exactly
`--turns` user messages carrying the client ids sent, one tool result per tool use, `--turns` idles ending a turn,
and for sandbox sessions `--turns` lines in the marker file. Whatever does not add up is printed as lost or
duplicated. The histories are read for what went wrong under load (workflow task failures and time-outs, activity
retries), and so are the RPC errors the client met and the workers' log warnings. Every session is terminated and
its sandbox removed at the end.

    python -m bench.load            # 200 sessions x 10 turns, 20 with a sandbox
    python -m bench.load --quick    # 20 sessions x 3 turns, 4 with a sandbox: a smoke run

No goal is asserted: the figures are printed beside the single-session baseline.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
from temporalio.client import Client

from activities.sandbox import engine_task_queue
from bench import _profile as profile
from bench._load_accounting import account, scan_logs
from bench._load_clients import Load, RpcErrors, Session, alone, converse, open_session, run_load
from bench._load_report import report, summary
from bench._report import (
    ROOT,
    add_run_options,
    begin_run,
    child_pid,
    write_results,
)
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
from sandbox import ensure_docker_engine, ensure_sandbox_image
from sandbox.sessions import SESSION_LABEL, remove_session

COMMAND = "echo run >> /workspace/runs"
"""The sandbox sessions' tool call: one line per run, counted by `bench.recovery.command_runs`."""
PREAMBLE = "Let me work that out with a tool first."
ANSWER = "The tool has answered, and its result is in the log above: that is all this turn needed."
CALLS = {
    False: {"name": "calculate", "input": {"expression": "6*7"}},
    True: {"name": "bash", "input": {"command": COMMAND}},
}


# ---- the stack's output, and cleaning up --------------------------------------------------------------------------


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


async def clean_up(load: Load) -> None:
    """Terminate every session made and remove the sandboxes; counts the containers of ours left behind."""
    gate = asyncio.Semaphore(8)

    async def one(session: Session) -> None:
        async with gate:
            if session.listener is not None:
                session.listener.cancel()
            with contextlib.suppress(Exception):  # already closed
                await session.handle.terminate("load benchmark done")
            if session.sandbox and load.engine is not None:
                await asyncio.to_thread(remove_session, load.engine, session.id, True)

    await asyncio.gather(*(one(session) for session in load.sessions))
    if load.engine is not None:
        ours = {session.id for session in load.sessions}
        left = await asyncio.to_thread(load.engine.containers.list, all=True, filters={"label": SESSION_LABEL})
        load.checked.containers_left = sum(1 for c in left if c.labels.get(SESSION_LABEL) in ours)


# ---- main ---------------------------------------------------------------------------------------------------


async def register_script(model_url: str, name: str, sandbox: bool) -> None:
    script = {"steps": [{"text": PREAMBLE, "tool_uses": [CALLS[sandbox]]}, {"text": ANSWER}], "loop": True}
    async with httpx.AsyncClient() as http:
        (await http.put(f"{model_url}/_corral/scripts/{name}", json=script)).raise_for_status()


async def measure(args: argparse.Namespace) -> Load:
    log_dir = Path(tempfile.mkdtemp(prefix="corral-bench-load-"))
    engine = image = None
    if args.sandbox_sessions:
        engine = ensure_docker_engine(ROOT / ".corral")
        image = ensure_sandbox_image(engine, ROOT / ".corral")
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
    if args.profile:
        load.profile_dir = log_dir / "profile"
    try:
        for server, url in ((model_server, model_url), (relay, relay_url)):
            await wait_until_healthy(server, url)
        for worker in workers.values():
            await wait_until_polling(client, config, worker)
        kinds = (False, True) if engine is not None else (False,)
        for sandbox in kinds:
            load.scripts[sandbox] = f"load-{uuid.uuid4().hex[:8]}-{'sandbox' if sandbox else 'utility'}"
            await register_script(model_url, load.scripts[sandbox], sandbox)
        print(f"stack up (logs in {log_dir}); warming up, then one session alone", flush=True)
        for sandbox in kinds:
            warm = await open_session(load, -2, sandbox)
            await converse(load, warm, 1, time.monotonic())
            load.baseline.append(await alone(load, sandbox))
        await run_load(load)
        print(f"load done in {load.wall:.1f}s; reading every log and history", flush=True)
        await account(load)
    finally:
        with contextlib.suppress(Exception):
            await clean_up(load)
        await load.publisher.aclose()
        for worker in workers.values():
            worker.stop()
        await env.shutdown()
        relay.stop()
        model_server.stop()
    scan_logs(load)
    return load


def profiles(load: Load, output: str) -> str:
    """Each process's flame graph, written beside the results, and its hottest frames as a table."""
    assert load.profile_dir is not None
    graphs = ROOT / "bench" / "results" / "profile"
    graphs.mkdir(parents=True, exist_ok=True)
    turns = load.args.sessions * load.args.turns
    sections = [
        "## Where the CPU goes\n\nSampled by py-spy at "
        f"{profile.SAMPLE_RATE} Hz during the load (samples of the thread holding the GIL only). "
        f"ms/turn: samples / rate / {turns} turns; "
        "`self` counts the innermost frame, `inclusive` every frame on the stack. The sampling itself takes CPU, so "
        "the timings above are not comparable with a run without `--profile`."
    ]
    for name in load.python_pids():
        raw = load.profile_dir / f"{profile.slug(name)}.txt"
        if not raw.exists():
            sections.append(f"**{name}**: no profile (py-spy wrote nothing; see {raw.with_suffix('.py-spy.log')})")
            continue
        found = profile.Profile.read(name, raw)
        svg = graphs / f"{output}-{profile.slug(name)}.svg"
        profile.flame_graph(found, svg)
        sections.append(profile.table(found, load.wall, turns) + f"\n\nFlame graph: [{svg.name}](profile/{svg.name})")
    return "\n\n".join(sections)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=200, help="sessions at once (default 200)")
    parser.add_argument("--turns", type=int, default=10, help="turns per session (default 10)")
    parser.add_argument(
        "--sandbox-sessions", type=int, default=None, help="of them, calling bash in a sandbox (default 20; 0: none)"
    )
    parser.add_argument("--first-token-latency", type=float, default=0.3, help="model, seconds (default 0.3)")
    parser.add_argument("--tokens-per-second", type=float, default=50.0, help="model streaming rate (default 50)")
    parser.add_argument("--turn-timeout", type=float, default=600.0, help="seconds a turn may take (default 600)")
    parser.add_argument("--output", default="load", help="results file name in bench/results/ (default load)")
    parser.add_argument("--quick", action="store_true", help="20 sessions x 3 turns, 4 with a sandbox: a smoke run")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="sample every Python process with py-spy during the load: flame graphs in bench/results/profile/, "
        "the hottest frames in the report (the sampling costs CPU: time the figures without it)",
    )
    add_run_options(parser)
    args = parser.parse_args()
    begin_run(args.allow_dirty)
    if args.quick:
        args.sessions, args.turns = 20, 3
        args.output = "load-quick" if args.output == "load" else args.output  # keep the full run's results
    if args.sandbox_sessions is None:
        args.sandbox_sessions = 4 if args.quick else 20
    args.sandbox_sessions = min(args.sandbox_sessions, args.sessions)
    load = asyncio.run(measure(args))
    body = report(load)
    if load.profile_dir is not None:
        body += "\n\n" + profiles(load, args.output)
    print()
    print(body)
    path = write_results(args.output, "Load: concurrent sessions with tool calls", body, summary=summary(load))
    print(f"\nwritten to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
