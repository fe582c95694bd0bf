"""`corral down`: stop the local stack in reverse start order, out loud, and say what is kept (or, with `--purge`,
remove the state dir too). `up.py` brings it up.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

from rich.console import Console
from rich.text import Text

from cli import processes, stack
from cli.context import CliError
from cli.stack import StatePaths
from corral.names import ENV_BLOB_STORE, ENV_KNOWLEDGE_DB


def _note(console: Console, text: str) -> None:
    console.print(Text(f"note: {text}", style="yellow"))


async def bring_down(
    console: Console, paths: StatePaths, *, remove_sandboxes: bool = False, purge: bool = False
) -> None:
    """Stop every recorded process in reverse start order (workers first, Temporal last), and say what is kept.

    With `purge` (which implies `remove_sandboxes`), the state dir goes too: sessions, vaults, logs, blobs.

    With `remove_sandboxes`, every sandbox on the engine goes too, after the workers (so none makes a new one) and
    before a `dockerd` this stack started (the engine must answer to remove them).
    """
    stopped = 0
    sandboxes_done = False
    remove_sandboxes |= purge
    recorded = stack.read_stack(paths)
    scope = recorded.sandbox_scope if recorded is not None else None
    for name in reversed(processes.known_processes(paths)):
        if name == stack.DOCKERD and not sandboxes_done:
            await _sandboxes_at_down(console, scope, remove_sandboxes)
            sandboxes_done = True
        with console.status(f"stopping {name} …"):
            pid, outcome = await asyncio.to_thread(processes.stop, paths, name)
        if outcome == "stopped":
            stopped += 1
            console.print(Text("✓ ", style="green") + Text(f"{name} stopped (pid {pid})"))
        elif outcome == "killed":
            stopped += 1
            console.print(Text("✓ ", style="yellow") + Text(f"{name} did not stop in time; killed (pid {pid})"))
    if not sandboxes_done:
        await _sandboxes_at_down(console, scope, remove_sandboxes)
    if stopped:
        console.print("corral stack stopped", style="green")
    else:
        console.print(f"nothing was running (state dir {paths.root})")
    if purge:
        await asyncio.to_thread(_purge_state, console, paths)
        return
    from proxy.localvault import local_vault_dir

    kept = Text("kept: ", style="bold")
    kept.append(f"sessions and their logs in {paths.database}, process logs in {paths.logs}")
    if local_vault_dir(paths.root).is_dir():  # sealed once stopped; `corral up` unseals it
        kept.append(f", vaults and credentials in {local_vault_dir(paths.root)} (sealed)")
    blobs = os.environ.get(ENV_BLOB_STORE, "")
    if blobs:  # set by the CLI: the state dir's, or the user's own store
        kept.append(f", long sessions' earlier runs and large payloads in {blobs} (files' and skills' bytes too)")
    knowledge = os.environ.get(ENV_KNOWLEDGE_DB, "")
    if knowledge:
        kept.append(f", files' metadata, skills and memory stores in {knowledge}")
    console.print(kept)


def purge_list(paths: StatePaths) -> list[str]:
    """What `corral down --purge` removes, one line each, to show before asking."""
    lines = [
        f"the state dir {paths.root}: every session and its log, every vault and credential, logs and pid files",
        "every sandbox of this stack: containers, workspace volumes, networks",
    ]
    blobs = os.environ.get(ENV_BLOB_STORE, "")
    if blobs and not _inside(blobs, paths.root):
        lines.append(f"(not the blob store at {blobs}: it is outside the state dir, so it is yours to remove)")
    return lines


def _purge_state(console: Console, paths: StatePaths) -> None:
    import shutil

    if not paths.root.exists():
        console.print(f"nothing to remove: {paths.root} does not exist")
        return
    marks = (paths.stack_file, paths.database, paths.pids, paths.root / "openbao")
    if not any(mark.exists() for mark in marks):  # a --state-dir typo must not take a home directory with it
        raise CliError(
            f"{paths.root} does not look like a corral state dir (no stack.json, temporal.db, pids/ or "
            "openbao/ in it): nothing was removed",
            exit_code=2,
        )
    shutil.rmtree(paths.root)
    console.print(Text("✓ ", style="green") + Text(f"removed {paths.root}: sessions, vaults, logs and blobs in it"))
    console.print("kept: the sandbox images on the Docker engine (a cache; `docker image rm` removes them)")


def _inside(location: str, root: Path) -> bool:
    if "://" in location:
        return False
    return Path(location).resolve().is_relative_to(root.resolve())


async def _sandboxes_at_down(console: Console, scope: str | None, remove: bool) -> None:
    """Remove this stack's sandboxes (`--sandboxes`), or say which ones stay.

    Only the sandboxes of this stack's Temporal server (`scope`): other stacks and test runs may share the engine.
    A stack recorded before scopes were, or an engine that does not answer, is skipped with a note.
    """
    from sandbox import (
        SandboxError,
        connect_docker,
        list_sandbox_resources,
        remove_all_sandboxes,
        remove_pool_members,
    )

    if scope is None:
        if remove:
            _note(console, "no stack is recorded here, so no sandbox is known to be this stack's; none removed")
        return
    client = await asyncio.to_thread(connect_docker)
    if client is None:
        if remove:
            _note(console, "no Docker engine answers: no sandbox to remove")
        return
    try:
        if remove:
            with console.status("removing sandbox containers, workspace volumes and networks …"):
                try:
                    removed = await asyncio.to_thread(remove_all_sandboxes, client, scope)
                except SandboxError as exc:
                    raise CliError(f"could not remove every sandbox: {exc}") from None
            console.print(Text("✓ ", style="green") + Text(f"removed {removed.describe()}"))
            return
        try:
            pool = await asyncio.to_thread(remove_pool_members, client, scope)
        except SandboxError as exc:
            raise CliError(f"could not remove the warm pool: {exc}") from None
        if not pool.empty:
            console.print(
                Text("✓ ", style="green") + Text(f"removed the warm pool's idle sandboxes: {pool.describe()}")
            )
        found = await asyncio.to_thread(list_sandbox_resources, client, scope)
        if not found.empty:
            note = Text(f"kept on the Docker engine: {found.describe()}; ", style="yellow")
            note.append("`corral down --sandboxes` removes them", style="yellow")
            console.print(note)
    finally:
        client.close()
