"""The local stack's life cycle through the real CLI: vaults, files, skills and memory stores survive `corral down` /
`corral up`, `down` leaves no process of the stack behind (children included), and `down --purge` removes
everything, but only when confirmed."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

import anthropic
import pytest

from tests.ports import free_port
from tests.test_cli import corral, pids_in


def _processes() -> dict[int, tuple[int, int, str]]:
    """Every process now: pid -> (parent pid, process group, command line)."""
    found: dict[int, tuple[int, int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if fields[0] != "Z":
            found[int(entry.name)] = (int(fields[1]), int(fields[2]), command)
    return found


SKILL_MD = b"---\nname: kept\ndescription: Survives restarts.\n---\nStill here.\n"


async def _make_knowledge(api: str, key: str) -> dict[str, str]:
    """A file, a skill and a memory store with a memory, made through the stack's own gateway."""
    async with anthropic.AsyncAnthropic(base_url=api, api_key=key, max_retries=0) as client:
        uploaded = await client.beta.files.upload(file=("kept.txt", b"kept across restarts\n", "text/plain"))
        skill = await client.beta.skills.create(files=[("kept/SKILL.md", SKILL_MD)])
        store = await client.beta.memory_stores.create(name="kept")
        await client.beta.memory_stores.memories.create(store.id, path="/kept.md", content="still here")
        return {"file": uploaded.id, "skill": skill.id, "store": store.id}


async def _read_knowledge(api: str, key: str, made: dict[str, str]) -> dict[str, Any]:
    async with anthropic.AsyncAnthropic(base_url=api, api_key=key, max_retries=0) as client:
        content = await (await client.beta.files.download(made["file"])).read()
        skill = await client.beta.skills.retrieve(made["skill"])
        memories = [m async for m in client.beta.memory_stores.memories.list(made["store"], view="full")]
        return {
            "file": content,
            "skill": skill.display_name,
            "memories": [(m.path, m.content) for m in memories if m.type == "memory"],
        }


def _stack_processes(roots: set[int], state_dir: Path) -> set[int]:
    """The stack's processes: those recorded, their descendants and group members, and any process whose command
    line names the state dir."""
    table = _processes()
    members = {pid for pid in roots if pid in table}
    members |= {pid for pid, (_, group, _) in table.items() if group in roots}
    members |= {pid for pid, (_, _, command) in table.items() if str(state_dir) in command}
    grew = True
    while grew:
        children = {pid for pid, (parent, _, _) in table.items() if parent in members} - members
        members |= children
        grew = bool(children)
    return members


@pytest.mark.timeout(300)
def test_vaults_survive_down_and_up_nothing_is_left_running_and_purge_asks_first(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    env = {key: value for key, value in os.environ.items() if not key.startswith(("ANTHROPIC_", "CORRAL_", "VAULT_"))}
    env["CORRAL_STATE_DIR"] = str(state_dir)
    ports = ["--temporal-port", str(free_port()), "--ui-port", str(free_port()), "--model-port", str(free_port())]
    ports += ["--stream-port", str(free_port()), "--git-proxy-port", str(free_port()), "--api-port", str(free_port())]
    canary = "canary-durable-" + os.urandom(8).hex()
    api = f"http://127.0.0.1:{ports[ports.index('--api-port') + 1]}"
    try:
        up = corral(env, "up", *ports)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "OpenBao initialised in" in " ".join(up.stdout.split())
        vault_id = corral(env, "vault", "create", "kept").stdout.strip()
        added = corral(env, "vault", "add-credential", vault_id, "--mcp-server-url", "https://m.test/mcp", stdin=canary)
        assert added.returncode == 0, added.stderr
        credential_id = added.stdout.strip()
        key = corral(env, "api-key", "create", "--workspace", "kept").stdout.strip()
        knowledge = asyncio.run(_make_knowledge(api, key))

        running = _stack_processes(set(pids_in(state_dir).values()), state_dir)
        assert len(running) >= len(pids_in(state_dir)) >= 6
        down = corral(env, "down")
        assert down.returncode == 0, down.stdout + down.stderr
        assert f"vaults and credentials in {state_dir / 'openbao'} (sealed)" in " ".join(down.stdout.split())
        left = _stack_processes(running, state_dir) & set(_processes())
        assert not left, {pid: _processes().get(pid) for pid in left}

        again = corral(env, "up", *ports)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "OpenBao unsealed with the key in" in " ".join(again.stdout.split())
        listed = corral(env, "vault", "ls", vault_id)
        assert listed.returncode == 0 and credential_id in listed.stdout, listed.stdout + listed.stderr
        assert asyncio.run(_read_knowledge(api, key, knowledge)) == {
            "file": b"kept across restarts\n",
            "skill": "kept",
            "memories": [("/kept.md", "still here")],
        }
        for path in (state_dir / "openbao").rglob("*"):
            if path.is_file() and path.name != "init.json":
                assert canary.encode() not in path.read_bytes(), f"{path} holds the secret in clear"

        refused = corral(env, "down", "--purge")  # stdin is not a terminal: no one to ask
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert "--purge would remove" in refused.stderr and "--yes" in refused.stderr
        assert (state_dir / "temporal.db").exists() and pids_in(state_dir)
    finally:
        purge = corral(env, "down", "--purge", "--yes")
    assert purge.returncode == 0, purge.stdout + purge.stderr
    assert f"removed {state_dir}" in " ".join(purge.stdout.split())
    assert not state_dir.exists()
    assert not _stack_processes(set(), state_dir)


def test_purge_refuses_a_directory_that_is_not_a_state_dir(tmp_path: Path) -> None:
    """A `--state-dir` typo must not take a directory of the user's with it."""
    precious = tmp_path / "notes.txt"
    precious.write_text("mine")
    env = {key: value for key, value in os.environ.items() if not key.startswith("CORRAL_")}
    purge = corral(env, "--state-dir", str(tmp_path), "down", "--purge", "--yes")
    assert purge.returncode == 2, purge.stdout + purge.stderr
    assert "does not look like a corral state dir" in purge.stderr and "nothing was removed" in purge.stderr
    assert precious.read_text() == "mine"
