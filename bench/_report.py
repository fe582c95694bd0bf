"""What every benchmark shares: percentiles, a description of the machine, and the results files.

Each script prints one markdown table and writes it, with the machine and the date, to `bench/results/<name>.md`
beside a PNG plot `bench/results/<name>.png`. Figures are meant to be read as ratios against a baseline measured
in the same run: absolute times on shared machines move.
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
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


def _git(*args: str) -> str:
    out = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True)
    return out.stdout.strip()


def _commit() -> str:
    """The commit measured, marked when `corral/` has uncommitted changes (read-only git commands)."""
    try:
        commit = _git("rev-parse", "--short", "HEAD")
        dirty = _git("status", "--porcelain", "--untracked-files=no", "--", "corral")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return commit + (" with uncommitted changes in corral/" if dirty else "")


def machine_description() -> str:
    """One line: cores, memory, Python, Docker, OS, commit, and the date (UTC)."""
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"{os.cpu_count()} cores, {_memory_gib()} memory, Python {platform.python_version()}, "
        f"Docker {_docker_version()}, {platform.system()} {platform.release()}, commit {_commit()}, {now}"
    )


def command_line() -> str:
    """How this run was started, for the results file (`python -m bench.ttft --quick`)."""
    module = Path(sys.argv[0]).stem
    return " ".join(["python -m", f"bench.{module}", *sys.argv[1:]])


def write_results(name: str, title: str, body: str, figure: Any | None = None) -> Path:
    """Write `bench/results/<name>.md` (title, machine, command, body) and `<name>.png` when a figure is given."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    text = f"# {title}\n\nMachine: {machine_description()}\n\nCommand: `{command_line()}`\n\n{body.rstrip()}\n"
    if figure is not None:
        figure.savefig(RESULTS_DIR / f"{name}.png", dpi=110, bbox_inches="tight")
        text += f"\n![{title}]({name}.png)\n"
    path = RESULTS_DIR / f"{name}.md"
    path.write_text(text)
    return path


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
