"""Overload: what corral does at 2x and at 10x its capacity, shown on the stack `bench.capacity` measures.

Capacity is `bench.capacity`'s: the fewest sessions, each turning back to back, at which a turn's TTFT p50 reaches
twice one session's alone. It is measured first, in the same run, by the same stepping (corral's arm only), or taken
from `--capacity N`. Then for each level of `--levels` (default 2 and 10), level x capacity sessions are opened and
all send their turns at once, each `--turns` turns back to back (the capacity benchmark's turn: a streamed preamble,
one `calculate` tool call, an answer). For each level the report gives:

  - turns completed per second, and TTFT p50 / p95 / p99 as a ratio of one session alone (capacity's first step,
    in the same run); a session's first turn is left out of the TTFT figures, as in `bench.capacity`;
  - lost and duplicated events (each session's whole log, `bench.load`'s checks), workflow tasks and activities
    timed out on schedule-to-start or start-to-close and activities started again (each session's history,
    `bench._load_accounting`), turns that failed, and sends Temporal refused that the client sent again;
  - what a waiting user sees, sampled while the level runs with the functions `corral status` and the API's
    `waiting` call (`corral.queues`): each queue's largest backlog and oldest task, and for a few sessions the
    longest a task of theirs waited, with the tasks ahead of it;
  - whether turns were served in order (`bench._overload_watch.served_in_order`): of the pairs of turns that waited
    at once, sent more than one alone-TTFT apart, the share whose later-sent turn got its first token first.

    python -m bench.overload                 # capacity measured, then 2x and 10x of it, 3 turns per session
    python -m bench.overload --capacity 32   # capacity taken as given (one session alone is still measured)
    python -m bench.overload --quick         # capacity from steps 1, 4, 8 of 6 s; 2 turns: a smoke run

Why a script of its own rather than `bench.capacity --overload`: capacity compares corral with a peer, step by
step; this runs corral alone, past the capacity, and reads what capacity does not (histories, queues, order). It
reuses capacity's arm, stepping and turn, and the load benchmark's stack and accounting. No goal is asserted.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import uuid
from collections import Counter
from pathlib import Path

from bench._capacity_arms import Step, corral_step
from bench._load_accounting import ROUTED_FALLBACK, Checked, check_history
from bench._load_clients import Load, Session
from bench._load_stack import add_stack_options, corral_stack, register_script
from bench._overload_report import Level, report, summary
from bench._overload_watch import WATCHED, WaitSeen, Watch, sample_until, served_in_order
from bench._report import ROOT, add_run_options, begin_run, write_results
from bench.capacity import Arm, add_step_options, advance, step_up, warm_up
from bench.load import script
from corral.names import UTILITY_HAND_TASK_QUEUE

__all__ = ["ROOT", "ROUTED_FALLBACK", "Arm", "Checked", "Level", "Step", "WaitSeen", "Watch", "main", "report",
           "served_in_order", "summary", "watched_indices"]  # fmt: skip
"""What the tests read: the judgements of the package's private modules, named here once."""


def watched_indices(sessions: int, count: int = WATCHED) -> set[int]:
    """Sessions spread over the level: the first opened, the last, and evenly between."""
    if sessions <= count:
        return set(range(sessions))
    return {round(k * (sessions - 1) / (count - 1)) for k in range(count)}


async def run_level(load: Load, factor: float, sessions: int, args: argparse.Namespace, slack: float) -> Level:
    """`sessions` sessions turning at once, watched; then their logs and histories read."""
    mark = len(load.sessions)
    config = load.config
    seen = Watch(
        {config.harness_queue: "workflow", config.model_queue: "activity", UTILITY_HAND_TASK_QUEUE: "activity"}
    )
    picks = watched_indices(sessions)

    def watched() -> list[tuple[int, str]]:
        return [(s.index, s.id) for s in load.sessions[mark:] if s.index in picks]

    resent = Counter(load.rpc_errors.seen)
    stop = asyncio.Event()
    sampler = asyncio.create_task(sample_until(load.client, seen, watched, stop, args.sample_every))
    try:
        step = await corral_step(load, sessions, 0.0, args.turns)
    finally:
        stop.set()
        await sampler
    made = load.sessions[mark:]
    checked = Checked()
    gate = asyncio.Semaphore(16)

    async def history(session: Session) -> None:
        async with gate:
            await check_history(checked, load, session)

    await asyncio.gather(*(history(session) for session in made))
    turns = [(t.ended - t.latency, t.ended - t.latency + t.ttft) for s in made for t in s.turns if t.ttft is not None]
    return Level(factor, step, checked, seen, served_in_order(turns, slack),
                 Counter(load.rpc_errors.seen) - resent)  # fmt: skip


