"""A/B: the load benchmark on two commits, alternated in one run, so that the machine's drift falls on both alike.

On this machine the same code has measured 76 to 93 ms of the Temporal server's CPU per turn from one run to the
next: one run of a change against one run of main says little about a change that moves a figure by 10%. This
runs `bench.load` on BASE (a git worktree of it, made and removed here) and on the checkout (HEAD, a clean tree),
`--rounds` times each, in the order BASE HEAD, HEAD BASE, BASE HEAD, ... (a drift that grows through the run then
falls on both sides equally), and prints each figure's runs, each side's median and the ratio HEAD / BASE.

Counts (RPCs, persistence requests and workflow tasks per turn) hardly move with the machine's speed, and a
process's CPU as a share of the Temporal server's in the same run moves less than either alone: those are the
figures to judge a change by; TTFT and throughput need several rounds.

    python -m bench.compare main~1                      # two rounds of the committed configuration (4 runs)
    python -m bench.compare 39e081d --rounds 3 -- --sessions 100 --turns 5

Arguments after `--` go to both sides' `python -m bench.load` (BASE's must take them). Each side's own results
files and logs are kept in a temporary directory the report names; the report is `bench/results/<--output>.md`.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._report import ROOT, add_run_options, begin_run, read_summary, write_results

Figure = tuple[str, Callable[[dict[str, Any]], float | None]]


def _cpu(name: str) -> Callable[[dict[str, Any]], float | None]:
    def read(figures: dict[str, Any]) -> float | None:
        process = figures["processes"].get(name) or {}
        value = process.get("cpu_ms_per_turn")
        return None if value is None else float(value)

    return read


OWN = ("harness worker", "model worker", "utility worker", "sandbox worker", "stream relay")
"""corral's own processes (issue 29's "CPU per turn of corral's own processes")."""


def _own(figures: dict[str, Any]) -> float | None:
    values = [_cpu(name)(figures) for name in OWN if name in figures["processes"]]
    return None if any(value is None for value in values) else sum(v for v in values if v is not None)


def _share(name: str) -> Callable[[dict[str, Any]], float | None]:
    def read(figures: dict[str, Any]) -> float | None:
        mine, server = _cpu(name)(figures), _cpu("Temporal dev server")(figures)
        return None if mine is None or not server else mine / server

    return read


def _server(key: str) -> Callable[[dict[str, Any]], float | None]:
    return lambda figures: (figures.get("server_per_turn") or {}).get(key)


def _went_wrong(key: str) -> Callable[[dict[str, Any]], float | None]:
    return lambda figures: float(figures["went_wrong"].get(key, 0))


FIGURES: tuple[Figure, ...] = (
    ("turns per second", lambda f: f["turns_per_second"]),
    ("TTFT p50 under load (s)", lambda f: f["ttft_loaded_p50"]),
    ("TTFT p95 under load (s)", lambda f: f["ttft_loaded_p95"]),
    ("TTFT p99 under load (s)", lambda f: f["ttft_loaded_p99"]),
    ("CPU ms per turn: Temporal server", _cpu("Temporal dev server")),
    ("CPU ms per turn: corral's own processes", _own),
    ("CPU ms per turn: harness", _cpu("harness worker")),
    ("CPU ms per turn: model worker", _cpu("model worker")),
    ("CPU ms per turn: stream relay", _cpu("stream relay")),
    ("harness CPU / Temporal CPU", _share("harness worker")),
    ("model worker CPU / Temporal CPU", _share("model worker")),
    ("stream relay CPU / Temporal CPU", _share("stream relay")),
    ("RPCs to the frontend per turn", _server("frontend_rpcs_per_turn")),
    ("persistence requests per turn", _server("persistence_requests_per_turn")),
    ("workflow tasks per turn", lambda f: f["history_per_turn"].get("workflow tasks completed")),
    ("workflow tasks timed out on schedule-to-start", _went_wrong("workflow task timed out (SCHEDULE_TO_START)")),
    ("model turns timed out on heartbeat", _went_wrong("`model_turn` activity timed out (HEARTBEAT)")),
    ("lost + duplicated", lambda f: float(f["lost"] + f["duplicated"])),
)


def order(rounds: int) -> list[str]:
    """BASE HEAD, HEAD BASE, ...: each round reverses the one before, so a drift through the run is shared."""
    sides: list[str] = []
    for number in range(rounds):
        sides += ["base", "head"] if number % 2 == 0 else ["head", "base"]
    return sides


def compare(runs: dict[str, list[dict[str, Any]]]) -> list[tuple[str, list[float | None], list[float | None]]]:
    """Each figure's values on BASE and on HEAD, in run order."""
    return [(name, [read(f) for f in runs["base"]], [read(f) for f in runs["head"]]) for name, read in FIGURES]


