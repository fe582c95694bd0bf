"""Hostile tool inputs against the real sandbox: path traversal, huge arguments, binary output, a fork bomb,
endless output. In each, the limits hold, the model sees what happened, the next call works (so the sandbox worker
is still up), and nothing outside the container is read or written."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import docker
import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from activities.sandbox import SandboxActivities
from corral.client import send_text
from corral.contract.activities import ExecuteInput
from corral.contract.errors import TOOL_ERROR
from corral.contract.events import SessionEvent
from corral.contract.sandbox import Environment, ProvisionInput
from sandbox.containers import MAX_COMMAND_BYTES
from sandbox.sessions import remove_session
from tests.conftest import Stack, assert_log_is_whole, texts, unique, wait_for_idle
from tests.test_sandbox import TOOLSET, bash, processes, session_containers, use


def results(events: list[SessionEvent]) -> list[tuple[str, bool]]:
    """(text, is_error) of every tool result, in order."""
    outputs = texts(events, "agent.tool_result")
    errors = [bool(e.is_error) for e in events if e.type == "agent.tool_result"]
    return list(zip(outputs, errors, strict=True))


async def test_paths_outside_the_workspace_reach_only_the_containers_own_files(
    sandbox_stack: Stack, docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    """`..`, absolute paths and symlinks lead the file tools around the container's own read-only root, never to
    the host's: a host file is not there, system files cannot be written, and /etc/shadow cannot be read."""
    canary = f"host-only-{uuid.uuid4().hex}"
    host_file = tmp_path / "host-secret.txt"
    host_file.write_text(canary)
    model = sandbox_stack.script(
        [
            use("read", file_path="../../etc/passwd"),
            use("read", file_path=str(host_file)),
            use("write", file_path="../../etc/cron.d/evil", content="* * * * * root id\n"),
            bash("ln -s / /workspace/root; ln -s /etc/shadow /workspace/shadow; echo linked"),
            use("write", file_path="root/usr/bin/evil", content="#!/bin/sh\n"),
            use("read", file_path="shadow"),
            use("edit", file_path="root/etc/passwd", old_string="root", new_string="toor", replace_all=True),
            use("grep", pattern=canary, path="../.."),
            use("glob", pattern="*", path=str(tmp_path)),
            bash(f"cat {host_file} 2>&1; ls /proc/1/root 2>&1 | head -1"),
            {"text": "probed"},
            bash("echo still-here"),
            {"text": "done"},
        ]
    )
    handle = await sandbox_stack.start(model, message="probe", tools=TOOLSET)
    events = await wait_for_idle(handle, within_seconds=120)
    assert_log_is_whole(events)
    (passwd, passwd_error), (host, host_error), (cron, cron_error), (linked, _), *rest = results(events)
    (evil, evil_error), (shadow, shadow_error), (edit, edit_error), (grep, _), (glob, glob_error), (cat, _) = rest
    [container] = session_containers(docker_client, handle.id)
    own_passwd = container.exec_run(["cat", "/etc/passwd"]).output.decode()
    assert not passwd_error and [line.split("\t", 1)[1] for line in passwd.splitlines()] == own_passwd.splitlines()
    assert "sandbox:x:1000:1000" in passwd
    assert host_error and "does not exist" in host
    assert cron_error and "Read-only file system" in cron
    assert linked == "linked"
    assert evil_error and "Read-only file system" in evil
    assert shadow_error and "Permission denied" in shadow
    assert edit_error and ("Read-only file system" in edit or "Permission denied" in edit)
    assert canary not in grep.replace(f"pattern {canary!r}", "")  # rg searched the container's root: no match
    assert glob_error and "is not a directory" in glob
    assert canary not in cat and "No such file or directory" in cat
    assert host_file.read_text() == canary
    await send_text(handle, "again")
    after = await wait_for_idle(handle, after=events[-1].position, within_seconds=60)
    assert texts(after, "agent.tool_result") == ["still-here"]


async def test_large_arguments_up_to_the_limits_run(sandbox_stack: Stack) -> None:
    """A write of 416 KB and a 200 KB command run (a heredoc is how a model writes a long script): both pass the
    128 KiB that Linux allows one command-line argument, so they reach the container on stdin."""
    content = "".join(f"line {n:06d} " + "z" * 40 + "\n" for n in range(8000))  # 416,000 bytes
    script = "cat > /workspace/gen.txt <<'EOF'\n" + "w" * 200_000 + "\nEOF\nwc -c < /workspace/gen.txt"
    model = sandbox_stack.script(
        [
            use("write", file_path="big.txt", content=content),
            bash("wc -c < /workspace/big.txt; tail -1 /workspace/big.txt"),
            bash(script),
            {"text": "done"},
        ]
    )
    handle = await sandbox_stack.start(model, message="go", tools=TOOLSET)
    events = await wait_for_idle(handle, within_seconds=120)
    assert_log_is_whole(events)
    (wrote, wrote_error), (size, _), (generated, generated_error) = results(events)
    assert not wrote_error and wrote == f"wrote {len(content)} bytes to /workspace/big.txt"
    assert size.splitlines() == [str(len(content)), content.splitlines()[-1]]
    assert not generated_error and generated == "200001"


async def test_a_command_past_the_limit_is_a_tool_error_and_the_session_goes_on(sandbox_stack: Stack) -> None:
    """A 600 KB command (past the 512 KiB limit) is a tool error that names the limit and the write tool; the next
    call runs."""
    model = sandbox_stack.script([bash("echo " + "h" * 600_000), bash("echo next"), {"text": "done"}])
    handle = await sandbox_stack.start(model, message="go", tools=TOOLSET)
    events = await wait_for_idle(handle, within_seconds=120)
    assert_log_is_whole(events)
    (refused, refused_error), (after, after_error) = results(events)
    assert refused_error and f"over the limit of {MAX_COMMAND_BYTES} bytes" in refused and "write tool" in refused
    assert (after, after_error) == ("next", False)


