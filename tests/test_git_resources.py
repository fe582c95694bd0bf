"""Git repositories as session resources: cloned into the sandbox and pushed from it through the git proxy, with
the token only in Vault and in the proxy process; never in the sandbox, history or events."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import docker
import pytest

from activities.proxy import ProxyActivities
from activities.sandbox import SandboxActivities
from corral.client import start_session
from corral.contract.sandbox import Environment
from corral.contract.session import SessionInput
from corral.serving import ServerThread
from corral.temporal import cluster_id
from proxy import GitProxyServer, VaultStore
from sandbox.pool import POOL_LABEL, PoolSettings, WarmPool
from sandbox.sessions import session_containers
from tests.conftest import (
    Stack,
    history_text,
    read_events,
    remove_sandboxes,
    terminate_sessions,
    texts,
    wait_for_idle,
)
from tests.ports import free_port
from tests.proxy_servers.devvault import shared_dev_vault
from tests.proxy_servers.git_server import GitServerLog, create_git_app, git, make_bare_repository
from tests.test_sandbox_pool import ready_for
from workers.proxy import proxy_worker
from workers.roles import sandbox_workers
from workers.sandbox import keeping_filled


@pytest.fixture(params=["provisioned", "from the warm pool"])
async def git_world(
    request: pytest.FixtureRequest, stack: Stack, docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> AsyncIterator[tuple[Stack, VaultStore, str, Path, GitServerLog, str]]:
    """A git server, the git proxy and the sandbox hand; with a warm pool that has learnt the recipe of a sandbox
    that clones (a claim clones into the member it takes), or with none."""
    token = f"ghp_canary{uuid.uuid4().hex}"
    root = tmp_path / "repos"
    root.mkdir()
    bare = make_bare_repository(root, "app", tmp_path / "scratch")
    log = GitServerLog()
    store = VaultStore(shared_dev_vault().client())
    port = free_port()
    git_proxy = GitProxyServer(store, host="0.0.0.0", port=port)
    git_proxy.start()
    warm = PoolSettings(size=1) if request.param == "from the warm pool" else None
    sandbox = SandboxActivities(
        docker_client, sandbox_image, await cluster_id(stack.client), git_proxy_port=port, pool=warm
    )
    stack.pool = sandbox.pool  # type: ignore[attr-defined]
    try:
        with ServerThread(create_git_app(root, token, log), name="git-server") as server:
            async with AsyncExitStack() as workers, keeping_filled(sandbox.pool):
                if sandbox.pool is not None:
                    await learn_the_cloning_recipe(sandbox.pool)
                await workers.enter_async_context(proxy_worker(stack.client, ProxyActivities(store)))
                for worker in sandbox_workers(stack.client, sandbox):
                    await workers.enter_async_context(worker)
                yield stack, store, f"{server.base_url}/app.git", bare, log, token
                await terminate_sessions(stack.started)
    finally:
        git_proxy.stop()
        remove_sandboxes(docker_client, stack.started)
        if sandbox.pool is not None:
            await sandbox.pool.remove_unclaimed()


async def learn_the_cloning_recipe(pool: WarmPool) -> None:
    """What a first session that clones does to the pool (its claim misses, and the pool learns its recipe:
    limited networking, for the way to the git proxy), then until a member of that recipe waits."""
    limited = Environment.model_validate({"networking": {"type": "limited", "allowed_hosts": ["git-host"]}})
    assert await pool.claim("learning", "corral-learning-g0", limited) is None
    await ready_for(pool, limited)


async def test_clone_and_push_through_the_git_proxy_with_no_token_in_the_sandbox(
    git_world: tuple[Stack, VaultStore, str, Path, GitServerLog, str], docker_client: docker.DockerClient
) -> None:
    stack, store, url, bare, log, token = git_world
    session_id = f"sesn_{uuid.uuid4().hex[:26]}"
    store.store_repository_token(session_id, "app", url, token)  # what `corral start --repo-token-file` does
    model = stack.script(
        [
            {"tool_uses": [{"name": "bash", "input": {"command": "cd /workspace/app && git log --oneline | wc -l"}}]},
            {
                "tool_uses": [
                    {
                        "name": "bash",
                        "input": {
                            "command": "cd /workspace/app && git checkout -q -b feature && echo more >> README.md && "
                            "git -c user.email=agent@corral.invalid -c user.name=agent commit -qam 'agent change' && "
                            "git push -q origin feature && git pull -q origin main && echo pushed"
                        },
                    }
                ]
            },
            {"tool_uses": [{"name": "bash", "input": {"command": "cat /workspace/app/.git/config; env"}}]},
            {"text": "done"},
        ]
    )
    input = SessionInput.model_validate(
        {
            "agent": {"model": model, "tools": [{"type": "agent_toolset_20260401"}]},
            "message": "work on the repo",
            "resources": [{"type": "github_repository", "url": url, "repository_id": "app",
                           "checkout": {"type": "branch", "name": "main"}}],
            "model_task_queue": stack.model_queue,
        }
    )  # fmt: skip
    handle = await start_session(stack.client, input, session_id=session_id, task_queue=stack.harness_queue)
    stack.started.append(handle)
    events = await wait_for_idle(handle, within_seconds=120)
    results = texts(events, "agent.tool_result")
    assert results[0] == "1", results
    assert results[1] == "pushed", results
    assert "/app" in results[2] and "pxr_" in results[2], "origin points at the git proxy"
    assert "agent change" in git("--git-dir", str(bare), "log", "--oneline", "feature"), "the push did not arrive"
    assert all(credentials == ("x-access-token", token) for credentials in log.credentials if credentials)
    [container] = session_containers(docker_client, session_id)
    pool: WarmPool | None = stack.pool  # type: ignore[attr-defined]
    assert (POOL_LABEL in container.labels) == (pool is not None), "the sandbox came from where it was meant to"
    filesystem = container.exec_run(["tar", "-cf", "-", "--exclude=/proc", "--exclude=/sys", "/"], user="0").output
    places = {
        "container filesystem": filesystem.decode("latin-1"),
        "history": await history_text(handle),
        "events": "\n".join(e.model_dump_json() for e in await read_events(handle)),
    }
    assert [where for where, text in places.items() if token in text] == []
