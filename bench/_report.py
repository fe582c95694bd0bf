"""What every benchmark shares: percentiles, a description of the machine, and the results files.

Each script prints its tables and writes them to `bench/results/<name>.md` (beside a PNG plot where it draws
one) with the commit measured, refusing a tree with uncommitted changes unless `--allow-dirty` is given, and a
JSON summary that `bench.quote` turns into the figures the READMEs quote. Figures are meant to be read as ratios
against a baseline measured in the same run: absolute times on shared machines move.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from corral.contract.events import SessionEvent

ROOT = Path(__file__).resolve().parent.parent
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile (p50 of 60 values is the 31st smallest, p99 the 59th); NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))]


def median(values: Sequence[float]) -> float:
    return percentile(values, 0.5)


def mean(values: Sequence[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A GitHub markdown table; the first column is left-aligned, the others right-aligned."""
    align = [":---"] + ["---:"] * (len(headers) - 1)
    lines = ["| " + " | ".join(headers) + " |", "| " + " | ".join(align) + " |"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _memory_gib() -> str:
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal:"):
                    return f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    return "unknown"


def _docker_version() -> str:
    try:
        import docker

        return str(docker.from_env().version().get("Version", "unknown"))
    except Exception:  # the machine line must never fail a benchmark
        return "not available"


def _git(root: Path, *args: str) -> str:
    out = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=10, check=True)
    return out.stdout.strip()


def machine_description() -> str:
    """One line: cores, memory, Python, Docker, OS."""
    return (
        f"{os.cpu_count()} cores, {_memory_gib()} memory, Python {platform.python_version()}, "
        f"Docker {_docker_version()}, {platform.system()} {platform.release()}"
    )


def command_line() -> str:
    """How this run was started, for the results file (`python -m bench.ttft --quick`)."""
    module = Path(sys.argv[0]).stem
    return " ".join(["python -m", f"bench.{module}", *sys.argv[1:]])


# What a results file may change without making the tree dirty: the results themselves (a run of several
# benchmarks in a row writes each file in turn, and the later ones are still measured on the same code).
_NOT_CODE = ":(exclude)bench/results"


def git_state(root: Path = ROOT) -> tuple[str, list[str]]:
    """The commit checked out (full hash) and the paths that differ from it, untracked files included (but not a
    virtualenv made in the checkout), outside `bench/results/` (read-only git commands); ("unknown", ["not a git
    checkout"]) where git cannot tell."""
    try:
        commit = _git(root, "rev-parse", "HEAD")
        status = _git(root, "status", "--porcelain", "--untracked-files=normal", "--", ".", _NOT_CODE)
    except (OSError, subprocess.SubprocessError):
        return "unknown", ["not a git checkout"]
    changed = [line[2:].strip() for line in status.splitlines() if line.strip()]  # the first line comes stripped
    return commit, [path for path in changed if not (root / path / "pyvenv.cfg").is_file()]


@dataclass
class Run:
    """One benchmark run: the code it measures and the machine's load around it, for the results file's header."""

    commit: str
    changed: list[str]
    started: datetime.datetime
    load_start: tuple[float, float, float]

    @property
    def dirty(self) -> bool:
        return bool(self.changed) or self.commit == "unknown"


_run: Run | None = None


def add_run_options(parser: argparse.ArgumentParser) -> None:
    """The options every benchmark that writes a results file takes."""
    parser.add_argument(
        "--allow-dirty",
        action="store_true",
        help="measure a tree with uncommitted changes anyway; the results file then says so in its first lines",
    )


def begin_run(allow_dirty: bool = False, root: Path = ROOT) -> Run:
    """Check the tree before measuring, so a dirty tree is refused now rather than after a run of many minutes, and
    note the load average the run starts under (the machine is shared)."""
    global _run
    commit, changed = git_state(root)
    run = Run(commit, changed, datetime.datetime.now(datetime.UTC), _load_now())
    if run.dirty and not allow_dirty:
        shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
        raise SystemExit(
            f"bench: the tree differs from commit {commit[:12]} ({shown}): figures measured here would be true of "
            "no commit. Commit or stash the changes and run again, or pass --allow-dirty to write a results file "
            "marked as measured on a dirty tree."
        )
    _run = run
    return run


