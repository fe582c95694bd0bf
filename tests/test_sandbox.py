"""The Docker sandbox behind `execute`, end to end: real engine, real dev server, real HTTP to the model."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import docker
import pytest
from pydantic import ValidationError
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle

from corral.client import send_text
from corral.contract.sandbox import Environment
from corral.names import SIGNAL_INTERRUPT
from sandbox.containers import ensure_container
from sandbox.egress import EGRESS_NETWORK, ensure_egress
from sandbox.runner import Runners
from sandbox.sessions import SESSION_LABEL, remove_session, volume_name
from tests.conftest import Stack, assert_log_is_whole, history_text, read_events, texts, unique, wait_for_idle
from tests.waits import until
from workers.sandbox import reap_closed_sessions

TOOLSET = [{"type": "agent_toolset_20260401"}]
ROOT = Path(__file__).resolve().parent.parent


def bash(command: str, **extra: Any) -> dict[str, Any]:
    return {"tool_uses": [{"name": "bash", "input": {"command": command, **extra}}]}


def use(name: str, **input: Any) -> dict[str, Any]:
    return {"tool_uses": [{"name": name, "input": input}]}


def session_containers(client: docker.DockerClient, session_id: str) -> list[Any]:
    """The session's containers now; one removed while they are listed (a replaced sandbox) is left out."""
    labelled = {"label": f"{SESSION_LABEL}={session_id}"}
    return client.containers.list(all=True, filters=labelled, ignore_removed=True)


def processes(client: docker.DockerClient, session_id: str) -> str:
    """The command lines running in the session's container ("" while it has none)."""
    running = [c for c in session_containers(client, session_id) if c.status == "running"]
    return "".join(c.exec_run(["ps", "-eo", "args"]).output.decode() for c in running)


async def until_running(client: docker.DockerClient, session_id: str, command: str) -> None:
    async def running() -> bool:
        return command in await asyncio.to_thread(processes, client, session_id)

    await until(running, f"{command!r} started in the session's container")


async def until_event(handle: WorkflowHandle, event_type: str, count: int = 1) -> None:
    for _ in range(400):
        types: list[str] = [e.type for e in await read_events(handle)]
        if types.count(event_type) >= count:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"fewer than {count} {event_type} events")


async def test_a_session_that_never_calls_a_tool_creates_no_container(
    sandbox_stack: Stack, docker_client: docker.DockerClient
) -> None:
    model = sandbox_stack.script([{"text": "no tools needed"}])
    handle = await sandbox_stack.start(model, message="hi", tools=TOOLSET)
    await wait_for_idle(handle)
    assert session_containers(docker_client, handle.id) == []


async def test_bash_keeps_cwd_and_exports_and_file_tools_work(
    sandbox_stack: Stack, docker_client: docker.DockerClient
) -> None:
    model = sandbox_stack.script(
        [
            bash("mkdir -p /workspace/src/app && cd /workspace/src && export GREETING=hello"),
            bash('pwd; echo "$GREETING"'),
            use("write", file_path="src/app/main.py", content="def main():\n    return 'hi'\n\nmain()\nmain()\n"),
            use("edit", file_path="src/app/main.py", old_string="nothing like this", new_string="x"),
            use("edit", file_path="src/app/main.py", old_string="main()", new_string="run()"),
            use("edit", file_path="src/app/main.py", old_string="return 'hi'", new_string="return 'hello'"),
            use("read", file_path="src/app/main.py", view_range=[1, 2]),
            use("glob", pattern="**/*.py"),
            use("grep", pattern="hello", path="src"),
            bash("exit 3"),
            bash("echo before; kill -9 $$"),  # the call's own shell killed: said so, never a silent "(no output)"
            {"text": "done"},
        ]
    )
    handle = await sandbox_stack.start(model, message="work", tools=TOOLSET)
    events = await wait_for_idle(handle, within_seconds=120)
    assert_log_is_whole(events)
    results = texts(events, "agent.tool_result")
    errors = [e.is_error for e in events if e.type == "agent.tool_result"]
    assert results[0] == "(no output)"
    assert results[1] == "/workspace/src\nhello", "cd and export must persist between bash calls"
    assert results[2].startswith("wrote ") and results[2].endswith("/workspace/src/app/main.py")
    assert "was not found" in results[3] and errors[3]
    assert "occurs 3 times" in results[4] and errors[4]  # def main(), main(), main()
    assert results[5] == "replaced 1 occurrence(s) in /workspace/src/app/main.py" and not errors[5]
    assert results[6] == "1\tdef main():\n2\t    return 'hello'"
    assert results[7] == "/workspace/src/app/main.py"
    assert results[8].strip() == "/workspace/src/app/main.py:2:    return 'hello'"
    assert results[9] == "[exit code 3]"
    assert results[10] == "before\n[killed by signal 9 (SIGKILL) before it finished]"
    assert errors[:3] == [False, False, False]


