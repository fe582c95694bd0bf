"""Each thread of a multi-agent session keeps its own bash shell state in the session's one sandbox: the real engine
and image, the `execute` activity driven directly (as the session workflow calls it, with `shell` set to the thread's
id) and the resident runner asked raw."""

from __future__ import annotations

import asyncio
from typing import Any

import docker
import pytest
from pydantic import ValidationError
from temporalio.testing import ActivityEnvironment

from activities.sandbox import SandboxActivities
from corral.contract.activities import ExecuteInput
from corral.contract.sandbox import Environment, ProvisionInput, SandboxHandle
from sandbox.containers import ensure_container
from sandbox.runner import Runners
from sandbox.sessions import remove_session
from tests.conftest import unique

SHOW = 'pwd; echo "X=$X Y=$Y OWN=$OWN"'
"""What a shell's state looks like from inside: its working directory and the variables the test exports."""


async def test_threads_cd_and_export_in_shells_of_their_own_and_restart_resets_only_their_own(
    docker_client: docker.DockerClient, sandbox_image: str
) -> None:
    activities = SandboxActivities(docker_client, sandbox_image)
    environment = ActivityEnvironment()
    session_id = unique("shells")
    provision = ProvisionInput(session_id=session_id, environment=Environment(), generation=1)
    try:
        handle = await environment.run(activities.provision_sandbox, provision)

        async def run(shell: str | None, command: str | None = None, **extra: Any) -> str:
            input = {"command": command, **extra} if command is not None else extra
            call = ExecuteInput(
                session_id=session_id,
                tool_use_id=unique("toolu"),
                name="bash",
                input=input,
                sandbox=handle,
                shell=shell,
            )
            output: str = await environment.run(activities.execute, call)
            return output

        a, b = "sthr_" + "a" * 32, "sthr_" + "b" * 32
        assert await run(None, "mkdir -p /workspace/own && cd /workspace/own && export OWN=o") == "(no output)"
        # Side by side, as two threads' lanes run: neither save may overwrite the other's (nor a command's own
        # variable named `state` move where the shell is saved).
        await asyncio.gather(run(a, "cd /tmp && export X=1"), run(b, "state=busy; cd /var && export Y=2"))
        assert await run(a, SHOW) == "/tmp\nX=1 Y= OWN="
        assert await run(b, SHOW) == "/var\nX= Y=2 OWN="
        assert await run(None, SHOW) == "/workspace/own\nX= Y= OWN=o", "the session's own shell is untouched"

        fresh = "sthr_" + "c" * 32
        assert await run(fresh, SHOW) == "/workspace\nX= Y= OWN=", "a new thread starts as a fresh session does"

        assert (
            await run(a, restart=True) == "bash session restarted: working directory and exported variables are reset"
        )
        assert await run(a, SHOW) == "/workspace\nX= Y= OWN="
        assert await run(b, SHOW) == "/var\nX= Y=2 OWN=", "a thread's restart resets its own shell only"
        assert await run(None, SHOW) == "/workspace/own\nX= Y= OWN=o"

        assert (
            await run(b, SHOW, restart=True) == "/workspace\nX= Y= OWN=\n[bash session restarted before this command]"
        )
        assert await run(None, SHOW) == "/workspace/own\nX= Y= OWN=o"
        assert await run(None, "pwd", restart=True) == "/workspace\n[bash session restarted before this command]"
        assert await run(a, "cd /tmp && " + SHOW) == "/tmp\nX= Y= OWN=", "the session's restart leaves threads' shells"
        assert await run(a, "pwd") == "/tmp"
    finally:
        await asyncio.to_thread(remove_session, docker_client, session_id, True)


BAD_SHELLS = ["", "../state", "sthr_a/b", "..", "a b", "a.b", "x" * 65, "sthr_abc\n", "ü"]


@pytest.mark.parametrize("shell", BAD_SHELLS)
def test_the_contract_refuses_a_shell_name_that_is_not_a_plain_name(shell: str) -> None:
    handle = SandboxHandle(
        session_id="sesn_x", container_id="c", container_name="n", volume="v", image="i", task_queue="q", generation=1
    )
    with pytest.raises(ValidationError, match="shell"):
        ExecuteInput(session_id="sesn_x", tool_use_id="toolu_x", name="bash", input={}, sandbox=handle, shell=shell)
    ExecuteInput(session_id="sesn_x", tool_use_id="toolu_x", name="bash", input={}, sandbox=handle, shell="sthr_a-B_9")


async def test_the_runner_refuses_a_bad_shell_name_sent_raw_and_runs_nothing(
    docker_client: docker.DockerClient, sandbox_image: str
) -> None:
    session_id = unique("badshell")
    made = await asyncio.to_thread(ensure_container, docker_client, session_id, Environment(), 0, sandbox_image)
    runners = Runners(docker_client)
    request = {"workdir": "/workspace", "timeout": 10, "head": 1000, "tail": 1000}
    try:
        for n, shell in enumerate([*BAD_SHELLS, 7, ["sthr_a"]]):
            command = "cd /tmp; touch /workspace/ran"
            refused = await runners.request(
                made.container_id, "bash", 30, call=f"c{n}", command=command, shell=shell, **request
            )
            assert not refused["ok"] and "bad shell name" in refused["error"], (shell, refused)
            reset = await runners.request(made.container_id, "reset", 30, shell=shell)
            assert not reset["ok"] and "bad shell name" in reset["error"], (shell, reset)
        listing = await runners.request(
            made.container_id, "bash", 30, call="look", command="ls -A /run/corral/state /run/corral/calls", **request
        )
        assert listing["output"] == "/run/corral/calls:\nlook\n\n/run/corral/state:\n", "no call ran, no state made"
        named = await runners.request(
            made.container_id, "bash", 30, call="ok", command="pwd", shell="sthr_1", **request
        )
        assert (named["ok"], named["output"]) == (True, "/workspace\n")
    finally:
        runners.close()
        await asyncio.to_thread(remove_session, docker_client, session_id, True)
