"""A peer runtime as an arm of a benchmark: `bench/peers/<name>_arm.py` in a virtualenv of its own, made from
`bench/peers/<name>.txt` on first use, spoken to in JSON lines on its stdin and stdout. Shared by `bench.capacity`
and `bench.ttft`, so that both measure the same peer the same way.

Every request carries an `id` and a `command`; the peer answers each with one line carrying the same `id`, in
whatever order its work finishes, so a benchmark may have several requests in flight (one per session)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

PEERS = Path(__file__).resolve().parent / "peers"


def peer_python(name: str, state_dir: Path) -> Path:
    """The peer's virtualenv `<state_dir>/peer-venv-<name>`, made and installed from `bench/peers/<name>.txt` when it
    is missing or was installed from other requirements; returns its Python."""
    requirements = PEERS / f"{name}.txt"
    venv = state_dir / f"peer-venv-{name}"
    python = venv / "bin" / "python"
    installed = venv / "requirements.txt"
    if python.exists() and installed.exists() and installed.read_text() == requirements.read_text():
        return python
    print(f"installing the peer {name} into {venv} (once)", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", "-r", str(requirements)], check=True)
    shutil.copyfile(requirements, installed)
    return python


class PeerProcess:
    """The peer's arm process. `request` may be awaited by many tasks at once: a reader task hands each answer to
    the request with its id; if the process exits, every pending request fails and names the log."""

    def __init__(self, name: str, process: asyncio.subprocess.Process, log: Path) -> None:
        self.name, self.process, self.log = name, process, log
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._reader: asyncio.Task[None] | None = None

    @classmethod
    async def launch(cls, name: str, python: Path, log: Path, *options: str, script: Path | None = None) -> PeerProcess:
        """Start `bench/peers/<name>_arm.py` (or `script`) with `options` and wait for its `ready` line (its imports
        and its worker's connection)."""
        script = script or PEERS / f"{name}_arm.py"
        with log.open("ab") as err:
            process = await asyncio.create_subprocess_exec(
                str(python), str(script), *options, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err
            )
        peer = cls(name, process, log)
        ready = await asyncio.wait_for(peer._line(), 120)
        if not ready.get("ready"):
            raise RuntimeError(f"the {name} arm did not say it was ready: {ready}; see {log}")
        peer._reader = asyncio.create_task(peer._read())
        return peer

    async def _line(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = await self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"the {self.name} arm exited; see {self.log}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    async def _read(self) -> None:
        try:
            while True:
                answer = await self._line()
                future = self._pending.pop(answer.get("id", -1), None)
                if future is not None and not future.done():
                    future.set_result(answer)
        except Exception as exc:  # the process died or spoke garbage: every waiting request learns why
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(RuntimeError(f"the {self.name} arm failed ({exc}); see {self.log}"))
            self._pending.clear()

    async def request(self, command: str, timeout: float, **fields: Any) -> dict[str, Any]:
        """Send one request and wait up to `timeout` seconds for its answer."""
        assert self.process.stdin is not None
        if self._reader is None or self._reader.done():
            raise RuntimeError(f"the {self.name} arm is not running; see {self.log}")
        number = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[number] = future
        self.process.stdin.write(json.dumps({"id": number, "command": command, **fields}).encode() + b"\n")
        await self.process.stdin.drain()
        try:
            return await asyncio.wait_for(future, timeout)
        finally:
            self._pending.pop(number, None)

    async def stop(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            await asyncio.wait_for(self.process.wait(), 30)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reader
