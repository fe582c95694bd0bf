"""The workers' start: settings read once from the environment and validated (a bad value is one line on stderr
and exit code 2), a service that does not answer is one line and exit code 1, and the one reaper loop that the
sandbox and proxy workers share (error tolerance, cancellation, which sessions count as closed)."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import cast

import docker
import docker.errors
import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from corral.temporal import cluster_id
from sandbox.sessions import SCOPE_LABEL, SESSION_LABEL
from tests.conftest import unique
from tests.waits import until
from workers import closed_sessions, reaping
from workers.settings import (
    ModelSettings,
    ProxySettings,
    SandboxSettings,
    SettingsError,
    TemporalSettings,
    VaultSettings,
)

ROOT = Path(__file__).resolve().parents[1]
WORKER_VARIABLES = ("CORRAL_", "ANTHROPIC_", "VAULT_", "BAO_")


def worker_environment(**variables: str) -> dict[str, str]:
    """This environment without any variable a worker reads, plus `variables`."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(WORKER_VARIABLES)}
    return {**env, "PYTHONUNBUFFERED": "1", **variables}


# ---- settings -----------------------------------------------------------------------------------------------------


def test_defaults_are_the_documented_ones() -> None:
    assert TemporalSettings.from_environment({}) == TemporalSettings("127.0.0.1:7233", "default")
    sandbox = SandboxSettings.from_environment({})
    assert sandbox == SandboxSettings(None, Path(".corral"), 60.0, 8767)
    proxy = ProxySettings.from_environment({"VAULT_ADDR": "http://vault:8200", "VAULT_TOKEN": "t"})
    assert (proxy.git_proxy_host, proxy.git_proxy_port, proxy.reap_interval_seconds) == ("0.0.0.0", 8767, 60.0)
    assert proxy.vault.mount == "corral"


def test_values_are_read_and_an_empty_one_counts_as_unset() -> None:
    environ = {
        "CORRAL_TEMPORAL_ADDRESS": "temporal:7233",
        "CORRAL_TEMPORAL_NAMESPACE": "",
        "CORRAL_SANDBOX_IMAGE": "my-image:1",
        "CORRAL_STATE_DIR": "/var/lib/corral",
        "CORRAL_REAP_INTERVAL_SECONDS": "2.5",
        "CORRAL_GIT_PROXY_PORT": "9000",
    }
    assert TemporalSettings.from_environment(environ) == TemporalSettings("temporal:7233", "default")
    assert SandboxSettings.from_environment(environ) == SandboxSettings(
        "my-image:1", Path("/var/lib/corral"), 2.5, 9000
    )


def test_the_model_key_is_required_and_no_secret_shows_in_a_repr() -> None:
    with pytest.raises(SettingsError, match="ANTHROPIC_API_KEY is not set"):
        ModelSettings.from_environment({"ANTHROPIC_API_KEY": ""})
    model = ModelSettings.from_environment(
        {"ANTHROPIC_API_KEY": "sk-secret", "CORRAL_STREAM_URL": "http://relay:8766", "CORRAL_STREAM_TOKEN": "tok-x"}
    )
    assert (model.api_key, model.stream_url, model.stream_token) == ("sk-secret", "http://relay:8766", "tok-x")
    approle = {"BAO_ADDR": "http://bao:8200", "VAULT_ROLE_ID": "r", "VAULT_SECRET_ID": "s3"}
    vault = VaultSettings.from_environment(approle)
    assert (vault.address, vault.role_id, vault.secret_id) == ("http://bao:8200", "r", "s3")
    shown = repr(model) + repr(vault) + repr(VaultSettings("http://v", token="vault-tok"))
    assert "sk-secret" not in shown and "tok-x" not in shown and "s3" not in shown and "vault-tok" not in shown


