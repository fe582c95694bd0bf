"""Issue 22's shell injection, end to end on the real Docker engine: the mount path
`/workspace/x"; touch /tmp/pwn; echo "` was pasted into a `bash -c` clone script and ran in the sandbox.

It is now refused at every edge with the field named: by the gateway (400) and by the contract, so a session started
straight through a Temporal client with it fails at start (never later, in an activity), and no sandbox is made. A
repository with an unusual but legitimate mount path and branch still clones (the clone is argv, `clone_commands`).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import anthropic
import docker
import pytest
from pydantic import ValidationError
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError

from corral.client import start_session
from corral.contract.session import SessionInput
from corral.converter import INVALID_INPUT
from corral.names import SESSION_WORKFLOW
from proxy import VaultStore
from sandbox.sessions import session_containers
from tests.conftest import Stack, texts, wait_for_idle
from tests.proxy_servers.devvault import shared_dev_vault
from tests.proxy_servers.git_server import GitServerLog, git
from tests.test_gateway import running_gateway
from tests.test_git_resources import git_world  # noqa: F401 - the fixture, shared

pytestmark = pytest.mark.timeout(300)

PAYLOAD = '/workspace/x"; touch /tmp/pwn; echo "'
TOOLSET = [{"type": "agent_toolset_20260401"}]


async def test_the_issues_mount_path_is_refused_by_the_gateway_and_nothing_is_written(
    stack: Stack, tmp_path: Path
) -> None:
    dev_vault = shared_dev_vault()
    vault = {"VAULT_ADDR": dev_vault.address, "VAULT_TOKEN": dev_vault.root_token.get_secret_value(),
             "CORRAL_VAULT_MOUNT": dev_vault.mount}  # fmt: skip
    async with running_gateway(stack, tmp_path, **vault) as gateway:
        client = await gateway.client("injector")
        agent = await client.beta.agents.create(name="coder", model=stack.script([{"text": "ok"}]))
        environment = await client.beta.environments.create(name="plain")
        resource = {"type": "github_repository", "url": "https://git.example.com/acme/app.git",
                    "authorization_token": "ghp_canary" + uuid.uuid4().hex, "mount_path": PAYLOAD}  # fmt: skip
        with pytest.raises(anthropic.BadRequestError) as refused:
            await client.beta.sessions.create(agent=agent.id, environment_id=environment.id, resources=[resource])  # type: ignore[list-item]
        assert refused.value.status_code == 400
        assert "resources[0].mount_path" in str(refused.value.body), refused.value.body
        assert [session async for session in client.beta.sessions.list()] == [], "no session was made"


@pytest.mark.parametrize("git_world", ["provisioned"], indirect=True)
async def test_the_issues_mount_path_fails_a_temporal_client_start_at_once(
    git_world: tuple[Stack, VaultStore, str, Path, GitServerLog, str],  # noqa: F811
    docker_client: docker.DockerClient,
) -> None:
    """The start input of a `temporal` CLI user (plain JSON, no client-side model): refused by the contract when the
    session starts. Were it accepted, the script's bash call would provision the sandbox and clone into PAYLOAD."""
    stack, store, url, _, _, token = git_world
    resource = {"type": "github_repository", "url": url, "repository_id": "app", "mount_path": PAYLOAD}
    with pytest.raises(ValidationError, match=r"resources\.0\.mount_path"):
        SessionInput.model_validate({"agent": {"model": "m"}, "resources": [resource]})
    session_id = f"sesn_{uuid.uuid4().hex[:26]}"
    store.store_repository_token(session_id, "app", url, token)
    model = stack.script([{"tool_uses": [{"name": "bash", "input": {"command": "ls /tmp"}}]}, {"text": "done"}])
    raw = {"agent": {"model": model, "tools": TOOLSET}, "message": "go", "resources": [resource],
           "model_task_queue": stack.model_queue}  # fmt: skip
    handle = await stack.client.start_workflow(SESSION_WORKFLOW, raw, id=session_id, task_queue=stack.harness_queue)
    stack.started.append(handle)
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == INVALID_INPUT, cause
    assert "resources" in cause.message and "mount_path" in cause.message, cause.message
    history = [event async for event in handle.fetch_history_events()]
    assert not any(event.HasField("activity_task_scheduled_event_attributes") for event in history), "no activity ran"
    assert session_containers(docker_client, session_id) == [], "no sandbox was made"
    assert stack.requests(model) == [], "no model turn was taken"


async def test_a_legitimate_repository_still_clones_as_argv(
    git_world: tuple[Stack, VaultStore, str, Path, GitServerLog, str],  # noqa: F811
    docker_client: docker.DockerClient,
) -> None:
    """A nested mount path with '.', '_' and '-', and a branch with '/' and '.': cloned, provisioned or claimed."""
    stack, store, url, bare, _, token = git_world
    git("--git-dir", str(bare), "branch", "feature/x-1.0", "main")
    mount, branch = "/workspace/src/my_app-2.0", "feature/x-1.0"
    session_id = f"sesn_{uuid.uuid4().hex[:26]}"
    store.store_repository_token(session_id, "app", url, token)
    probe = f"git -C {mount} rev-parse --abbrev-ref HEAD"
    model = stack.script([{"tool_uses": [{"name": "bash", "input": {"command": probe}}]}, {"text": "done"}])
    input = SessionInput.model_validate(
        {
            "agent": {"model": model, "tools": TOOLSET},
            "message": "look at the repo",
            "resources": [{"type": "github_repository", "url": url, "repository_id": "app", "mount_path": mount,
                           "checkout": {"type": "branch", "name": branch}}],
            "model_task_queue": stack.model_queue,
        }
    )  # fmt: skip
    handle = await start_session(stack.client, input, session_id=session_id, task_queue=stack.harness_queue)
    stack.started.append(handle)
    events = await wait_for_idle(handle, within_seconds=120)
    [result] = texts(events, "agent.tool_result")
    assert result.splitlines()[0] == branch, result
    assert len(session_containers(docker_client, session_id)) == 1
