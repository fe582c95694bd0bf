"""The reliability report: the fault matrix with a larger N, the fuzzing counts, and the load figures, in one page.

Runs the suites that prove durability, as CI runs them but bigger, and builds `bench/results/reliability.md` from
what they recorded (nothing in it is typed by hand):

1. the fault matrix (`tests/chaos/`) with `CORRAL_CHAOS_N` sessions per fault: each test appends its outcome (fault,
   expected, observed, lost, duplicated, recovery per session) to a JSON Lines file named by `CORRAL_CHAOS_RECORD`;
2. the property-based (hypothesis) suites with `--hypothesis-show-statistics`, read back into examples per test;
3. the load figures, from `bench/results/load.md` as `bench/load.py` last wrote it (run that on a quiet machine).

    python -m bench.reliability            # N = 10 sessions per fault (about 20 minutes on 2 cores)
    python -m bench.reliability --n 3      # a quicker look

A fault test that fails is reported as failed, with its pytest summary: the report never drops a row.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench._report import RESULTS_DIR, ROOT, add_run_options, begin_run, markdown_table, percentile, write_results

PROPERTY_SUITES = (
    "tests/test_log_slices.py",
    "tests/test_properties_contract.py",
    "tests/test_properties_context.py",
    "tests/test_properties_cli.py",
    "tests/test_properties_raw_client.py",
    "tests/test_units.py",
    "tests/test_session_errors.py",
)
"""Where the hypothesis tests are (a suite that is missing is skipped, and the report says so)."""

_EXAMPLES = re.compile(r"(\d+) passing, (\d+) failing, and (\d+) invalid test cases")
_TEST_ID = re.compile(r"^(tests/\S+::.+):\s*$")
_RESULT = re.compile(r"^(PASSED|FAILED|ERROR) (tests/\S+::.+?)(?: - .*)?$")


@dataclass
class Fuzzed:
    test: str
    passing: int = 0
    failing: int = 0
    invalid: int = 0


def run_pytest(paths: list[str], env: dict[str, str], extra: list[str], log: Path) -> tuple[int, str]:
    """Run pytest as `./run-tests` does (its own process, the repository as cwd); output to `log` and returned."""
    command = [sys.executable, "-m", "pytest", *paths, "-q", "-rA", "-p", "no:cacheprovider", *extra]
    print("$", " ".join(command[1:]), flush=True)
    with log.open("w") as out:
        completed = subprocess.run(command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT, check=False)
    return completed.returncode, log.read_text()


def fault_matrix(n: int, workdir: Path) -> tuple[list[dict[str, object]], dict[str, str], float]:
    record = workdir / "outcomes.jsonl"
    env = {**os.environ, "CORRAL_CHAOS_N": str(n), "CORRAL_CHAOS_RECORD": str(record)}
    started = time.monotonic()
    _, output = run_pytest(["tests/chaos"], env, ["-o", f"timeout={300 + 60 * n}"], workdir / "chaos.log")
    elapsed = time.monotonic() - started
    outcomes = [json.loads(line) for line in record.read_text().splitlines()] if record.exists() else []
    results = {match.group(2): match.group(1) for match in map(_RESULT.match, output.splitlines()) if match}
    return outcomes, results, elapsed


def fuzzing(workdir: Path) -> tuple[list[Fuzzed], list[str], dict[str, str]]:
    present = [suite for suite in PROPERTY_SUITES if (ROOT / suite).exists()]
    missing = [suite for suite in PROPERTY_SUITES if suite not in present]
    _, output = run_pytest(present, dict(os.environ), ["--hypothesis-show-statistics"], workdir / "fuzz.log")
    found: list[Fuzzed] = []
    current: Fuzzed | None = None
    for line in output.splitlines():
        if match := _TEST_ID.match(line.strip()):
            current = Fuzzed(match.group(1))
            found.append(current)
        elif current is not None and (counts := _EXAMPLES.search(line)):
            current.passing += int(counts.group(1))
            current.failing += int(counts.group(2))
            current.invalid += int(counts.group(3))
    results = {match.group(2): match.group(1) for match in map(_RESULT.match, output.splitlines()) if match}
    return [entry for entry in found if entry.passing + entry.failing], missing, results


def matrix_section(outcomes: list[dict[str, object]], results: dict[str, str], n: int, elapsed: float) -> str:
    rows = []
    for outcome in outcomes:
        seconds = [float(value) for value in outcome.get("recovery_seconds") or []]  # type: ignore[attr-defined]
        rows.append([
            outcome["fault"], outcome["n"], outcome["expected"], outcome["observed"], outcome["lost"],
            outcome["duplicated"],
            f"{percentile(seconds, 0.5):.1f} / {percentile(seconds, 0.95):.1f}" if seconds else "-",
        ])  # fmt: skip
    failed = sorted(test for test, result in results.items() if result != "PASSED")
    lost = sum(int(str(outcome["lost"])) for outcome in outcomes)
    duplicated = sum(int(str(outcome["duplicated"])) for outcome in outcomes)
    text = [
        f"`tests/chaos/` with {n} sessions per fault ({elapsed / 60:.1f} minutes): {len(outcomes)} rows recorded, "
        f"{sum(1 for r in results.values() if r == 'PASSED')} tests passed, {len(failed)} failed. "
        f"Lost: {lost}. Duplicated: {duplicated}.",
        "",
        markdown_table(["fault", "N", "expected", "observed", "lost", "duplicated", "recovery p50 / p95 (s)"], rows),
    ]
    if failed:
        text += ["", "Failed (see the pytest log of the run):", *(f"- `{test}`" for test in failed)]
    return "\n".join(text)


def fuzzing_section(fuzzed: list[Fuzzed], missing: list[str], results: dict[str, str]) -> str:
    rows: list[list[object]] = [[_cell(entry.test), entry.passing, entry.failing, entry.invalid] for entry in fuzzed]
    counted = {entry.test for entry in fuzzed}
    rows += [
        [_cell(test), "not reported", "-", "-"]  # no statistics printed for it
        for test, result in sorted(results.items())
        if test.startswith("tests/test_properties_") and test not in counted and result == "PASSED"
    ]
    failed = sorted(test for test, result in results.items() if result != "PASSED")
    text = [
        f"{len(fuzzed)} property-based tests, {sum(entry.passing for entry in fuzzed):,} generated inputs passed, "
        f"{sum(entry.failing for entry in fuzzed)} failed; tests in these files that failed: {len(failed)}.",
        "",
        markdown_table(["test", "passing examples", "failing", "invalid (filtered out)"], rows),
    ]
    if len(rows) > len(fuzzed):
        text += [
            "",
            '"not reported": the test drives hypothesis inside a live session, where pytest prints no '
            "statistics; it passed, with the example count its `settings` give.",
        ]
    if missing:
        text += ["", "Not found, so not run: " + ", ".join(f"`{suite}`" for suite in missing)]
    return "\n".join(text)


def _cell(test: str) -> str:
    """A test id as a table cell: code, with the `|` of a parameter's type (`A | B`) escaped."""
    return "`" + test.replace("|", "\\|") + "`"