def _load_now() -> tuple[float, float, float]:
    one, five, fifteen = (round(value, 2) for value in os.getloadavg())
    return one, five, fifteen


def _load(values: tuple[float, float, float]) -> str:
    return ", ".join(f"{value:.2f}" for value in values)


SUMMARY_FENCE = "json bench-summary"


def write_results(
    name: str,
    title: str,
    body: str,
    figure: Any | None = None,
    summary: dict[str, Any] | None = None,
    directory: Path = RESULTS_DIR,
) -> Path:
    """Write `bench/results/<name>.md` and `<name>.png` when a figure is given.

    The header says which commit was measured and whether the tree was clean (a dirty run says so loudly, first),
    the machine, the load average at the start and the end, and the command; the file ends with a fenced JSON
    summary (`SUMMARY_FENCE`) that `bench.quote` reads, so quoted figures never come from parsing prose.
    """
    run = _run or begin_run()
    finished = datetime.datetime.now(datetime.UTC)
    load_end = _load_now()
    directory.mkdir(parents=True, exist_ok=True)
    lines = [f"# {title}", ""]
    if run.dirty:
        lines += [
            f"> **DIRTY TREE — NOT A FIGURE OF ANY COMMIT.** Measured with uncommitted changes on top of commit "
            f"{run.commit} (`--allow-dirty`): {', '.join(run.changed)}.",
            "",
        ]
    lines += [
        f"Commit: {run.commit} ({'DIRTY tree' if run.dirty else 'clean tree'})",
        "",
        f"Machine: {machine_description()}",
        "",
        f"Load average (1, 5, 15 min): {_load(run.load_start)} at the start, {_load(load_end)} at the end "
        f"({os.cpu_count()} cores; the machine is shared)",
        "",
        f"Run: {run.started:%Y-%m-%d %H:%M} to {finished:%H:%M} UTC "
        f"({(finished - run.started).total_seconds() / 60:.1f} minutes)",
        "",
        f"Command: `{command_line()}`",
        "",
        body.rstrip(),
        "",
    ]
    if figure is not None:
        figure.savefig(directory / f"{name}.png", dpi=110, bbox_inches="tight")
        lines += [f"![{title}]({name}.png)", ""]
    record = {
        "commit": run.commit,
        "dirty": run.dirty,
        "command": command_line(),
        "started": run.started.isoformat(timespec="seconds"),
        "minutes": round((finished - run.started).total_seconds() / 60, 1),
        "load_start": list(run.load_start),
        "load_end": list(load_end),
        "figures": summary or {},
    }
    lines += ["## Summary", "", f"```{SUMMARY_FENCE}", json.dumps(record, indent=1, sort_keys=True), "```", ""]
    path = directory / f"{name}.md"
    path.write_text("\n".join(lines))
    return path


def read_summary(path: Path) -> dict[str, Any]:
    """The JSON summary at the end of a results file; ValueError when it has none."""
    text = path.read_text()
    match = re.search(rf"^```{SUMMARY_FENCE}\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    if match is None:
        raise ValueError(f"{path.name} has no summary block (```{SUMMARY_FENCE}): it predates bench/_report.py's")
    record: dict[str, Any] = json.loads(match.group(1))
    return record


def rss_bytes(pid: int) -> int:
    """Resident set size of a process (Linux `/proc/<pid>/status`), 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time a process has used so far (Linux `/proc/<pid>/stat`), 0 if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def log_gaps_and_repeats(events: Sequence[SessionEvent]) -> tuple[int, int]:
    """A session log's integrity: positions missing from 1..N, and positions or event ids seen more than once."""
    positions = [event.position for event in events]
    missing = set(range(1, max(positions, default=0) + 1)) - set(positions)
    repeated = len(positions) - len(set(positions)) + len(events) - len({event.id for event in events})
    return len(missing), repeated


def child_pid(command: str) -> int | None:
    """The pid of a child of this process whose command name is `command` (the Temporal dev server the SDK
    starts), or None (Linux `/proc`)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            name, rest = (entry / "stat").read_text().rsplit(")", 1)
        except OSError:
            continue
        if name.split("(", 1)[1] == command and int(rest.split()[1]) == os.getpid():
            return int(entry.name)
    return None