def test_vault_needs_an_address_and_a_way_to_log_in() -> None:
    with pytest.raises(SettingsError, match=r"set VAULT_ADDR \(or BAO_ADDR\)"):
        VaultSettings.from_environment({"VAULT_TOKEN": "t"})
    with pytest.raises(SettingsError, match="set VAULT_TOKEN, or VAULT_ROLE_ID and VAULT_SECRET_ID"):
        VaultSettings.from_environment({"VAULT_ADDR": "http://vault:8200", "VAULT_ROLE_ID": "r"})


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("CORRAL_REAP_INTERVAL_SECONDS", "abc"),
        ("CORRAL_REAP_INTERVAL_SECONDS", "0"),
        ("CORRAL_REAP_INTERVAL_SECONDS", "-5"),
        ("CORRAL_REAP_INTERVAL_SECONDS", "nan"),
        ("CORRAL_REAP_INTERVAL_SECONDS", "inf"),
        ("CORRAL_GIT_PROXY_PORT", "http"),
        ("CORRAL_GIT_PROXY_PORT", "0"),
        ("CORRAL_GIT_PROXY_PORT", "70000"),
        ("CORRAL_GIT_PROXY_PORT", "80.5"),
    ],
)
def test_a_bad_number_names_its_variable(name: str, value: str) -> None:
    with pytest.raises(SettingsError, match=f"^{name} must be "):
        SandboxSettings.from_environment({name: value})


@pytest.mark.parametrize("value", ["abc", "0", "-1", "nan", "inf"])
def test_the_model_stall_timeout_is_read_and_checked(value: str) -> None:
    key, name = {"ANTHROPIC_API_KEY": "k"}, "CORRAL_MODEL_STALL_TIMEOUT_SECONDS"
    assert ModelSettings.from_environment(key).stall_timeout_seconds == 120.0
    assert ModelSettings.from_environment({**key, name: "7.5"}).stall_timeout_seconds == 7.5
    with pytest.raises(SettingsError, match=f"^{name} must be a number of seconds greater than 0"):
        ModelSettings.from_environment({**key, name: value})


def test_a_stream_url_must_be_a_url() -> None:
    with pytest.raises(SettingsError, match=r"^CORRAL_STREAM_URL must be an http:// or https:// URL"):
        ModelSettings.from_environment({"ANTHROPIC_API_KEY": "k", "CORRAL_STREAM_URL": "localhost:8766"})


def test_only_the_settings_module_reads_the_environment() -> None:
    readers = [
        path.name
        for path in sorted((ROOT / "workers").glob("*.py"))
        if path.name != "settings.py" and ("os.environ" in path.read_text() or "getenv" in path.read_text())
    ]
    assert readers == [], f"read the environment in workers/settings.py, once, not in {readers}"


