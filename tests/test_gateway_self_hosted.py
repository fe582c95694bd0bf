"""Self-hosted environments at the gateway, driven by the official `anthropic` SDK against a real gateway process on
the real Temporal dev server: `config: {type: "self_hosted"}`, whose type never changes (the SDK's own typed
error); the environment's keys, issued, listed and revoked over HTTP and with `corral environment key`; and what
a session made in such an environment runs with, and refuses. Which routes each credential opens is
tests/test_token_scopes.py's."""

from __future__ import annotations

import asyncio
import hashlib
import os
import pty
import re
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import pytest
from anthropic.types.beta import BetaInvalidConfigTypeChangeError
from temporalio.client import WorkflowExecutionStatus
from typer.testing import CliRunner

from cli.main import app
from corral.apikeys import KEY_PREFIX
from corral.contract.session import SessionInput
from corral.contract.work import SelfHostedEnvironment, work_queue_id
from corral.envkeys import ENVIRONMENT_KEY_KIND, verify_environment_key
from corral.names import HARNESS_TASK_QUEUE
from corral.records import Records
from tests.conftest import Stack, history_text
from tests.test_gateway import Gateway, running_gateway
from tests.waits import until
from workers.roles import harness_worker

pytestmark = pytest.mark.timeout(300)

SELF_HOSTED = {"type": "self_hosted"}


@pytest.fixture
async def gateway(stack: Stack, tmp_path: Path) -> AsyncIterator[Gateway]:
    async with running_gateway(stack, tmp_path) as running:
        yield running