def load_section() -> str:
    load = RESULTS_DIR / "load.md"
    if not load.exists():
        return "No load results yet: run `python -m bench.load`."
    # Its header (commit, load) comes along; its summary block stays behind: a results file has one summary, its own.
    body = load.read_text().split("\n", 1)[1].split("\n## Summary\n", 1)[0].strip()
    return "From [load.md](load.md), as `bench/load.py` last wrote it:\n\n" + body.replace("\n# ", "\n#### ")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10, help="sessions per fault (default 10)")
    parser.add_argument("--no-fuzz", action="store_true", help="skip the property-based suites")
    add_run_options(parser)
    args = parser.parse_args()
    begin_run(args.allow_dirty)
    workdir = Path(tempfile.mkdtemp(prefix="corral-reliability-"))
    outcomes, results, elapsed = fault_matrix(args.n, workdir)
    sections = ["## Fault matrix", matrix_section(outcomes, results, args.n, elapsed)]
    if not args.no_fuzz:
        fuzzed, missing, fuzz_results = fuzzing(workdir)
        sections += ["## Hostile input (hypothesis)", fuzzing_section(fuzzed, missing, fuzz_results)]
    sections += ["## Load", load_section()]
    body = "\n\n".join(sections)
    print(body)
    summary = {
        "n": args.n,
        "faults": len(outcomes),
        "tests_passed": sum(1 for result in results.values() if result == "PASSED"),
        "tests_failed": sum(1 for result in results.values() if result != "PASSED"),
        "lost": sum(int(str(outcome["lost"])) for outcome in outcomes),
        "duplicated": sum(int(str(outcome["duplicated"])) for outcome in outcomes),
        "matrix_minutes": round(elapsed / 60, 1),
    }
    title = "Reliability: faults, hostile input and load"
    print(f"\nwritten: {write_results('reliability', title, body, summary=summary)}")
    print(f"pytest logs: {workdir}")


if __name__ == "__main__":
    main()