async def test_timeout_kills_the_command_inside_the_container(
    sandbox_stack: Stack, docker_client: docker.DockerClient
) -> None:
    model = sandbox_stack.script([bash("echo started; sleep 777", timeout_ms=1500), {"text": "ok"}])
    handle = await sandbox_stack.start(model, message="go", tools=TOOLSET)
    events = await wait_for_idle(handle, within_seconds=60)
    [result] = texts(events, "agent.tool_result")
    assert result.startswith("started\n") and "[timed out after 1.5s: the command" in result
    assert "sleep 777" not in processes(docker_client, handle.id)


async def test_interrupt_kills_the_command_inside_the_container(
    sandbox_stack: Stack, docker_client: docker.DockerClient
) -> None:
    model = sandbox_stack.script([bash("sleep 778"), {"text": "after"}])
    handle = await sandbox_stack.start(model, message="go", tools=TOOLSET)
    await until_event(handle, "agent.tool_use")
    for _ in range(100):  # wait until the command runs in the container
        if "sleep 778" in processes(docker_client, handle.id):
            break
        await asyncio.sleep(0.1)
    await handle.signal(SIGNAL_INTERRUPT)
    events = await wait_for_idle(handle, within_seconds=30)
    assert "interrupted" in texts(events, "agent.tool_result")[0]
    assert "sleep 778" not in processes(docker_client, handle.id)
    await send_text(handle, "next")
    assert texts(await wait_for_idle(handle, after=events[-1].position)) == ["after"]


async def test_a_dead_container_is_a_tool_error_and_the_next_call_gets_a_new_one(
    sandbox_stack: Stack, docker_client: docker.DockerClient
) -> None:
    model = sandbox_stack.script(
        [
            bash("echo kept > /workspace/keep.txt; echo tmp > /tmp/lost.txt; export LOST=1"),
            bash("sleep 60"),  # killed during the call
            bash('cat /workspace/keep.txt; ls /tmp; echo "LOST=${LOST:-unset}"'),
            # Killed between calls, before this one: the model takes 3 s to ask for it, time for the kill.
            {**bash("echo unreachable"), "first_token_latency": 3},
            bash("cat /workspace/keep.txt"),
            {"text": "done"},
        ]
    )
    handle = await sandbox_stack.start(model, message="go", tools=TOOLSET)
    await until_event(handle, "agent.tool_use", 2)
    await until_running(docker_client, handle.id, "sleep 60")
    [first] = session_containers(docker_client, handle.id)
    first.kill()
    await until_event(handle, "agent.tool_result", 3)
    [second] = [c for c in session_containers(docker_client, handle.id) if c.status == "running"]
    assert second.id != first.id
    second.kill()
    events = await wait_for_idle(handle, within_seconds=120)
    results = texts(events, "agent.tool_result")
    errors = [e.is_error for e in events if e.type == "agent.tool_result"]
    assert errors == [False, True, False, True, False]
    assert "the sandbox container stopped" in results[1] and "Files under /workspace survive" in results[1]
    assert results[2] == "kept\nLOST=unset", "workspace files survive; /tmp and exported variables do not"
    assert "exit code 137 (killed)" in results[3]
    assert results[4] == "kept"
    assert len({c.id for c in session_containers(docker_client, handle.id)}) == 3


