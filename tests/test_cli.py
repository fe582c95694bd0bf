"""The `corral` CLI: argument and error handling in-process, and one real end-to-end run of the local stack.

No mocks: the quick tests hit real validation and a real (refused) connection; the end-to-end test starts the
Temporal dev server, the offline model server and the workers as real detached processes, then stops them.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import docker
import pytest
from typer.testing import CliRunner

from cli.main import app
from cli.session_ops import build_session_input
from tests.ports import closed_port, free_port

runner = CliRunner()


def invoke(state_dir: Path, *args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["--state-dir", str(state_dir), *args])
    return result.exit_code, result.output


# ---- quick, in-process -------------------------------------------------------------------------------------------


def test_bad_input_file_exits_2_naming_the_fields(tmp_path: Path) -> None:
    bad = tmp_path / "session.json"
    bad.write_text(json.dumps({"agent": {"model": "m", "max_tokens": 0}, "titel": "typo"}))
    code, output = invoke(tmp_path, "start", "--input", str(bad))
    assert code == 2, output
    assert "agent.max_tokens" in output
    assert "titel" in output
    assert "Traceback" not in output


def test_input_file_that_is_not_json_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "session.json"
    bad.write_text("{not json")
    code, output = invoke(tmp_path, "start", "--input", str(bad))
    assert code == 2, output
    assert "not valid JSON" in output


def test_send_to_a_stopped_stack_says_run_corral_up(tmp_path: Path) -> None:
    with closed_port() as port:  # nothing listens here
        address = f"127.0.0.1:{port}"
        code, output = invoke(tmp_path, "--address", address, "send", "sesn_nothing", "hello")
    assert code == 1, output
    assert f"cannot reach Temporal at {address}" in output
    assert "corral up" in output
    assert "Traceback" not in output


def test_unknown_event_type_is_a_usage_error(tmp_path: Path) -> None:
    code, output = invoke(tmp_path, "events", "sesn_x", "--type", "agent.nonsense")
    assert code == 2
    assert "agent.nonsense" in output


def test_down_and_status_with_nothing_running(tmp_path: Path) -> None:
    code, output = invoke(tmp_path, "down")
    assert code == 0 and "nothing was running" in output and "lost:" not in output
    code, output = invoke(tmp_path, "status")
    assert code == 0 and "no corral processes" in output


def test_options_override_the_input_file() -> None:
    base = {"agent": {"model": "from-file", "tools": [{"type": "corral_utility"}]}, "title": "t"}
    merged = build_session_input(base, default_model="d", model="m", message="hi", tool_utility=False)
    assert merged.agent.model == "m" and merged.agent.tools == [] and merged.message == "hi"
    assert build_session_input({"agent": {}}, default_model="d").agent.model == "d"
    defaults = build_session_input(None, default_model="d").agent.tools
    assert [tool.type for tool in defaults] == ["corral_utility", "agent_toolset_20260401"]
    without = build_session_input(None, default_model="d", toolset=False).agent.tools
    assert [tool.type for tool in without] == ["corral_utility"]
    # A file's tools are its own: a configured toolset is kept as configured when no option is given.
    bash_only = {"type": "agent_toolset_20260401", "default_config": {"enabled": False},
                 "configs": [{"name": "bash", "enabled": True}]}  # fmt: skip
    kept = build_session_input({"agent": {"tools": [bash_only]}}, default_model="d", from_file=True).agent
    assert [tool.name for tool in kept.resolved_tools()] == ["bash"]


# ---- end to end, real processes -------------------------------------------------------------------------------


def corral(
    env: dict[str, str], *args: str, timeout: float = 120, stdin: str | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """Run the CLI as a user would, in its own process with stdout captured (not a terminal)."""
    return subprocess.run(
        [sys.executable, "-m", "cli.main", *args],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        input=stdin,
    )


def _temporal_cli() -> list[str]:
    from corral.temporal import temporal_binary

    return [temporal_binary()]


def pids_in(state_dir: Path) -> dict[str, int]:
    return {path.stem: int(path.read_text()) for path in (state_dir / "pids").glob("*.pid")}


def is_gone(pid: int) -> bool:
    """`os.kill(pid, 0)` fails, or only a zombie waiting for its reaper (init) is left."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    status = Path(f"/proc/{pid}/status")
    return status.exists() and "\nState:\tZ" in status.read_text()