async def api(client: anthropic.AsyncAnthropic, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """A call to a corral extension, which the SDK has no method for, through the SDK's own client."""
    if method == "GET":
        return await client.get(path, cast_to=object)
    return await client.post(path, body=body or {}, cast_to=object)


async def test_a_self_hosted_environment_is_its_type_alone_and_its_type_never_changes(
    stack: Stack, gateway: Gateway
) -> None:
    client = await gateway.client("hosted")
    hosted = await client.beta.environments.create(name="laptop", config=SELF_HOSTED)  # type: ignore[arg-type]
    assert hosted.config.model_dump() == SELF_HOSTED
    assert (await client.beta.environments.retrieve(hosted.id)).config.model_dump() == SELF_HOSTED
    queue = await stack.client.get_workflow_handle(work_queue_id(hosted.id)).describe()
    assert queue.status == WorkflowExecutionStatus.RUNNING, "its queue runs from the start, for workers to poll"

    cloud = await client.beta.environments.create(name="box")
    before = [(await client.beta.environments.retrieve(e)).model_dump() for e in (hosted.id, cloud.id)]
    changes = ((hosted.id, {"type": "cloud"}), (hosted.id, {"type": "cloud", "networking": {"type": "unrestricted"}}),
               (cloud.id, SELF_HOSTED))  # fmt: skip
    for environment_id, config in changes:
        with pytest.raises(BetaInvalidConfigTypeChangeError, match="cannot change") as refused:
            await client.beta.environments.update(environment_id, config=config)  # type: ignore[arg-type]
        assert refused.value.status_code == 400
    for config in ({"type": "self_hosted", "networking": {"type": "unrestricted"}}, {"type": "docker"}):
        with pytest.raises(anthropic.BadRequestError, match="config"):
            await client.beta.environments.update(hosted.id, config=config)  # type: ignore[arg-type]
        with pytest.raises(anthropic.BadRequestError, match="config"):
            await client.beta.environments.create(name="refused", config=config)  # type: ignore[arg-type]
    assert [(await client.beta.environments.retrieve(e)).model_dump() for e in (hosted.id, cloud.id)] == before

    renamed = await client.beta.environments.update(hosted.id, name="desk", config=SELF_HOSTED)  # type: ignore[arg-type]
    assert (renamed.name, renamed.config.model_dump()) == ("desk", SELF_HOSTED)

    async def listed_both() -> bool:  # and only them: no refused create made one
        return sorted([e.id async for e in client.beta.environments.list()]) == sorted([hosted.id, cloud.id])

    await until(listed_both, "the two environments, and only them, are listed")


async def test_environment_keys_are_issued_listed_and_revoked_over_http(stack: Stack, gateway: Gateway) -> None:
    client = await gateway.client("keys")
    hosted = await client.beta.environments.create(name="laptop", config=SELF_HOSTED)  # type: ignore[arg-type]
    made = await api(client, "POST", f"/v1/environments/{hosted.id}/keys", {"name": "laptop worker"})
    key = made.pop("key")
    assert key.startswith(f"{KEY_PREFIX}{made['id']}-") and made["id"].startswith("envkey_")
    secret = key.removeprefix(f"{KEY_PREFIX}{made['id']}-")
    assert made == {"type": "environment_key", "id": made["id"], "environment_id": hosted.id, "name": "laptop worker",
                    "prefix": secret[:8], "created_at": made["created_at"],
                    "revoked_at": None}  # fmt: skip
    second = await api(client, "POST", f"/v1/environments/{hosted.id}/keys")
    assert second["name"] is None and second["key"] != key
    holder = await verify_environment_key(gateway.records, key)
    assert holder is not None and holder.environment_id == hosted.id
    record = await gateway.records.get_any(made["id"], kind=ENVIRONMENT_KEY_KIND)
    assert record.body["sha256"] == hashlib.sha256(secret.encode()).hexdigest()
    assert key not in await history_text(stack.client.get_workflow_handle(made["id"])), "stored hashed, never whole"

    async def listing() -> list[dict[str, Any]]:
        return list((await api(client, "GET", f"/v1/environments/{hosted.id}/keys"))["data"])

    async def both_listed() -> bool:
        return [shown["id"] for shown in await listing()] == [second["id"], made["id"]]

    await until(both_listed, "both keys are listed, newest first")
    assert all("key" not in shown for shown in await listing()), "a listing never shows a key"

    revoked = await api(client, "POST", f"/v1/environments/{hosted.id}/keys/{made['id']}/revoke")
    assert revoked["revoked_at"] is not None and revoked["id"] == made["id"]
    again = await api(client, "POST", f"/v1/environments/{hosted.id}/keys/{made['id']}/revoke")
    assert again["revoked_at"] == revoked["revoked_at"], "revoking again changes nothing"
    assert await verify_environment_key(gateway.records, key) is None
    assert await verify_environment_key(gateway.records, second["key"]) is not None, "the other key still works"

    async def revoked_listed() -> bool:
        return {shown["id"] for shown in await listing() if shown["revoked_at"] is not None} == {made["id"]}

    await until(revoked_listed, "the listing shows which key was revoked")

    cloud = await client.beta.environments.create(name="box")
    refusals: list[tuple[str, str, dict[str, Any] | None, type[Exception], str]] = [
        ("POST", f"/v1/environments/{cloud.id}/keys", None, anthropic.BadRequestError, "cloud environment"),
        ("GET", f"/v1/environments/{cloud.id}/keys", None, anthropic.BadRequestError, "cloud environment"),
        ("POST", f"/v1/environments/{hosted.id}/keys", {"name": 7}, anthropic.BadRequestError, "name"),
        ("POST", f"/v1/environments/{hosted.id}/keys", {"scope": "all"}, anthropic.BadRequestError, "scope"),
        ("POST", f"/v1/environments/{hosted.id}/keys/{hosted.id}/revoke", None, anthropic.BadRequestError, "key_id"),
        ("POST", f"/v1/environments/{hosted.id}/keys/envkey_nothing/revoke", None, anthropic.NotFoundError, "key"),
        ("POST", f"/v1/environments/{cloud.id}/keys/{second['id']}/revoke", None, anthropic.BadRequestError, "cloud"),
    ]  # fmt: skip
    for method, path, body, error, says in refusals:
        with pytest.raises(error, match=says):
            await api(client, method, path, body)
    other = await client.beta.environments.create(name="other", config=SELF_HOSTED)  # type: ignore[arg-type]
    with pytest.raises(anthropic.NotFoundError):  # a key is revoked through its own environment only
        await api(client, "POST", f"/v1/environments/{other.id}/keys/{second['id']}/revoke")
    assert await verify_environment_key(gateway.records, second["key"]) is not None


async def test_the_cli_issues_lists_and_revokes_environment_keys(stack: Stack, gateway: Gateway) -> None:
    """`corral environment key create|ls|revoke`, in-process (stdout captured), then `create` in its own process on
    a pseudo-terminal; through Temporal, as the CLI reaches records: the keys' records run on the public harness
    queue (the CLI's), served here for this test only."""
    client = await gateway.client("cli-keys")
    hosted = await client.beta.environments.create(name="laptop", config=SELF_HOSTED)  # type: ignore[arg-type]
    cloud = await client.beta.environments.create(name="box")
    address = stack.client.service_client.config.target_host
    runner = CliRunner()

    def corral(*args: str) -> Any:
        return runner.invoke(app, ["--address", address, "--namespace", stack.client.namespace, *args])

    records = Records(stack.client)
    made: list[str] = []
    async with harness_worker(stack.client, HARNESS_TASK_QUEUE):
        try:
            result = await asyncio.to_thread(corral, "environment", "key", "create", hosted.id, "--name", "desk")
            assert result.exit_code == 0, result.output
            key = result.stdout.removesuffix("\n")
            assert result.stdout == key + "\n" and key.startswith(f"{KEY_PREFIX}envkey_"), "only the key, captured"
            key_id = key.removeprefix(KEY_PREFIX).split("-", 1)[0]
            made.append(key_id)
            holder = await verify_environment_key(records, key)
            assert holder is not None and holder.environment_id == hosted.id

            async def cli_lists_it() -> bool:
                listing = await asyncio.to_thread(corral, "environment", "key", "ls", hosted.id)
                return listing.exit_code == 0 and key_id in listing.stdout and "desk" in listing.stdout

            await until(cli_lists_it, "`corral environment key ls` lists the key")
            listing = await asyncio.to_thread(corral, "environment", "key", "ls", hosted.id)
            assert key.removeprefix(f"{KEY_PREFIX}{key_id}-") not in listing.stdout, "never the secret"
            shown = await api(client, "GET", f"/v1/environments/{hosted.id}/keys")
            assert [k["id"] for k in shown["data"]] == [key_id], "the API lists the key the CLI made"

            revoked = await asyncio.to_thread(corral, "environment", "key", "revoke", hosted.id, key_id)
            assert revoked.exit_code == 0, revoked.output
            assert await verify_environment_key(records, key) is None
            failures = [
                (("create", cloud.id), 2, "cloud environment"),
                (("create", hosted.id, "--workspace", "someone-else"), 1, f"no environment {hosted.id}"),
                (("create", "env_nothing"), 1, "no environment env_nothing"),
                (("revoke", hosted.id, "envkey_nothing"), 1, "no key envkey_nothing"),
            ]
            for args, code, says in failures:
                refused = await asyncio.to_thread(corral, "environment", "key", *args)
                assert (refused.exit_code, says in refused.output) == (code, True), refused.output

            argv = ["--address", address, "--namespace", stack.client.namespace, "environment", "key", "create",
                    hosted.id]  # fmt: skip
            shown_once = await asyncio.to_thread(on_a_terminal, argv)
            [on_screen] = re.findall(rf"{re.escape(KEY_PREFIX)}envkey_[0-9a-z]+-[\w-]+", shown_once)
            made.append(on_screen.removeprefix(KEY_PREFIX).split("-", 1)[0])
            assert "shown once" in " ".join(shown_once.split()), shown_once
            assert await verify_environment_key(records, on_screen) is not None, "the key on screen is whole"
        finally:
            for key_id in made:  # nothing of this test stays on the public queue
                await records.delete(key_id, (await records.get_any(key_id)).workspace)


def on_a_terminal(argv: list[str]) -> str:
    """What `corral ARGV` shows when its output is a terminal (a pseudo-terminal: the real `isatty`)."""
    leader, follower = pty.openpty()
    try:
        done = subprocess.run([sys.executable, "-m", "cli.main", *argv], stdin=subprocess.DEVNULL, stdout=follower,
                              stderr=follower, timeout=120, env={**os.environ, "COLUMNS": "200"})  # fmt: skip
    finally:
        os.close(follower)
    shown = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # EIO: the terminal's other side is closed and everything was read
            break
        if not chunk:
            break
        shown += chunk
    os.close(leader)
    assert done.returncode == 0, shown
    return re.sub(r"\x1b\[[0-9;]*m", "", shown.decode())


async def test_a_session_in_a_self_hosted_environment_is_served_by_its_queue(stack: Stack, gateway: Gateway) -> None:
    client = await gateway.client("hosted-sessions")
    workspace = f"hosted-sessions-{gateway.suffix}"
    agent = await client.beta.agents.create(name="helper", model=stack.script([{"text": "ok"}], loop=True))
    hosted = await client.beta.environments.create(name="laptop", config=SELF_HOSTED)  # type: ignore[arg-type]
    queue = stack.client.get_workflow_handle(work_queue_id(hosted.id))
    await queue.terminate("the test ends it: a session's create starts it again")

    session = await client.beta.sessions.create(agent=agent.id, environment_id=hosted.id)
    history = await stack.client.get_workflow_handle(session.id).fetch_history()
    payloads = history.events[0].workflow_execution_started_event_attributes.input.payloads
    [started] = await stack.client.data_converter.decode(list(payloads), [SessionInput])
    assert started.environment == SelfHostedEnvironment(environment_id=hosted.id, workspace=workspace)
    assert (await queue.describe()).status == WorkflowExecutionStatus.RUNNING, "the session's create started it"
    assert (await client.beta.sessions.retrieve(session.id)).environment_id == hosted.id

    repository = {"type": "github_repository", "url": "https://git.example/acme/widgets.git",
                  "authorization_token": "ghp_" + "x" * 20}  # fmt: skip
    with pytest.raises(anthropic.BadRequestError, match="does not mount resources"):
        await client.beta.sessions.create(agent=agent.id, environment_id=hosted.id,
                                          resources=[repository])  # type: ignore[list-item]  # fmt: skip
    helper = await client.beta.agents.create(name="sub", model=stack.script([{"text": "ok"}]))
    lead = await client.beta.agents.create(name="lead", model=stack.script([{"text": "ok"}]),
                                           multiagent={"type": "coordinator", "agents": [helper.id]})  # fmt: skip
    with pytest.raises(anthropic.BadRequestError, match=r"agent\.multiagent"):
        await client.beta.sessions.create(agent=lead.id, environment_id=hosted.id)

    async def only_the_first() -> bool:
        return [s.id async for s in client.beta.sessions.list()] == [session.id]

    await until(only_the_first, "the workspace lists its session")
