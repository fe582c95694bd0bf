"""Tools of the test hand (a real worker serving `execute` on a fresh task queue)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from corral.hands import ToolFunction
from corral.hands.utility import calculate


def echo(input: dict[str, Any]) -> str:
    return str(input.get("text", ""))


async def sleep(input: dict[str, Any]) -> str:
    """Sleep; if cancelled, say so in `marker` (a file) so a test can see the cancel reached the hand."""
    try:
        await asyncio.sleep(float(input.get("seconds", 1)))
    except asyncio.CancelledError:
        if "marker" in input:
            Path(str(input["marker"])).write_text("cancelled")
        raise
    return "slept"


def append_line(input: dict[str, Any]) -> str:
    """Append a line to a file and return how many lines it has (to count executions)."""
    path = Path(str(input["path"]))
    with path.open("a") as file:
        file.write(str(input.get("line", "x")) + "\n")
    return str(len(path.read_text().splitlines()))


def spew(input: dict[str, Any]) -> str:
    """`size` characters of output, different in every call (`tag` first), to fill the log."""
    tag = str(input.get("tag", ""))
    return tag + "x" * (int(input.get("size", 0)) - len(tag))


TEST_TOOLS: dict[str, ToolFunction] = {
    "calculate": calculate,
    "echo": echo,
    "sleep": sleep,
    "append_line": append_line,
    "spew": spew,
}
