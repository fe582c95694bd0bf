"""The two arms of `bench.capacity`, stepped alike: corral on the load benchmark's stack (`bench._load_stack`), and a
peer (actant) in a process of its own, in a virtualenv of its own made from `bench/peers/<name>.txt` on first use.

A step: N sessions, each doing the load benchmark's turn (a streamed preamble, one `calculate` tool call, an
answer) back to back until the step's time is up and at least `min_turns` are done. TTFT is timed at the client:
the message sent -> the turn's first text delta. A session's first turn is left out of the figures (it pays for
the session's first model call; a new session's start is `bench.ttft`'s subject)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench._load_accounting import Checked, check_log
from bench._load_clients import Load, Session, open_session, turn
from bench._load_stack import clean_up
from bench._peers import PeerProcess
from bench._report import cpu_seconds, median, percentile
from corral.client import read_events

SHARED = ("model server", "Temporal dev server")
"""The processes both arms use: not counted as either arm's own CPU."""


def cpu_of(pids: dict[str, list[int]]) -> dict[str, float]:
    """CPU seconds used so far by each group of processes."""
    return {part: sum(cpu_seconds(pid) for pid in group) for part, group in pids.items()}


@dataclass
class Step:
    """One arm at one concurrency."""

    arm: str
    sessions: int
    ttfts: list[float] = field(default_factory=list)
    """Every turn's TTFT after each session's first turn, seconds."""
    turns: int = 0
    """Every turn done, first turns included (the throughput)."""
    wall: float = 0.0
    lost: int = 0
    duplicated: int = 0
    no_text: int = 0
    """Turns done with no text delta seen by the client."""
    problems: list[str] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)
    """CPU seconds while the sessions turned: the arm's own processes ("arm") and the Temporal server's."""

    def cpu_ms_per_turn(self, part: str) -> float:
        return 1000 * self.cpu[part] / self.turns if self.turns and part in self.cpu else float("nan")

    @property
    def p50(self) -> float:
        return median(self.ttfts)

    @property
    def p95(self) -> float:
        return percentile(self.ttfts, 0.95)

    @property
    def throughput(self) -> float:
        return self.turns / self.wall if self.wall else float("nan")

    def add_turns(self, ttfts: list[float | None]) -> None:
        """A session's turns' TTFTs, in order (None: no text seen)."""
        self.turns += len(ttfts)
        self.no_text += sum(1 for ttft in ttfts if ttft is None)
        self.ttfts += [ttft for ttft in ttfts[1:] if ttft is not None]


# ---- corral -------------------------------------------------------------------------------------------------


async def corral_step(load: Load, sessions: int, seconds: float, min_turns: int) -> Step:
    """N sessions opened (streams live), then all turning at once; their logs checked and the sessions ended."""
    gate = asyncio.Semaphore(20)

    async def opened(index: int) -> Session:
        async with gate:
            return await open_session(load, index, False)

    step = Step("corral", sessions)
    made = list(await asyncio.gather(*(opened(index) for index in range(sessions))))
    pids = {"arm": [load.pid(name) for name in load.processes if name not in SHARED]}
    if "Temporal dev server" in load.processes:
        pids["temporal"] = [load.pid("Temporal dev server")]
    cpu = cpu_of(pids)
    began = time.monotonic()

    async def converse(session: Session) -> None:
        try:
            while time.monotonic() < began + seconds or len(session.turns) < min_turns:
                await turn(load, session, len(session.turns) + 1, began)
        except Exception as exc:  # reported with the results, never hidden
            session.problem = f"turn {len(session.turns) + 1}: {type(exc).__name__}: {exc}"

    await asyncio.gather(*(converse(session) for session in made))
    step.cpu = {part: used - cpu[part] for part, used in cpu_of(pids).items()}
    step.wall = max((t.ended for s in made for t in s.turns), default=0.0)
    checked = Checked()
    for session in made:
        step.add_turns([t.ttft for t in session.turns])
        check_log(checked, session, await read_events(session.handle), len(session.client_ids))
        if session.problem:
            step.problems.append(session.problem)
    step.lost, step.duplicated = sum(checked.lost.values()), sum(checked.duplicated.values())
    await clean_up(load, made)
    return step


# ---- the peer ---------------------------------------------------------------------------------------------------


class PeerArm(PeerProcess):
    """The peer's arm process (`bench._peers`), stepped like corral's: one `step` request at a time."""

    def __init__(self, name: str, process: asyncio.subprocess.Process, log: Path) -> None:
        super().__init__(name, process, log)
        self.pids: dict[str, list[int]] = {"arm": [process.pid]}

    @classmethod
    async def start(cls, name: str, python: Path, log: Path, temporal: int | None, *options: str) -> PeerArm:
        """The arm's process, ready for a step; `temporal` is the Temporal server's pid, for its CPU time."""
        arm = await cls.launch(name, python, log, *options)
        assert isinstance(arm, PeerArm)
        if temporal is not None:
            arm.pids["temporal"] = [temporal]
        return arm

    async def step(self, sessions: int, seconds: float, min_turns: int, timeout: float) -> Step:
        cpu = cpu_of(self.pids)
        answer = await self.request("step", timeout, sessions=sessions, seconds=seconds, min_turns=min_turns)
        step = Step(self.name, sessions, wall=answer["wall"])
        step.cpu = {part: used - cpu[part] for part, used in cpu_of(self.pids).items()}
        for session in answer["sessions"]:
            step.add_turns([ttft for ttft, _ in session["turns"]])
            step.lost += session["lost"]
            step.duplicated += session["duplicated"]
            if session["problem"]:
                step.problems.append(session["problem"])
        return step