async def test_a_five_megabyte_command_is_refused_by_the_execute_activity(
    docker_client: docker.DockerClient, sandbox_image: str
) -> None:
    """5 MB in one command, straight to the sandbox's `execute` activity (no model would keep that in its context):
    a tool error naming the limit, and the same container runs the next call."""
    activities = SandboxActivities(docker_client, sandbox_image)
    environment = ActivityEnvironment()
    session_id = unique("hostile")
    provision = ProvisionInput(session_id=session_id, environment=Environment(), generation=1)
    try:
        handle = await environment.run(activities.provision_sandbox, provision)

        def call(command: str) -> ExecuteInput:
            tool_use_id = unique("toolu")
            return ExecuteInput(
                session_id=session_id, tool_use_id=tool_use_id, name="bash", input={"command": command}, sandbox=handle
            )

        with pytest.raises(ApplicationError) as refused:
            await environment.run(activities.execute, call("echo " + "x" * 5_000_000))
        assert refused.value.type == TOOL_ERROR and refused.value.non_retryable
        assert "the command is 5000005 bytes" in str(refused.value)
        assert await environment.run(activities.execute, call("echo next")) == "next"
    finally:
        await asyncio.to_thread(remove_session, docker_client, session_id, True)


async def test_binary_and_invalid_utf8_output_reach_the_model_as_text(sandbox_stack: Stack) -> None:
    """Random bytes, invalid UTF-8 and NUL characters in a command's output become text with replacement
    characters; reading a binary file is a tool error; the session goes on."""
    model = sandbox_stack.script(
        [
            bash("head -c 20000 /dev/urandom; echo; echo end-of-random"),
            bash("printf 'a\\xff\\xfeb\\x00c\\xc3\\n'"),
            bash("head -c 5000 /dev/urandom > /workspace/blob.bin; printf '\\x00' >> /workspace/blob.bin"),
            use("read", file_path="blob.bin"),
            bash("echo next"),
            {"text": "done"},
        ]
    )
    handle = await sandbox_stack.start(model, message="go", tools=TOOLSET)
    events = await wait_for_idle(handle, within_seconds=120)
    assert_log_is_whole(events)
    (random, random_error), (invalid, _), _, (binary, binary_error), (after, _) = results(events)
    assert not random_error and random.endswith("end-of-random")
    assert invalid == "a\ufffd\ufffdb\x00c\ufffd"
    assert binary_error and "looks like a binary file" in binary
    assert after == "next" and texts(events) == ["done"]


async def test_a_fork_bomb_hits_the_pids_limit_and_is_killed_at_its_timeout(
    sandbox_stack: Stack, docker_client: docker.DockerClient
) -> None:
    """A fork bomb stops at the container's pids limit, its whole process group is killed at the call's timeout,
    and the next call runs in the same container."""
    model = sandbox_stack.script(
        [
            bash("bomb() { bomb | bomb & }; bomb; sleep 600", timeout_ms=4000),
            bash("cat /sys/fs/cgroup/pids/pids.max; ps -e --no-headers | wc -l"),
            {"text": "done"},
        ]
    )
    environment = {"limits": {"pids": 64}}
    handle = await sandbox_stack.start(model, message="go", tools=TOOLSET, environment=environment)
    events = await wait_for_idle(handle, within_seconds=120)
    assert_log_is_whole(events)
    (bombed, _), (after, after_error) = results(events)
    assert "[timed out after 4s: the command and its child processes were killed]" in bombed
    assert "Resource temporarily unavailable" in bombed, "the pids limit stopped it"
    limit, count = after.split()
    assert not after_error and limit == "64" and int(count) < 10, after
    assert "bomb" not in processes(docker_client, handle.id)
    assert len(session_containers(docker_client, handle.id)) == 1


async def test_endless_output_is_cut_and_later_calls_still_work(
    sandbox_stack: Stack, docker_client: docker.DockerClient
) -> None:
    """`yes` until its timeout, twice, and a command that closes its output and sleeps on: each result is cut with
    a marker, each hung process is killed at its timeout, and the calls after them run normally."""
    model = sandbox_stack.script(
        [
            bash("yes", timeout_ms=5000),
            bash("echo first-after"),
            bash("yes endless", timeout_ms=5000),
            bash("exec >&- 2>&-; sleep 601", timeout_ms=2000),
            bash("echo second-after; df --output=avail -B1 /tmp | tail -1"),
            {"text": "done"},
        ]
    )
    handle = await sandbox_stack.start(model, message="go", tools=TOOLSET)
    events = await wait_for_idle(handle, within_seconds=180)
    assert_log_is_whole(events)
    (yes, _), (first, first_error), (endless, _), (closed, _), (second, second_error) = results(events)
    assert yes.startswith("y\ny\n") and "[output truncated:" in yes and len(yes) < 110_000
    assert "[output limit reached: the sandbox keeps at most 64 MB of bash output" in yes
    assert endless.startswith("endless\n") and "[output truncated:" in endless and len(endless) < 110_000
    assert (first, first_error) == ("first-after", False)
    assert "[timed out after 2s: the command and its child processes were killed]" in closed
    assert not second_error and second.splitlines()[0] == "second-after"
    assert "sleep 601" not in processes(docker_client, handle.id)
    [container] = session_containers(docker_client, handle.id)
    assert container.status == "running"