async def measure(args: argparse.Namespace) -> tuple[Arm, int, str, list[Level]]:
    """Capacity (measured, or given with one session alone measured), then every level; returns the capacity arm, the
    capacity used, how it was found, and the levels."""
    log_dir = Path(tempfile.mkdtemp(prefix="corral-bench-overload-"))
    arm = Arm("corral")
    levels: list[Level] = []
    async with corral_stack(args, log_dir) as (load, model_url):
        load.scripts[False] = f"overload-{uuid.uuid4().hex[:8]}"
        await register_script(model_url, load.scripts[False], script(False))
        print(f"stack up (logs in {log_dir}); warming up", flush=True)
        await warm_up(load, None, args)
        if args.capacity is None:
            await step_up(load, None, [arm], args)
        else:
            await advance(load, None, arm, 1, args)
        capacity, found = chosen_capacity(arm, args)
        print(f"capacity: {capacity} sessions ({found})", flush=True)
        slack = arm.baseline.p50
        for factor in args.levels:
            sessions = max(1, round(factor * capacity))
            print(f"{factor:g}x capacity: {sessions} sessions x {args.turns} turns", flush=True)
            levels.append(await run_level(load, factor, sessions, args, slack))
            print(f"  {levels[-1].line(arm)}", flush=True)
    return arm, capacity, found, levels


def chosen_capacity(arm: Arm, args: argparse.Namespace) -> tuple[int, str]:
    if args.capacity is not None:
        return args.capacity, "given with --capacity"
    if arm.capacity is not None:
        return arm.capacity, f"measured: TTFT p50 {args.threshold:g}x alone at {arm.capacity} sessions"
    return arm.below, f"not reached ({arm.stopped}): the most sessions measured, a lower bound"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capacity", type=int, help="sessions at 2x, taken as given (default: measured)")
    parser.add_argument("--levels", default="2,10", help="multiples of the capacity to run (default 2,10)")
    parser.add_argument("--turns", type=int, default=3, help="turns each session does at a level (default 3)")
    add_step_options(parser, "1,8,16,32,64", step_seconds=10.0, refine=2)
    parser.add_argument("--sample-every", type=float, default=1.0, help="seconds between samples (default 1)")
    add_stack_options(parser)
    parser.add_argument("--output", default="overload", help="results file name in bench/results/ (default overload)")
    parser.add_argument("--quick", action="store_true", help="capacity from steps 1, 4, 8 of 6 s, 2 turns: a smoke run")
    add_run_options(parser)
    args = parser.parse_args()
    if args.quick:
        args.steps, args.step_seconds, args.min_turns, args.refine, args.turns = "1,4,8", 6.0, 2, 0, 2
        args.output = "overload-quick" if args.output == "overload" else args.output  # keep the full run's results
    try:
        args.steps = sorted({int(part) for part in args.steps.split(",")})
        args.levels = [float(part) for part in args.levels.split(",")]
    except ValueError:
        parser.error("--steps takes whole numbers and --levels numbers, separated by commas")
    if args.steps[0] != 1 or args.min_turns < 2 or args.turns < 2 or args.threshold <= 1 or args.refine < 0:
        parser.error("--steps must start at 1 (the baseline); --min-turns and --turns at least 2; --threshold above 1")
    if (args.capacity is not None and args.capacity < 1) or any(level <= 0 for level in args.levels):
        parser.error("--capacity must be at least 1 and every level above 0")
    begin_run(args.allow_dirty)
    arm, capacity, found, levels = asyncio.run(measure(args))
    body = report(arm, capacity, found, levels, args)
    print()
    print(body)
    title = "Overload: corral at 2x and 10x its capacity"
    path = write_results(args.output, title, body, summary=summary(arm, capacity, found, levels, args))
    print(f"\nwritten to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
