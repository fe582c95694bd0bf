"""How fast the `corral` CLI answers: `corral --help` and `corral events` beside `python -c pass`, in one run.

A CLI people type into should answer in a fraction of a second (goal: under 0.5 s here). The baseline is the
interpreter's own start-up, measured in the same run, so the ratio holds on a noisy machine.

`corral events` runs against a real Temporal dev server started here (in memory), for a session that does not
exist: the whole path of a read (imports, connect, one query, a clear "no session" message) without needing the
workers. Run from the repository root:

    python -m bench.cli_startup [--runs 15]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time

from bench._report import add_run_options, begin_run, write_results
from corral.names import SESSION_ID_PREFIX
from corral.temporal import start_local_temporal

GOAL_SECONDS = 0.5


def timed(argv: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    return time.perf_counter() - started


def measure(commands: dict[str, list[str]], runs: int) -> dict[str, list[float]]:
    """Each command `runs` times, interleaved (A B C A B C …) so drift hits all alike, after one warm-up each."""
    for argv in commands.values():
        timed(argv)
    samples: dict[str, list[float]] = {name: [] for name in commands}
    for _ in range(runs):
        for name, argv in commands.items():
            samples[name].append(timed(argv))
    return samples


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--output", default="cli_startup", help="results file name in bench/results/")
    add_run_options(parser)
    args = parser.parse_args()
    begin_run(args.allow_dirty)
    env = await start_local_temporal(dev_server_log_level="error")
    try:
        address = env.client.service_client.config.target_host
        corral = [sys.executable, "-m", "cli.main"]
        commands = {
            "python -c pass (baseline)": [sys.executable, "-c", "pass"],
            "corral --help": [*corral, "--help"],
            "corral events (connect + query)": [*corral, "--address", address, "events", SESSION_ID_PREFIX + "0" * 26],
        }
        samples = await asyncio.to_thread(measure, commands, args.runs)
    finally:
        await env.shutdown()
    baseline = statistics.median(samples["python -c pass (baseline)"])
    lines = [
        f"{args.runs} runs each, interleaved, after a warm-up; goal: corral commands under {GOAL_SECONDS:g} s",
        "",
        "| command | p50 s | min s | max s | p50 / python -c pass |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, values in samples.items():
        median = statistics.median(values)
        lines.append(f"| `{name}` | {median:.3f} | {min(values):.3f} | {max(values):.3f} | {median / baseline:.1f}x |")
    body = "\n".join(lines)
    print(body)
    summary = {
        "goal_seconds": GOAL_SECONDS,
        "p50": {name: statistics.median(values) for name, values in samples.items()},
        "help_p50": statistics.median(samples["corral --help"]),
        "events_p50": statistics.median(samples["corral events (connect + query)"]),
        "python_p50": baseline,
    }
    print(f"written to {write_results(args.output, 'CLI start-up', body, summary=summary)}")


if __name__ == "__main__":
    asyncio.run(main())
