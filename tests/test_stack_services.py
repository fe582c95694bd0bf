"""The stack's services as data (`cli.stack.SERVICES`): their order, which ones a `corral up` wants, and the
environment each one gets; test_cli.py runs the real stack and reads /proc/*/environ. One test here runs the real
`corral up` for the Managed Agents API: the gateway answers, `status` shows it, docs/api.md's example works."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from cli import stack, up
from cli.stack import Plan, UpOptions
from tests.ports import free_port
from tests.test_cli import corral, is_gone, pids_in

ROOT = Path(__file__).resolve().parent.parent
SECRETS = {"ANTHROPIC_API_KEY": "sk-real", "ANTHROPIC_AUTH_TOKEN": "tok", "VAULT_TOKEN": "root", "BAO_TOKEN": "b",
           "CORRAL_STREAM_TOKEN": "the-users-own"}  # fmt: skip


def _plan(tmp_path: Path, *, offline: bool = True, split: bool = False) -> Plan:
    workers = stack.SPLIT_WORKERS if split else (stack.ALL_IN_ONE,)
    vault = {"VAULT_ADDR": "http://127.0.0.1:8200", "VAULT_TOKEN": "root"}
    return Plan(stack.StatePaths(tmp_path), UpOptions(split=split), "default", None, offline, workers, True, vault)


def test_each_service_starts_after_what_it_needs() -> None:
    started: set[str] = set()
    for service in stack.SERVICES:
        assert set(service.after) <= started, f"{service.name} needs {set(service.after) - started} first"
        started.add(service.name)
    assert stack.PROCESS_ORDER[0] == stack.TEMPORAL and stack.PROCESS_ORDER[-1] == stack.ALL_IN_ONE


@pytest.mark.parametrize(("offline", "split"), [(True, False), (False, True)])
def test_what_an_up_starts_follows_the_model_mode_and_the_layout(tmp_path: Path, offline: bool, split: bool) -> None:
    wanted = {service.name for service in stack.SERVICES if service.when(_plan(tmp_path, offline=offline, split=split))}
    workers = set(stack.SPLIT_WORKERS) if split else {stack.ALL_IN_ONE}
    servers = {stack.TEMPORAL, stack.VAULT, stack.STREAM_RELAY, stack.GATEWAY, stack.PROXY_WORKER, stack.DOCKERD}
    assert wanted == servers | workers | ({stack.MODEL_SERVER} if offline else set())


def test_only_model_roles_see_model_credentials_and_only_the_proxy_sees_vaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)
    for offline in (True, False):
        for split in (True, False):
            plan = _plan(tmp_path, offline=offline, split=split)
            plan.sandbox_image = "corral-sandbox:test"
            plan.gateway_vault_env = {
                "VAULT_ADDR": "http://127.0.0.1:8200",
                "VAULT_ROLE_ID": "r",
                "VAULT_SECRET_ID": "s",
            }
            plan.stream_token = "relay-token"
            for service in stack.SERVICES:
                if service.command is None or not service.when(plan):
                    continue
                env = up.environment(service, plan)
                assert ("VAULT_TOKEN" in env) == (service.name == stack.PROXY_WORKER), service.name
                assert ("VAULT_SECRET_ID" in env) == (service.name == stack.GATEWAY), service.name
                assert "BAO_TOKEN" not in env
                relay_side = service.name in (stack.STREAM_RELAY, stack.GATEWAY, stack.MODEL_WORKER, stack.ALL_IN_ONE)
                assert (env.get(stack.STREAM_TOKEN_ENV) == "relay-token") == relay_side, service.name
                model_role = service.name in (stack.MODEL_WORKER, stack.ALL_IN_ONE)
                assert ("ANTHROPIC_API_KEY" in env) == model_role, service.name
                if model_role:
                    expected = up.OFFLINE_API_KEY if offline else "sk-real"
                    assert env["ANTHROPIC_API_KEY"] == expected
                    assert ("ANTHROPIC_AUTH_TOKEN" in env) == (not offline)


@pytest.mark.timeout(300)
def test_corral_up_serves_the_managed_agents_api_and_the_readme_example_runs_against_it(tmp_path: Path) -> None:
    state_dir = tmp_path / "state"
    env = {key: value for key, value in os.environ.items() if not key.startswith(("ANTHROPIC_", "CORRAL_", "VAULT_"))}
    env["CORRAL_STATE_DIR"] = str(state_dir)
    api_port = free_port()
    ports = ["--temporal-port", str(free_port()), "--ui-port", str(free_port()), "--model-port", str(free_port())]
    ports += ["--stream-port", str(free_port()), "--git-proxy-port", str(free_port()), "--api-port", str(api_port)]
    api = f"http://127.0.0.1:{api_port}"
    try:
        started = corral(env, "up", *ports)
        assert started.returncode == 0, started.stdout + started.stderr
        assert api in started.stdout, "`corral up` prints the API's address"
        assert httpx.get(f"{api}/healthz", timeout=5).json() == {"status": "ok"}
        status = corral(env, "status")
        assert stack.GATEWAY in status.stdout and api in status.stdout, status.stdout
        gateway_pid = pids_in(state_dir)[stack.GATEWAY]

        key = corral(env, "api-key", "create", "--workspace", "demo")
        assert key.returncode == 0, key.stderr
        example = subprocess.run(
            [sys.executable, "examples/managed_agents_api.py"], cwd=ROOT, capture_output=True, text=True, timeout=120,
            env={**env, "CORRAL_API_KEY": key.stdout.strip(), "CORRAL_API_URL": api},
        )  # fmt: skip
        assert example.returncode == 0, example.stdout + example.stderr
        assert example.stdout.startswith("[offline stand-in model]"), "the reply, streamed as the model wrote it"
    finally:
        down = corral(env, "down", "--purge", "--yes")
    assert down.returncode == 0, down.stdout + down.stderr
    assert f"{stack.GATEWAY} stopped" in down.stdout
    assert is_gone(gateway_pid)
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{api}/healthz", timeout=2)


def test_the_api_page_shows_the_managed_agents_example_verbatim() -> None:
    example = (ROOT / "examples" / "managed_agents_api.py").read_text()
    code = example.split('"""\n', 1)[1].strip()  # the script without its docstring
    page = (ROOT / "docs" / "api.md").read_text()
    assert code in page, "docs/api.md must include examples/managed_agents_api.py as is"
