"""The stack's services as data (`cli.stack.SERVICES`): their order, which ones a `corral up` wants, and the
environment each one gets. No process is started here; test_cli.py runs the real stack and reads /proc/*/environ."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli import stack, up
from cli.stack import Plan, UpOptions

SECRETS = {"ANTHROPIC_API_KEY": "sk-real", "ANTHROPIC_AUTH_TOKEN": "tok", "VAULT_TOKEN": "root", "BAO_TOKEN": "b"}


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
    servers = {stack.TEMPORAL, stack.VAULT, stack.STREAM_RELAY, stack.PROXY_WORKER, stack.DOCKERD}
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
            for service in stack.SERVICES:
                if service.command is None or not service.when(plan):
                    continue
                env = up.environment(service, plan)
                assert ("VAULT_TOKEN" in env) == (service.name == stack.PROXY_WORKER), service.name
                assert "BAO_TOKEN" not in env
                model_role = service.name in (stack.MODEL_WORKER, stack.ALL_IN_ONE)
                assert ("ANTHROPIC_API_KEY" in env) == model_role, service.name
                if model_role:
                    expected = up.OFFLINE_API_KEY if offline else "sk-real"
                    assert env["ANTHROPIC_API_KEY"] == expected
                    assert ("ANTHROPIC_AUTH_TOKEN" in env) == (not offline)