def _median(values: list[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return statistics.median(known) if known else None


def _shown(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.3f}" if abs(value) < 10 else f"{value:.1f}"


def table(rows: list[tuple[str, list[float | None], list[float | None]]], base: str, head: str) -> str:
    lines = [
        f"| figure | BASE {base[:8]}: runs | median | HEAD {head[:8]}: runs | median | HEAD / BASE |",
        "| :--- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, on_base, on_head in rows:
        low, high = _median(on_base), _median(on_head)
        ratio = f"{high / low:.3f}" if low and high is not None else "-"
        lines.append(
            f"| {name} | {', '.join(map(_shown, on_base))} | {_shown(low)} | {', '.join(map(_shown, on_head))} "
            f"| {_shown(high)} | {ratio} |"
        )
    return "\n".join(lines)


def _git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def run_side(tree: Path, name: str, load_args: list[str], keep: Path) -> dict[str, Any]:
    """`python -m bench.load` in `tree` (its own code on the path); its results file and log moved to `keep`."""
    log = keep / f"{name}.log"
    env = {**os.environ, "PYTHONPATH": str(tree)}
    command = [sys.executable, "-m", "bench.load", "--output", name, *load_args]
    with log.open("w") as out:
        done = subprocess.run(command, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
    results = tree / "bench" / "results" / f"{name}.md"
    if done.returncode != 0 or not results.exists():
        raise SystemExit(f"bench.compare: {name} failed (exit {done.returncode}); its output is in {log}")
    kept = Path(shutil.move(results, keep / results.name))
    figures: dict[str, Any] = read_summary(kept)["figures"]
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("base", help="the commit to compare the checkout with (any git revision)")
    parser.add_argument("--rounds", type=int, default=2, help="runs of each side (default 2)")
    parser.add_argument("--output", default="compare", help="results file name in bench/results/ (default compare)")
    add_run_options(parser)
    args, load_args = parser.parse_known_args()
    load_args = [arg for arg in load_args if arg != "--"]
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    run = begin_run(args.allow_dirty)
    base = _git("rev-parse", "--verify", f"{args.base}^{{commit}}")
    keep = Path(tempfile.mkdtemp(prefix="corral-bench-compare-"))
    tree = keep / "base-tree"
    _git("worktree", "add", "--detach", "--quiet", str(tree), base)
    runs: dict[str, list[dict[str, Any]]] = {"base": [], "head": []}
    try:
        for number, side in enumerate(order(args.rounds), start=1):
            began = time.monotonic()
            name = f"compare-{number}-{side}"
            print(f"{name} ({base[:8] if side == 'base' else run.commit[:8]}) ...", flush=True)
            runs[side].append(run_side(tree if side == "base" else ROOT, name, load_args, keep))
            print(f"  done in {time.monotonic() - began:.0f}s", flush=True)
    finally:
        _git("worktree", "remove", "--force", str(tree))
    command = " ".join(["python -m bench.load", *load_args])
    body = "\n\n".join([
        f"`{command}` on BASE {base} and on HEAD {run.commit}, {args.rounds} runs each, one at a time, in the order "
        f"{', '.join(order(args.rounds))}. Each side's results files and logs: {keep}.",
        table(compare(runs), base, run.commit),
        "Counts per turn and CPU as a share of the Temporal server's move least with the machine's speed; TTFT and "
        "throughput move most (bench/compare.py).",
    ])  # fmt: skip
    print()
    print(body)
    path = write_results(args.output, "A/B: the load benchmark on two commits", body, summary={
        "base": base, "rounds": args.rounds, "load_args": load_args,
        "figures": {name: {"base": on_base, "head": on_head} for name, on_base, on_head in compare(runs)},
    })  # fmt: skip
    print(f"\nwritten to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