@pytest.mark.timeout(240)
def test_up_start_tail_events_ls_down(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    env = {key: value for key, value in os.environ.items() if not key.startswith(("ANTHROPIC_", "CORRAL_"))}
    env["CORRAL_STATE_DIR"] = str(state_dir)  # Offline mode: no ANTHROPIC_API_KEY in this environment.
    env["GITHUB_TOKEN"] = "canary-user-credential-" + os.urandom(8).hex()  # must reach no process but the workers
    ports = ["--temporal-port", str(free_port()), "--ui-port", str(free_port()), "--model-port", str(free_port())]
    ports += ["--stream-port", str(free_port()), "--git-proxy-port", str(free_port()), "--api-port", str(free_port())]
    started: dict[str, int] = {}
    try:
        up = corral(env, "up", *ports)
        assert up.returncode == 0, up.stdout + up.stderr
        assert "offline stand-in" in up.stdout
        started = pids_in(state_dir)
        assert set(started) == {
            "temporal",
            "vault",
            "proxy-worker",
            "model-server",
            "stream-relay",
            "gateway",
            "all-in-one",
        }

        # Closed sessions are kept 30 days, not the dev server's one day.
        described = subprocess.run(
            [*_temporal_cli(), "operator", "namespace", "describe", "--namespace", "default", "--output", "json",
             "--address", f"127.0.0.1:{ports[1]}"],
            capture_output=True, text=True, timeout=30, check=True,
        )  # fmt: skip
        assert json.loads(described.stdout)["config"]["workflowExecutionRetentionTtl"] == "2592000s"

        start = corral(env, "start", "please calculate 2+2")
        assert start.returncode == 0, start.stderr
        session_id = start.stdout.strip()
        assert re.fullmatch(r"sesn_[0-9a-f]+", session_id), start.stdout

        tail = corral(env, "tail", session_id, timeout=90)
        assert tail.returncode == 0, tail.stderr
        assert "calculate" in tail.stdout
        assert "2+2 = 4" in tail.stdout
        assert "session.status_idle" in tail.stdout

        events = corral(env, "events", session_id, "--type", "agent.tool_result", "--json")
        assert events.returncode == 0, events.stderr
        results = [json.loads(line) for line in events.stdout.splitlines()]
        assert [result["type"] for result in results] == ["agent.tool_result"]
        assert results[0]["content"][0]["text"] == "2+2 = 4" and not results[0]["is_error"]

        listing = corral(env, "ls")
        assert listing.returncode == 0, listing.stderr
        assert session_id in listing.stdout

        # Fork: a new session from a point of this one's log (only its id on stdout); a position it lacks is refused.
        forked = corral(env, "fork", session_id, "--at", "3")
        assert forked.returncode == 0, forked.stderr
        fork_id = forked.stdout.strip()
        assert re.fullmatch(r"sesn_[0-9a-f]+", fork_id) and fork_id != session_id
        fork_events = [json.loads(line) for line in corral(env, "events", fork_id, "--json").stdout.splitlines()]
        source_events = [json.loads(line) for line in corral(env, "events", session_id, "--json").stdout.splitlines()]
        assert fork_events[:3] == source_events[:3]
        beyond = corral(env, "fork", session_id, "--at", "9999")
        assert beyond.returncode == 2 and "whose log holds positions 1 to" in beyond.stderr

        # Export: the whole log as JSON Lines, to a file that appears only when complete, or to stdout.
        exported = corral(env, "export", session_id, "--output", str(tmp_path / "log.jsonl"))
        assert exported.returncode == 0, exported.stderr
        lines = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
        assert [event["position"] for event in lines] == list(range(1, len(lines) + 1)) and len(lines) >= 6
        assert f"exported {len(lines)} events of {session_id}" in exported.stderr
        to_stdout = corral(env, "export", session_id).stdout
        assert to_stdout.splitlines() == (tmp_path / "log.jsonl").read_text().splitlines()
        nowhere = corral(env, "export", session_id, "--output", str(tmp_path / "missing" / "log.jsonl"))
        assert nowhere.returncode == 2 and "is not a directory" in nowhere.stderr

        # Content a model or tool wrote reaches the terminal escaped, never as control characters.
        hostile = corral(env, "start", "--no-toolset", "hi \x1b]0;owned\x07\x1b[2J there")
        assert hostile.returncode == 0, hostile.stderr
        hostile_id = hostile.stdout.strip()
        shown = corral(env, "tail", hostile_id, timeout=90)
        assert shown.returncode == 0, shown.stderr
        assert "\x1b" not in shown.stdout and "\x07" not in shown.stdout
        assert "hi \\x1b]0;owned\\x07\\x1b[2J there" in shown.stdout
        assert "\x1b" not in corral(env, "events", hostile_id, "--json").stdout

        # A terminated session is reported as terminated, not as missing; one that never ran says why it is silent.
        temporal = [*_temporal_cli(), "--address", f"127.0.0.1:{ports[1]}"]
        subprocess.run([*temporal, "workflow", "terminate", "--workflow-id", hostile_id], check=True, timeout=30)
        after_terminate = corral(env, "events", hostile_id)  # the log, then how it ended (exit 3)
        assert after_terminate.returncode == 3 and "session.status_idle" in after_terminate.stdout
        assert f"session {hostile_id} was terminated at" in " ".join(after_terminate.stderr.split())
        never_ran = "sesn_never" + os.urandom(4).hex()
        start_args = ["--type", "SessionWorkflow", "--task-queue", "nobody-polls", "--workflow-id", never_ran]
        subprocess.run(
            [*temporal, "workflow", "start", *start_args, "--input", '{"agent": {"model": "m"}}'], check=True
        )
        subprocess.run([*temporal, "workflow", "terminate", "--workflow-id", never_ran], check=True, timeout=30)
        silent = corral(env, "events", never_ran)
        assert silent.returncode == 1
        assert f"session {never_ran} is terminated" in silent.stderr and "Traceback" not in silent.stderr
        missing = corral(env, "events", "sesn_" + "0" * 26)
        assert missing.returncode == 1 and "no session sesn_" in missing.stderr

        # A demo that fails names the step, shows the tool's own error and what is still running; no traceback.
        fake_git = tmp_path / "bin" / "git"
        fake_git.parent.mkdir()
        fake_git.write_text("#!/bin/sh\necho 'fatal: simulated git failure' >&2\nexit 128\n")
        fake_git.chmod(0o755)
        failing = corral({**env, "PATH": f"{fake_git.parent}:{env['PATH']}"}, "demo", *ports, timeout=120)
        assert failing.returncode == 1, failing.stdout + failing.stderr
        assert "making the demo git repository failed" in failing.stderr
        assert "fatal: simulated git failure" in failing.stderr
        assert "the stack is still running" in failing.stderr and "corral down" in failing.stderr
        assert "Traceback" not in failing.stdout + failing.stderr

        # Vaults: the secret goes in on stdin and never comes back out.
        canary = "canary-secret-" + os.urandom(8).hex()
        created = corral(env, "vault", "create", "team")
        assert created.returncode == 0, created.stderr
        vault_id = created.stdout.strip()
        added = corral(
            env, "vault", "add-credential", vault_id, "--mcp-server-url", "https://mcp.example/mcp", stdin=canary
        )
        assert added.returncode == 0, added.stderr
        again_added = corral(
            env, "vault", "add-credential", vault_id, "--mcp-server-url", "https://mcp.example/mcp", stdin="x"
        )
        assert again_added.returncode == 1 and "already" in again_added.stderr.lower()
        listed = corral(env, "vault", "ls", vault_id)
        assert listed.returncode == 0 and added.stdout.strip() in listed.stdout and "static_bearer" in listed.stdout
        outputs = [out for result in (created, added, again_added, listed) for out in (result.stdout, result.stderr)]
        assert not [text for text in outputs if canary in text]
        assert "proxy-worker" in pids_in(state_dir) and "vault" in pids_in(state_dir)
        vault_environ = Path(f"/proc/{started['vault']}/environ").read_bytes()
        assert env["GITHUB_TOKEN"].encode() not in vault_environ, "OpenBao got the user's environment"
        environ = {name: Path(f"/proc/{pid}/environ").read_bytes() for name, pid in started.items() if name != "vault"}
        assert [name for name, text in environ.items() if b"VAULT_TOKEN=" in text] == ["proxy-worker"]

        again = corral(env, "up", *ports)
        assert again.returncode == 0, again.stdout + again.stderr
        assert again.stdout.count("already running") == 7
        assert pids_in(state_dir) == started
    finally:
        down = corral(env, "down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert "stopped" in down.stdout
    assert f"kept: sessions and their logs in {state_dir / 'temporal.db'}" in " ".join(down.stdout.split())
    assert f"large payloads in {env.get('CORRAL_BLOB_STORE') or state_dir / 'blobs'}" in " ".join(down.stdout.split())
    assert f"vaults and credentials in {state_dir / 'openbao'} (sealed)" in " ".join(down.stdout.split())
    assert not list((state_dir / "pids").glob("*.pid"))
    assert all(is_gone(pid) for pid in started.values()), started


@pytest.mark.timeout(300)
def test_demo_runs_end_to_end_with_mcp_and_a_git_push(tmp_path: Path) -> None:
    """The README's main command, as a newcomer runs it: the default state dir (`.corral`, relative) in a fresh
    directory; tools, the sandbox, an MCP call through the proxy, a git push, a graded outcome and a multi-agent run,
    offline. Then
    `corral down --sandboxes` removes the sandboxes of this stack (and only those: other runs may share the engine)."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("ANTHROPIC_", "CORRAL_", "VAULT_"))}
    ports = ["--temporal-port", str(free_port()), "--ui-port", str(free_port()), "--model-port", str(free_port())]
    ports += ["--stream-port", str(free_port()), "--git-proxy-port", str(free_port()), "--api-port", str(free_port())]
    engine = docker.from_env()
    stack_file = tmp_path / ".corral" / "stack.json"
    try:
        demo = corral(env, "demo", *ports, timeout=280, cwd=tmp_path)
        assert demo.returncode == 0, demo.stdout[-3000:] + demo.stderr[-3000:]
        assert (tmp_path / ".corral" / "temporal.db").is_file(), "the default state dir, relative to where it ran"
        assert "6*7 = 42" in demo.stdout
        assert "8 words" in demo.stdout, "the MCP call through the proxy"
        assert "replaced 1 occurrence(s) in /workspace/demo/README.md" in demo.stdout, "the edit in the sandbox"
        assert "branch demo-change arrived at the demo git server" in demo.stdout
        # The outcome: the stand-in grader finds the agent's sum-up meets the rubric, on the first cycle.
        assert "span.outcome_evaluation_end" in demo.stdout and "satisfied after 1 grading cycle(s)" in demo.stdout
        # The multi-agent run: two threads on the shared hands (bash in the sandbox, the utility hand), summed up.
        assert "multi-agent run: 2 threads" in demo.stdout
        assert re.search(r"replied: Linux \S+", demo.stdout), "shell's bash in the shared sandbox"
        assert re.search(r"replied: \d{4}-\d\d-\d\dT", demo.stdout), "clock's get_time on the utility hand"
        assert "Both threads replied:" in demo.stdout, "the coordinator's answer"
    finally:
        scope = json.loads(stack_file.read_text()).get("cluster_id") if stack_file.exists() else None
        down = corral(env, "down", "--sandboxes", cwd=tmp_path)
    assert down.returncode == 0, down.stdout + down.stderr
    assert scope, "the stack records its Temporal cluster id, which labels its sandboxes"
    assert re.search(r"removed \d+ containers?", down.stdout), down.stdout
    labelled = {"label": f"corral.scope={scope}/default"}
    assert not engine.containers.list(all=True, filters=labelled)
    assert not engine.volumes.list(filters=labelled)
