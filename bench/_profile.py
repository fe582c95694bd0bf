"""Where each process spends its CPU under load: py-spy samples every Python process of the stack from outside
(it reads their memory; nothing in them changes), and each profile becomes a flame graph and a table.

py-spy writes collapsed stacks ("frame;frame;frame count" per line); the table sums them by the innermost frame
(self time) and by every frame on the stack (inclusive), and the flame graph draws them, widest first. Only
samples of the thread holding the GIL are kept (`--gil`): that is the Python work that competes for the process's
one interpreter; a thread waiting on the network or on the GIL weighs nothing (py-spy's own idle test counts an
event loop's `epoll` wait as busy when it samples without pausing the process).
"""

from __future__ import annotations

import html
import shutil
import signal
import subprocess
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

SAMPLE_RATE = 97
"""Samples a second: near py-spy's default (100), off the round figure so that it does not beat with timers."""


@dataclass
class Profiler:
    """py-spy attached to one process for the length of the load."""

    name: str
    raw: Path
    process: subprocess.Popen[bytes]

    def stop(self) -> None:
        """py-spy writes its file when interrupted."""
        self.process.send_signal(signal.SIGINT)
        self.process.wait(timeout=60)


def start(pids: dict[str, int], directory: Path) -> list[Profiler]:
    """A py-spy per process, writing collapsed stacks to `<directory>/<name>.txt`."""
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        raise RuntimeError("py-spy is not installed: pip install -e '.[bench]'")
    directory.mkdir(parents=True, exist_ok=True)
    profilers = []
    for name, pid in pids.items():
        raw = directory / f"{slug(name)}.txt"
        args = [py_spy, "record", "--pid", str(pid), "--rate", str(SAMPLE_RATE), "--nonblocking", "--gil"]
        args += ["--format", "raw", "--output", str(raw)]
        log = (directory / f"{slug(name)}.py-spy.log").open("wb")
        profilers.append(Profiler(name, raw, subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)))
    return profilers


def slug(name: str) -> str:
    return name.replace(" ", "-")


@dataclass
class Profile:
    """One process's samples: collapsed stack -> count."""

    name: str
    stacks: Counter[str] = field(default_factory=Counter)

    @classmethod
    def read(cls, name: str, raw: Path) -> Profile:
        profile = cls(name)
        for line in raw.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if stack and count.isdigit():
                profile.stacks[stack] += int(count)
        return profile

    @property
    def samples(self) -> int:
        return sum(self.stacks.values())

    def top(self, n: int = 12) -> tuple[list[tuple[str, int]], list[tuple[str, int]]]:
        """The `n` frames with the most samples of their own, and with the most samples under them."""
        own: Counter[str] = Counter()
        under: Counter[str] = Counter()
        for stack, count in self.stacks.items():
            frames = stack.split(";")
            own[short(frames[-1])] += count
            for frame in {short(f) for f in frames}:
                under[frame] += count
        return own.most_common(n), under.most_common(n)


def short(frame: str) -> str:
    """A frame as `function (package.module)`: without its line number (lines move between commits, names less so)
    and with its file as the module it is, not a path on the machine that sampled it."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    if not path.endswith(".py"):
        return f"{name} ({path})" if path else name
    parts = Path(path).with_suffix("").parts
    keep = parts[parts.index("site-packages") + 1 :] if "site-packages" in parts else parts[-2:]
    return f"{name} ({'.'.join(keep)})"


def table(profile: Profile, seconds: float, turns: int) -> str:
    """Markdown: the process's hottest frames, in ms of CPU per turn (samples / rate / turns)."""
    own, under = profile.top()
    per_turn = 1000 / SAMPLE_RATE / max(turns, 1)
    lines = [
        f"**{profile.name}**: {profile.samples} samples on the CPU in {seconds:.0f} s "
        f"({profile.samples * per_turn:.1f} ms per turn)",
        "",
        "| self: frame | ms/turn | inclusive: frame | ms/turn |",
        "| :--- | ---: | :--- | ---: |",
    ]
    for (a, na), (b, nb) in zip(own, under, strict=False):
        lines.append(f"| `{a}` | {na * per_turn:.2f} | `{b}` | {nb * per_turn:.2f} |")
    return "\n".join(lines)


def flame_graph(profile: Profile, path: Path, width: int = 1600, row: int = 16) -> None:
    """An SVG flame graph: the root at the bottom, each frame as wide as its share of the samples."""
    tree: dict[str, dict] = {}
    for stack, count in profile.stacks.items():
        node = tree
        for frame in stack.split(";"):
            child = node.setdefault(frame, {"#": 0})
            child["#"] += count
            node = child
    total = max(profile.samples, 1)
    depth = max((stack.count(";") + 1 for stack in profile.stacks), default=1)
    height = (depth + 2) * row
    rects: list[str] = []

    def draw(node: dict, x: float, level: int) -> None:
        for frame, child in sorted(node.items(), key=lambda item: -item[1]["#"] if item[0] != "#" else 0):
            if frame == "#":
                continue
            w = child["#"] / total * width
            if w >= 0.5:
                y = height - (level + 2) * row
                name = short(frame)
                label = html.escape(name)
                share = 100 * child["#"] / total
                hue = 20 + zlib.crc32(frame.rsplit(" (", 1)[-1].encode()) % 40
                rects.append(
                    f'<g><title>{label}: {share:.1f}%</title><rect x="{x:.1f}" y="{y}" width="{w:.1f}" '
                    f'height="{row - 1}" fill="hsl({hue},80%,60%)"/>'
                    + (
                        f'<text x="{x + 2:.1f}" y="{y + row - 4}">{html.escape(name[: int(w / 7)])}</text>'
                        if w > 30
                        else ""
                    )
                    + "</g>"
                )
            draw(child, x, level + 1)
            x += w

    draw(tree, 0.0, 0)
    path.write_text(
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="monospace" '
        f'font-size="11"><text x="4" y="14">{html.escape(profile.name)}: {profile.samples} samples on the CPU '
        f"(hover a frame for its share)</text>{''.join(rects)}</svg>\n"
    )


def section(names: list[str], directory: Path, graphs: Path, output: str, seconds: float, turns: int) -> str:
    """The report's section: each process's hottest frames, and its flame graph written to `graphs`."""
    graphs.mkdir(parents=True, exist_ok=True)
    sections = [
        f"## Where the CPU goes\n\nSampled by py-spy at {SAMPLE_RATE} Hz during the load (samples of the thread "
        f"holding the GIL only). ms/turn: samples / rate / {turns} turns; `self` counts the innermost frame, "
        "`inclusive` every frame on the stack. The sampling itself takes CPU, so the timings above are not "
        "comparable with a run without `--profile`."
    ]
    for name in names:
        raw = directory / f"{slug(name)}.txt"
        if not raw.exists():
            sections.append(f"**{name}**: no profile (py-spy wrote nothing; see {raw.with_suffix('.py-spy.log')})")
            continue
        found = Profile.read(name, raw)
        svg = graphs / f"{output}-{slug(name)}.svg"
        flame_graph(found, svg)
        sections.append(table(found, seconds, turns) + f"\n\nFlame graph: [{svg.name}](profile/{svg.name})")
    return "\n\n".join(sections)