def spawn_sandbox_worker(client: Client, image: str, log: Path) -> subprocess.Popen[bytes]:
    """A sandbox worker process on the default pool's queues (polling once it has started)."""
    address = client.service_client.config.target_host
    command = [sys.executable, "-m", "tests.sandbox_worker_process", "--address", address, "--image", image]
    return subprocess.Popen(command, cwd=ROOT, stdout=log.open("ab"), stderr=subprocess.STDOUT)


async def test_sandbox_worker_killed_mid_command_does_not_run_it_twice(
    stack: Stack, docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    model = stack.script(
        [
            bash("echo ran >> /workspace/count; sleep 4; echo finished"),
            bash("wc -l < /workspace/count"),
            {"text": "done"},
        ]
    )
    log = tmp_path / "sandbox-worker.log"
    first = spawn_sandbox_worker(stack.client, sandbox_image, log)
    second: subprocess.Popen[bytes] | None = None
    try:
        handle = await stack.start(model, message="go", tools=TOOLSET)
        await until_event(handle, "agent.tool_use")
        await until_running(docker_client, handle.id, "sleep 4")  # a loaded engine may take a while to provision
        first.send_signal(signal.SIGKILL)
        first.wait()
        second = spawn_sandbox_worker(stack.client, sandbox_image, log)
        events = await wait_for_idle(handle, within_seconds=90)
        results = texts(events, "agent.tool_result")
        assert results[0].startswith("finished") and "[recovered: this command had already run" in results[0]
        assert results[1] == "1", "the command ran twice"
        assert_log_is_whole(events)
    finally:
        for process in (first, second):
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
                process.wait(timeout=20)
        with contextlib.suppress(Exception):
            remove_session(docker_client, handle.id, remove_volume=True)


async def test_the_runner_reports_a_lost_call_unrun_and_a_killed_call_with_its_signal(
    docker_client: docker.DockerClient, sandbox_image: str
) -> None:
    session_id = unique("lost")
    made = await asyncio.to_thread(ensure_container, docker_client, session_id, Environment(), 0, sandbox_image)
    runners = Runners(docker_client)
    try:
        # A call whose process is gone without recording an exit code: its outcome is unknown.
        script = "mkdir -p /run/corral/calls/c1 && echo 999999 > /run/corral/calls/c1/pid"
        await asyncio.to_thread(docker_client.containers.get(made.container_id).exec_run, ["bash", "-c", script])
        request = {"workdir": "/workspace", "timeout": 10, "head": 100, "tail": 100}
        lost = await runners.request(made.container_id, "bash", 30, call="c1", command="echo ran", **request)
        assert (lost["status"], lost["recovered"], lost["output"]) == ("lost", True, "")
        fresh = await runners.request(made.container_id, "bash", 30, call="c2", command="echo ran", **request)
        assert (fresh["status"], fresh["recovered"], fresh["output"]) == ("done", False, "ran\n")
        killed = await runners.request(made.container_id, "bash", 30, call="c3", command="kill -9 $$", **request)
        assert (killed["status"], killed["signal"], killed["recovered"]) == ("killed", 9, False)
        assert len(runners) == 1
        await asyncio.to_thread(docker_client.containers.get(made.container_id).stop, timeout=1)
        for _ in range(100):
            if not len(runners):
                break
            await asyncio.sleep(0.05)
        assert len(runners) == 0, "the stream of a stopped container is not kept"
    finally:
        runners.close()
        await asyncio.to_thread(remove_session, docker_client, session_id, True)


async def test_the_runner_keeps_the_newest_call_records_only(
    docker_client: docker.DockerClient, sandbox_image: str
) -> None:
    """A session of thousands of calls must not fill the records' tmpfs; a call being retried is always recent."""
    session_id = unique("records")
    made = await asyncio.to_thread(ensure_container, docker_client, session_id, Environment(), 0, sandbox_image)
    runners = Runners(docker_client)
    request = {"command": "echo out", "workdir": "/workspace", "timeout": 10, "head": 100, "tail": 100}
    try:
        for n in range(300):
            answer = await runners.request(made.container_id, "bash", 30, call=f"c{n}", **request)
            assert answer["output"] == "out\n"
        count = {**request, "command": "ls /run/corral/calls | wc -l"}
        kept = await runners.request(made.container_id, "bash", 30, call="count", **count)
        assert int(kept["output"]) == 256 + 1, "the newest 256, and the call that counts them"
        again = await runners.request(made.container_id, "bash", 30, call="c299", **request)
        assert again["recovered"] and again["output"] == "out\n", "a recent call is answered from its record"
    finally:
        runners.close()
        await asyncio.to_thread(remove_session, docker_client, session_id, True)


async def test_a_runner_killed_mid_call_is_a_tool_error_and_the_next_call_gets_a_new_container(
    sandbox_stack: Stack, docker_client: docker.DockerClient
) -> None:
    model = sandbox_stack.script([bash("echo one"), bash("sleep 60"), bash("echo three"), {"text": "done"}])
    handle = await sandbox_stack.start(model, message="go", tools=TOOLSET)
    await until_event(handle, "agent.tool_use", 2)
    await until_running(docker_client, handle.id, "sleep 60")
    [first] = session_containers(docker_client, handle.id)
    # The runner is the container's main process (under Docker's init, pid 1): kill it, not the container.
    killed = await asyncio.to_thread(first.exec_run, ["pkill", "-KILL", "-x", "corral-runner"])
    assert killed.exit_code == 0, killed.output
    events = await wait_for_idle(handle, within_seconds=120)
    results = texts(events, "agent.tool_result")
    errors = [e.is_error for e in events if e.type == "agent.tool_result"]
    assert errors == [False, True, False]
    assert "the sandbox container stopped" in results[1] and "Files under /workspace survive" in results[1]
    assert results[2] == "three"
    assert len({c.id for c in session_containers(docker_client, handle.id)}) == 2
    assert_log_is_whole(events)


async def test_security_probes_inside_the_sandbox(
    sandbox_stack: Stack, docker_client: docker.DockerClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    canary = f"canary-{uuid.uuid4().hex}"
    monkeypatch.setenv("ANTHROPIC_API_KEY", canary)  # the worker process's environment must not leak in
    monkeypatch.setenv("CORRAL_TEST_SECRET_TOKEN", canary)
    probes = {
        "env": "env; cat /proc/1/environ | tr '\\0' '\\n'",
        "docker socket": "ls -la /var/run/docker.sock /run/docker.sock 2>&1; echo end",
        "network": "ls /sys/class/net; cat /proc/net/route | wc -l",
        "writes": "for p in /etc/x /usr/x /root/x /x /workspace/ok /tmp/ok; do touch $p 2>/dev/null && echo $p; done",
        "user": "id -u; id -g; grep CapEff /proc/self/status; grep NoNewPrivs /proc/self/status",
        # A pattern, not the canary itself: the probe's own command is in history too.
        "secrets on disk": "grep -rsoE 'canary-[0-9a-f]{32}' / --exclude-dir=proc --exclude-dir=sys | head -3; echo end",  # noqa: E501
        # The runner's stream carries every call's frames: a command must not read or write it through /proc.
        "runner stream": "p=$(pgrep -x corral-runner); ls /proc/$p/fd 2>&1; echo forged > /proc/$p/fd/1; echo end",
    }
    model = sandbox_stack.script([bash(command) for command in probes.values()] + [{"text": "probed"}])
    handle = await sandbox_stack.start(model, message="probe", tools=TOOLSET)
    events = await wait_for_idle(handle, within_seconds=120)
    results = dict(zip(probes, texts(events, "agent.tool_result"), strict=True))
    assert canary not in results["env"]
    suspicious = [
        line.split("=", 1)[0]
        for line in results["env"].splitlines()
        if any(word in line.split("=", 1)[0].upper() for word in ("KEY", "TOKEN", "SECRET", "PASSWORD", "DOCKER"))
    ]
    assert suspicious == [], f"credential-looking variables in the sandbox: {suspicious}"
    assert "No such file or directory" in results["docker socket"] and "srw" not in results["docker socket"]
    assert results["network"].split() == ["lo", "1"], "networking none: only loopback, no route"
    assert results["writes"].split() == ["/workspace/ok", "/tmp/ok"]
    user = results["user"].splitlines()
    assert user[:2] == ["1000", "1000"]
    assert user[2].split()[1] == "0000000000000000" and user[3].split()[1] == "1"
    assert results["secrets on disk"] == "end"
    assert results["runner stream"].count("Permission denied") == 2 and results["runner stream"].endswith("end")
    history = await history_text(handle)
    assert "probed" in history and canary not in history


async def test_idle_sandbox_is_stopped_and_started_again_on_the_next_call(
    sandbox_stack: Stack, docker_client: docker.DockerClient
) -> None:
    model = sandbox_stack.script(
        [bash("echo persisted > /workspace/f"), {"text": "first"}, bash("cat /workspace/f"), {"text": "second"}]
    )
    environment = {"idle_stop_seconds": 5}
    handle = await sandbox_stack.start(model, message="one", tools=TOOLSET, environment=environment)
    events = await wait_for_idle(handle, within_seconds=60)
    [container] = session_containers(docker_client, handle.id)
    assert container.status == "running"
    for _ in range(200):  # the workflow's idle timer stops it after 5 s
        container.reload()
        if container.status == "exited":
            break
        await asyncio.sleep(0.1)
    assert container.status == "exited", "an idle session's container must be stopped"
    await send_text(handle, "two")
    events = await wait_for_idle(handle, after=events[-1].position, within_seconds=60)
    assert texts(events, "agent.tool_result") == ["persisted"]
    container.reload()
    assert container.status == "running" and len(session_containers(docker_client, handle.id)) == 1


async def test_cancelling_a_session_removes_its_container_and_volume(
    sandbox_stack: Stack, docker_client: docker.DockerClient
) -> None:
    model = sandbox_stack.script([bash("echo x > /workspace/x"), {"text": "done"}])
    handle = await sandbox_stack.start(model, message="go", tools=TOOLSET)
    await wait_for_idle(handle, within_seconds=60)
    assert len(session_containers(docker_client, handle.id)) == 1
    await handle.cancel()
    with pytest.raises(WorkflowFailureError):  # the session ends as cancelled, after its clean-up
        await handle.result()
    for _ in range(200):
        volumes = docker_client.volumes.list(filters={"name": volume_name(handle.id)})
        if not session_containers(docker_client, handle.id) and not volumes:
            break
        await asyncio.sleep(0.1)
    assert session_containers(docker_client, handle.id) == []
    assert not docker_client.volumes.list(filters={"name": volume_name(handle.id)})
    assert (await read_events(handle))[-1].type == "session.status_terminated"


async def test_the_reaper_removes_sandboxes_of_terminated_sessions(
    sandbox_stack: Stack, docker_client: docker.DockerClient
) -> None:
    model = sandbox_stack.script([bash("true"), {"text": "done"}])
    kept = await sandbox_stack.start(model, message="go", tools=TOOLSET)
    ended = await sandbox_stack.start(model, message="go", tools=TOOLSET)
    for handle in (kept, ended):
        await wait_for_idle(handle, within_seconds=60)
    await ended.terminate("no code runs on terminate: the reaper cleans up")
    reaped = await reap_closed_sessions(sandbox_stack.client, docker_client)
    assert ended.id in reaped and kept.id not in reaped
    assert session_containers(docker_client, ended.id) == []
    assert len(session_containers(docker_client, kept.id)) == 1


async def test_environment_packages_limits_and_networking_are_applied(
    sandbox_stack: Stack, docker_client: docker.DockerClient
) -> None:
    probe = "jq --version; echo $(ls /sys/class/net); cat /sys/fs/cgroup/pids/pids.max"
    model = sandbox_stack.script([bash(probe), {"text": "ok"}])
    environment = {
        "packages": {"apt": ["jq"]},
        "limits": {"memory_mb": 256, "pids": 64, "cpus": 0.5},
        "networking": {"type": "unrestricted"},
        "working_dir": "/workspace/project",
    }
    handle = await sandbox_stack.start(model, message="go", tools=TOOLSET, environment=environment)
    events = await wait_for_idle(handle, within_seconds=300)
    [result] = texts(events, "agent.tool_result")
    lines = result.splitlines()
    assert len(lines) == 3, result
    assert lines[0] == "jq-1.6", "the apt package must be installed in the derived image"
    assert "eth0" in lines[1].split(), "unrestricted networking attaches the engine's bridge"
    assert lines[2] == "64"
    [container] = session_containers(docker_client, handle.id)
    config = container.attrs["HostConfig"]
    assert (config["Memory"], config["CpuQuota"], config["CpuPeriod"]) == (256 * 1024 * 1024, 50_000, 100_000)
    assert container.attrs["Config"]["Image"].startswith("corral-sandbox-packages:")
    assert container.attrs["Config"]["WorkingDir"] == "/workspace/project"


async def test_an_invalid_environment_is_rejected_before_the_session_starts(sandbox_stack: Stack) -> None:
    for environment, message in [
        ({"networking": {"type": "limited"}}, "needs allowed_hosts"),
        ({"networking": {"type": "limited", "allowed_hosts": ["exa mple.com"]}}, "not a host name"),
        ({"networking": {"allowed_hosts": ["example.com"]}}, "only to networking type 'limited'"),
        ({"working_dir": "/etc"}, "working_dir must be /workspace"),
        ({"packages": {"apt": ["jq; rm -rf /"]}}, "invalid package name"),
        ({"limits": {"memory_mb": 1}}, "memory_mb"),
        ({"bash_timeout_seconds": 900}, "must not exceed"),
    ]:
        with pytest.raises(ValidationError, match=re.escape(message)):
            await sandbox_stack.start("any", tools=TOOLSET, environment=environment)


async def test_limited_networking_reaches_only_allowed_hosts(
    sandbox_stack: Stack, docker_client: docker.DockerClient, sandbox_image: str
) -> None:
    # Two web servers on the egress proxy's routed network, both on this machine: one allowed, one not.
    names = {kind: unique(f"corral-test-{kind}") for kind in ("allowed", "denied")}
    servers = []
    for name in names.values():
        ensure_egress(docker_client, sandbox_image)
        servers.append(
            docker_client.containers.run(
                sandbox_image,
                ["python3", "-m", "http.server", "8000"],
                name=name,
                network=EGRESS_NETWORK,
                detach=True,
                remove=True,
            )
        )
    try:
        probe = (
            f"curl -s -o /dev/null -w '%{{http_code}} ' http://{names['allowed']}:8000/; "
            f"curl -s -o /dev/null -w '%{{http_code}} ' --proxytunnel http://{names['allowed']}:8000/; "
            f"curl -s -o /dev/null -w '%{{http_code}} ' http://{names['denied']}:8000/; "
            f"curl -s --noproxy '*' --max-time 3 http://{names['allowed']}:8000/ >/dev/null"
            " && echo direct || echo blocked"
        )
        model = sandbox_stack.script([bash(probe), {"text": "ok"}])
        environment = {"networking": {"type": "limited", "allowed_hosts": [names["allowed"]]}}
        handle = await sandbox_stack.start(model, message="go", tools=TOOLSET, environment=environment)
        events = await wait_for_idle(handle, within_seconds=120)
        [result] = texts(events, "agent.tool_result")
        assert result.split() == ["200", "200", "403", "blocked"], result
    finally:
        for server in servers:
            with contextlib.suppress(docker.errors.APIError):
                server.kill()


async def test_ten_megabytes_of_output_are_cut_with_a_marker_and_the_session_goes_on(sandbox_stack: Stack) -> None:
    model = sandbox_stack.script(
        [bash("head -c 10000000 /dev/zero | tr '\\0' 'x'; echo; echo tail-line"), bash("echo next"), {"text": "ok"}]
    )
    handle = await sandbox_stack.start(model, message="go", tools=TOOLSET)
    events = await wait_for_idle(handle, within_seconds=120)
    first, second = texts(events, "agent.tool_result")
    assert "[output truncated: 9900011 of 10000011 bytes cut; the whole output is kept: `corral output" in first
    assert first.endswith("tail-line") and len(first) < 110_000
    assert second == "next" and texts(events) == ["ok"]
