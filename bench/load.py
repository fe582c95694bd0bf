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
import tempfile
import time
import uuid
from pathlib import Path

from bench import _profile as profile
from bench._load_accounting import account, scan_logs
from bench._load_clients import Load, alone, converse, open_session, run_load
from bench._load_report import report, summary
from bench._load_stack import add_stack_options, corral_stack, register_script
from bench._report import ROOT, add_run_options, begin_run, write_results
from sandbox import ensure_docker_engine, ensure_sandbox_image

COMMAND = "echo run >> /workspace/runs"
"""The sandbox sessions' tool call: one line per run, counted by `bench.recovery.command_runs`."""
PREAMBLE = "Let me work that out with a tool first."
ANSWER = "The tool has answered, and its result is in the log above: that is all this turn needed."
CALLS = {
    False: {"name": "calculate", "input": {"expression": "6*7"}},
    True: {"name": "bash", "input": {"command": COMMAND}},
}


# ---- main ---------------------------------------------------------------------------------------------------


def script(sandbox: bool) -> dict[str, object]:
    """A turn of a utility (False) or a sandbox (True) session: a preamble and one tool call, then an answer."""
    return {"steps": [{"text": PREAMBLE, "tool_uses": [CALLS[sandbox]]}, {"text": ANSWER}], "loop": True}


async def measure(args: argparse.Namespace) -> Load:
    log_dir = Path(tempfile.mkdtemp(prefix="corral-bench-load-"))
    engine = image = None
    if args.sandbox_sessions:
        engine = ensure_docker_engine(ROOT / ".corral")
        image = ensure_sandbox_image(engine, ROOT / ".corral")
    async with corral_stack(args, log_dir, engine=engine, image=image) as (load, model_url):
        kinds = (False, True) if engine is not None else (False,)
        for sandbox in kinds:
            load.scripts[sandbox] = f"load-{uuid.uuid4().hex[:8]}-{'sandbox' if sandbox else 'utility'}"
            await register_script(model_url, load.scripts[sandbox], script(sandbox))
        print(f"stack up (logs in {log_dir}); warming up, then one session alone", flush=True)
        for sandbox in kinds:
            warm = await open_session(load, -2, sandbox)
            await converse(load, warm, 1, time.monotonic())
            load.baseline.append(await alone(load, sandbox))
        await run_load(load)
        print(f"load done in {load.wall:.1f}s; reading every log and history", flush=True)
        await account(load)
    scan_logs(load)
    return load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=200, help="sessions at once (default 200)")
    parser.add_argument("--turns", type=int, default=10, help="turns per session (default 10)")
    parser.add_argument(
        "--sandbox-sessions", type=int, default=None, help="of them, calling bash in a sandbox (default 20; 0: none)"
    )
    add_stack_options(parser)
    parser.add_argument("--output", default="load", help="results file name in bench/results/ (default load)")
    parser.add_argument("--quick", action="store_true", help="20 sessions x 3 turns, 4 with a sandbox: a smoke run")
    parser.add_argument(
        "--profile",
        action="store_true",
        help="sample every Python process with py-spy during the load: flame graphs in the results folder's profile/, "
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
        graphs = ROOT / "bench" / "results" / "profile"
        turns = load.args.sessions * load.args.turns
        names = list(load.python_pids())
        body += "\n\n" + profile.section(names, load.profile_dir, graphs, args.output, load.wall, turns)
    print()
    print(body)
    path = write_results(args.output, "Load: concurrent sessions with tool calls", body, summary=summary(load))
    print(f"\nwritten to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