# ---- entrypoints --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("module", "variables", "message", "code"),
    [
        (
            "workers.sandbox",
            {"CORRAL_REAP_INTERVAL_SECONDS": "abc"},
            "corral-sandbox: CORRAL_REAP_INTERVAL_SECONDS must be a number of seconds greater than 0, got 'abc'",
            2,
        ),
        (
            "workers.proxy",
            {"VAULT_ADDR": "http://127.0.0.1:1", "VAULT_TOKEN": "t", "CORRAL_GIT_PROXY_PORT": "git"},
            "corral-proxy: CORRAL_GIT_PROXY_PORT must be a TCP port number (1-65535), got 'git'",
            2,
        ),
        ("workers.model", {}, "corral-model: ANTHROPIC_API_KEY is not set.", 2),
        ("workers.all_in_one", {}, "corral-all-in-one: ANTHROPIC_API_KEY is not set.", 2),
        ("workers.proxy", {}, "corral-proxy: set VAULT_ADDR (or BAO_ADDR)", 2),
        ("workers.harness", {"CORRAL_TEMPORAL_ADDRESS": "127.0.0.1:1"}, "corral-harness: cannot reach Temporal", 1),
        (
            "workers.utility_hand",
            {"CORRAL_TEMPORAL_ADDRESS": "127.0.0.1:1"},
            "corral-utility-hand: cannot reach Temporal at 127.0.0.1:1",
            1,
        ),
    ],
)
def test_a_worker_that_cannot_start_says_why_in_one_line(
    module: str, variables: dict[str, str], message: str, code: int
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", module],
        cwd=ROOT,
        env=worker_environment(**variables),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == code, done.stderr
    assert done.stderr.startswith(message), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr  # no traceback, no log noise


async def test_the_sandbox_worker_reaps_with_its_configured_interval(
    temporal_env: WorkflowEnvironment, docker_client: docker.DockerClient, sandbox_image: str, tmp_path: Path
) -> None:
    """End to end: `python -m workers.sandbox` reads its settings, connects, and its reaper removes the container
    of a session this server does not know; SIGTERM then stops it cleanly."""
    client = temporal_env.client
    session_id = unique("sesn_reaped")
    labels = {SESSION_LABEL: session_id, SCOPE_LABEL: f"{await cluster_id(client)}/{client.namespace}"}
    container = docker_client.containers.run(sandbox_image, ["sleep", "120"], detach=True, labels=labels)
    log = tmp_path / "sandbox-worker.log"
    env = worker_environment(
        CORRAL_TEMPORAL_ADDRESS=client.service_client.config.target_host,
        CORRAL_TEMPORAL_NAMESPACE=client.namespace,
        CORRAL_SANDBOX_IMAGE=sandbox_image,
        CORRAL_REAP_INTERVAL_SECONDS="0.5",
    )
    worker = subprocess.Popen(
        [sys.executable, "-m", "workers.sandbox"], cwd=ROOT, env=env, stdout=log.open("ab"), stderr=subprocess.STDOUT
    )
    reaped = f"reaped the sandbox of closed session {session_id}"
    try:
        # Wait for the reaper's own report, not only for the container to go: the removal also takes the volume
        # and refreshes the egress policy, and a SIGTERM in between would cut the report short.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and reaped not in log.read_text() and worker.poll() is None:
            await asyncio.sleep(0.2)
        assert reaped in log.read_text(), log.read_text()
        assert not _exists(docker_client, container.id)
        worker.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(worker.wait, 30) == 0, log.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        if _exists(docker_client, container.id):
            container.remove(force=True)


def _exists(docker_client: docker.DockerClient, container_id: str) -> bool:
    try:
        docker_client.containers.get(container_id)
    except docker.errors.NotFound:
        return False
    return True


# ---- the reaper loop ----------------------------------------------------------------------------------------------


async def test_a_failing_round_is_logged_and_the_next_one_runs(caplog: pytest.LogCaptureFixture) -> None:
    rounds: list[str] = []

    async def sessions() -> list[str]:
        rounds.append("listed")
        if len(rounds) == 1:
            raise ConnectionError("the engine is restarting")
        return []

    async def clean_up(closed: list[str]) -> None:
        raise AssertionError(f"nothing is closed, yet {closed} were cleaned up")

    # No session is ever listed, so the client is never called.
    client = cast(Client, object())

    def loops() -> list[asyncio.Task[object]]:
        return [task for task in asyncio.all_tasks() if getattr(task.get_coro(), "__qualname__", "") == "reap_forever"]

    with caplog.at_level(logging.ERROR, logger="workers.reaper"):
        async with reaping(client, 0.01, sessions, clean_up, job="testing the reaper"):
            await until(lambda: len(rounds) >= 3, "the loop going on after a failing round", 10)
            assert len(loops()) == 1
    assert [record.getMessage() for record in caplog.records] == ["testing the reaper failed; trying again in 0.01 s"]
    assert loops() == [], "the loop runs on after its block ended"


async def test_which_sessions_count_as_closed(temporal_env: WorkflowEnvironment) -> None:
    client = temporal_env.client
    queue = unique("no-worker")  # nobody polls it: a started workflow stays running
    running = await client.start_workflow("NoSuchWorkflow", id=unique("running"), task_queue=queue)
    ended = await client.start_workflow("NoSuchWorkflow", id=unique("ended"), task_queue=queue)
    await ended.terminate("ended without clean-up")
    unknown = unique("never-started")
    try:
        ids = [running.id, ended.id, unknown]
        assert await closed_sessions(client, ids, missing_means_closed=False) == [ended.id]
        assert await closed_sessions(client, ids, missing_means_closed=True) == [ended.id, unknown]
    finally:
        await running.terminate("test finished")


def test_a_model_worker_serves_the_pool_its_environment_names() -> None:
    key = {"ANTHROPIC_API_KEY": "k"}
    assert ModelSettings.from_environment(key).task_queue == "corral-model"
    assert ModelSettings.from_environment({**key, "CORRAL_MODEL_TASK_QUEUE": "corral-model-eu"}).task_queue == (
        "corral-model-eu"
    )
    with pytest.raises(SettingsError, match="CORRAL_MODEL_TASK_QUEUE must name a task queue without '@'"):
        ModelSettings.from_environment({**key, "CORRAL_MODEL_TASK_QUEUE": "corral-model@host-1"})
