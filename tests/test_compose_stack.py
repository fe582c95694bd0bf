"""The compose stack as containers: docker-compose.yml is valid for every profile, and the `offline` profile, built
here with no registry, runs a session through its gateway while one container of each worker role is killed.

The offline images are built (or reused) by `deploy.build_offline_images`, the stack comes up under a
project name of its own on free host ports, and it is always taken down with its volumes (`down -v`), with the
sandboxes its sandbox worker made, whatever happens. A container is killed with `docker kill` (SIGKILL) while a turn
is under way, then started again, as an operator or an orchestrator would (a container killed by hand is not
restarted by its restart policy); the session must end every turn once, with no event lost or logged twice.

The proxy container is killed mid MCP call: the session's credential was written through the gateway into the
stack's OpenBao, and the MCP server runs on the host (reached at the compose network's gateway). The session also
has a repository (a git server on the host, its token written through the gateway into OpenBao): it is cloned
into the sandbox through the proxy container's git proxy, and pushed to through the restarted proxy; the tokens are
in no sandbox file, history or event. Last, the utility hand's container is killed before a call it must serve, and
started while the call waits.

Then the stack is scaled to two replicas of each worker role (Compose's `--scale`; the proxy's second replica is the
`offline-proxy-replica` service, since one container alone can publish the git port) and sessions run concurrently:
their histories say which worker took each task, and both replicas of the harness, model, sandbox and utility hand
must have done work (the proxy's with an MCP call in every session). The live channel: of the stack's two relays,
the container of the one that owns a session is killed mid-reply, then the client's gateway; through the second
gateway the client sees the reply's text with no gap and no repeat, and every log event once.

The stack's harness is versioned (a Worker Deployment, `pinned`): last, a next build with an incompatible change is
started beside it and promoted while a session's sandbox command runs; that session finishes its run on the first
build and continues as new onto the next, an idle one moves at its next message, and no workflow task fails.
A second Docker engine for sandboxes is tested apart (tests/test_sandbox_engines.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import anthropic
import docker
import httpx
import pytest
import yaml
from mcp.server.auth.middleware.auth_context import get_access_token
from mcp.server.auth.settings import AuthSettings
from mcp.server.mcpserver import MCPServer
from mcp.server.transport_security import TransportSecuritySettings
from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowHandle
from typer.testing import CliRunner

from cli.main import app
from corral.apikeys import create_key
from corral.client import read_events, wait_for_idle
from corral.contract.events import AgentMcpToolResult, SessionError, SessionEvent
from corral.names import (
    HARNESS_TASK_QUEUE,
    MODEL_TASK_QUEUE,
    PROXY_TASK_QUEUE,
    SANDBOX_TASK_QUEUE,
    SEARCH_ATTRIBUTE_MODEL,
    SEARCH_ATTRIBUTE_STATUS,
    UTILITY_HAND_TASK_QUEUE,
)
from corral.records import Records
from corral.serving import ServerThread
from corral.temporal import LOCAL_SERVER_ARGS, cluster_id, connect
from deploy import build_offline_images, compose_command
from deploy.__main__ import PROFILES, check_config
from relay.partition import relay_order, relay_urls
from sandbox import remove_all_sandboxes
from sandbox.sessions import remove_session, session_containers
from tests.chaos._processes import ROOT
from tests.chaos.matrix import assert_whole
from tests.conftest import STATE_DIR, history_text, texts
from tests.live_previews import Previews, read_until, relay_then_gateway_killed
from tests.ports import free_port
from tests.proxy_servers.git_server import GitServerLog, create_git_app, git, make_bare_repository
from tests.proxy_servers.mcp_server import AuthorityVerifier
from tests.proxy_servers.tokens import TokenAuthority
from tests.waits import until, until_sync
from workers.deployment import describe_deployment

pytestmark = pytest.mark.timeout(1200)  # a clean machine builds the base and the images first (~3 minutes)

TURN_WITHIN = 180.0
"""Generous: a killed activity is retried once its heartbeat times out, and CI's machine is shared."""
LONG_REPLY = " ".join(f"word{index}" for index in range(30))
SECRETS = ("ANTHROPIC_API_KEY", "VAULT_TOKEN", "VAULT_ROLE_ID", "VAULT_SECRET_ID", "POSTGRES_PASSWORD",
           "MINIO_ROOT_PASSWORD", "CORRAL_STREAM_TOKEN")  # fmt: skip
ON_PIPE = "cat /workspace/.held"
"""A turn's command waits here, on a named pipe, until the test writes to it (`_release`) once the container it means
to kill is dead: the kill meets the command running however long the test took to see it."""
MAKE_PIPE = "rm -f /workspace/.held; mkfifo /workspace/.held"
PIPED_COMMAND = f"{MAKE_PIPE}; {ON_PIPE} > /dev/null; echo turn-2"
SANDBOX_COMMAND = f"echo ran >> /workspace/count; {MAKE_PIPE}; {ON_PIPE} > /dev/null; echo finished"
DEPLOYMENT = "corral-compose"
"""The stack's harness is versioned (its build: a hash of its code); the upgrade test deploys the next build."""


@pytest.fixture(scope="module")
def compose() -> list[str]:
    return compose_command(state_dir=STATE_DIR, progress=print)


@pytest.mark.parametrize("profile", PROFILES)
def test_the_compose_file_is_valid_for_every_profile(compose: list[str], profile: str, tmp_path: Path) -> None:
    environ = {key: value for key, value in os.environ.items() if key not in SECRETS}  # the file's values alone
    (tmp_path / "empty.env").write_text("")
    config = check_config(compose, profile, environ=environ, env_file=tmp_path / "empty.env")
    every = yaml.safe_load(config)["services"]
    # Compose v2 prints the profile's services, docker-compose 1.29 all of them: select by `profiles` either way.
    assert all(service.get("profiles") for service in every.values()), "a service without a profile always starts"
    services = {name: service for name, service in every.items() if profile in service["profiles"]}
    assert services, f"profile {profile} has no service"
    assert all(name.startswith("offline-") == (profile == "offline") for name in services), sorted(services)
    roles = {"harness", "model", "sandbox", "proxy", "utility-hand", "stream", "gateway"}
    named = {name.removeprefix("offline-").removeprefix("corral-") for name in services}
    assert roles <= named, f"profile {profile} lacks roles: {sorted(roles - named)}"
    for name, service in services.items():
        if name.removeprefix("offline-").removeprefix("corral-") in roles | {"temporal", "openbao", "model-server"}:
            assert service.get("restart") == "unless-stopped", f"{name} has no restart policy"
        for secret in SECRETS:
            value = (service.get("environment") or {}).get(secret)
            assert value in (None, "", "offline-stand-in"), f"{name} sets {secret} in the file"
    if profile == "offline":  # its own Temporal dev server: told what `corral up` tells the one it starts
        command = services["offline-temporal"]["command"]
        given = set(itertools.pairwise(command))
        pairs = zip(LOCAL_SERVER_ARGS[::2], LOCAL_SERVER_ARGS[1::2], strict=True)
        assert all(pair in given for pair in pairs), (command, LOCAL_SERVER_ARGS)
    # Large payloads go to the blob store with a reference in history: every role that talks to Temporal must see
    # the same store, or one role writes a reference another cannot read.
    talkers = {name: service for name, service in services.items()
               if "CORRAL_TEMPORAL_ADDRESS" in (service.get("environment") or {})}  # fmt: skip
    stores = {name: (service.get("environment") or {}).get("CORRAL_BLOB_STORE") for name, service in talkers.items()}
    assert len(talkers) >= 6 and len(set(stores.values())) == 1 and None not in stores.values(), stores
    if profile == "offline":
        temporal = " ".join(services["offline-temporal"]["command"])
        for attribute in (SEARCH_ATTRIBUTE_STATUS, SEARCH_ATTRIBUTE_MODEL):
            assert f"{attribute}=Keyword" in temporal
        assert all(service.get("pull_policy") == "never" for service in services.values()), "offline pulls nothing"
        for name in ("offline-temporal", "offline-openbao", "offline-gateway", "offline-model-server"):
            assert "healthcheck" in services[name], f"{name} has no health check"


# ---- the offline stack --------------------------------------------------------------------------------------------


@dataclass
class OfflineStack:
    compose: list[str]
    project: str
    env: dict[str, str]
    ports: dict[str, int]
    engine: docker.DockerClient

    def run(
        self, *arguments: str, check: bool = True, replicas: bool = False, overrides: tuple[Path, ...] = ()
    ) -> subprocess.CompletedProcess[str]:
        """Compose on the stack's project; `replicas` adds the profile of the proxy's extra replicas, `overrides`
        more compose files."""
        profiles = ["--profile", "offline", *(["--profile", "offline-replicas"] if replicas else [])]
        files = [word for path in (ROOT / "docker-compose.yml", *overrides) for word in ("--file", str(path))]
        done = subprocess.run(
            [*self.compose, *files, "--project-name", self.project, *profiles, *arguments],
            env=self.env, capture_output=True, text=True, check=False, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0 or not check, f"compose {' '.join(arguments)} failed: {done.stderr[-3000:]}"
        return done

    def containers(self, service: str) -> list[Any]:
        labels = [f"com.docker.compose.project={self.project}", f"com.docker.compose.service={service}"]
        return list(self.engine.containers.list(all=True, filters={"label": labels}))

    def container(self, service: str) -> Any:
        """The service's first replica."""
        [found] = [c for c in self.containers(service) if c.labels["com.docker.compose.container-number"] == "1"]
        return found

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['CORRAL_API_PORT']}"

    @property
    def model_url(self) -> str:
        return f"http://127.0.0.1:{self.ports['CORRAL_MODEL_PORT']}"

    @property
    def temporal_address(self) -> str:
        return f"127.0.0.1:{self.ports['CORRAL_TEMPORAL_PORT']}"


def _answers(url: str) -> bool:
    with contextlib.suppress(httpx.HTTPError):
        return httpx.get(url, timeout=2).status_code == 200
    return False


@pytest.fixture(scope="module")
def offline_stack(compose: list[str], tmp_path_factory: pytest.TempPathFactory) -> Iterator[OfflineStack]:
    started = time.monotonic()
    images = build_offline_images(STATE_DIR, progress=print)
    print(f"offline images ready after {time.monotonic() - started:.0f} s")
    names = ("CORRAL_TEMPORAL_PORT", "CORRAL_UI_PORT", "CORRAL_API_PORT", "CORRAL_API_2_PORT", "CORRAL_STREAM_PORT",
             "CORRAL_MODEL_PORT", "CORRAL_GIT_PROXY_PORT")  # fmt: skip
    ports = {name: free_port() for name in names}
    env = dict(os.environ) | images.environment() | {name: str(port) for name, port in ports.items()}
    env |= {"DOCKER_GID": str(os.stat("/var/run/docker.sock").st_gid), "CORRAL_SANDBOX_POOL_SIZE": "1"}
    env |= {"CORRAL_HARNESS_DEPLOYMENT": DEPLOYMENT, "CORRAL_HARNESS_UPGRADE": "pinned"}  # a versioned harness
    engine = docker.from_env()
    stack = OfflineStack(compose, f"corral-test-{uuid.uuid4().hex[:8]}", env, ports, engine)
    log_file = tmp_path_factory.mktemp("compose") / "compose.log"
    scope: str | None = None
    try:
        started = time.monotonic()
        stack.run("up", "--detach")
        until_sync(lambda: _answers(f"{stack.gateway_url}/healthz"), "the gateway came up", 120)
        until_sync(lambda: _answers(f"{stack.model_url}/healthz"), "the offline model server came up", 120)
        print(f"offline stack up after {time.monotonic() - started:.0f} s")

        async def scope_of_stack() -> str:
            client = await connect(stack.temporal_address)
            return f"{await cluster_id(client)}/{client.namespace}"

        scope = asyncio.run(scope_of_stack())
        yield stack
    finally:
        logs = stack.run("logs", "--no-color", "--timestamps", check=False)
        log_file.write_text(logs.stdout + logs.stderr)
        print(f"compose logs: {log_file}")
        stack.run("down", "--volumes", "--remove-orphans", "--timeout", "10", check=False, replicas=True)
        if scope is not None:  # the sandboxes of the stack's workers, a killed worker's warm pool member included
            print(remove_all_sandboxes(engine, scope).describe())
        leftovers = engine.containers.list(all=True, filters={"label": f"com.docker.compose.project={stack.project}"})
        volumes = engine.volumes.list(filters={"label": f"com.docker.compose.project={stack.project}"})
        engine.close()
        assert not leftovers and not volumes, f"left behind: {leftovers} {volumes}"


# ---- one session, a container of each role killed mid-turn --------------------------------------------------------


def tool(command: str) -> dict[str, Any]:
    return {"tool_uses": [{"name": "bash", "input": {"command": command}}]}


def mcp(name: str, **input: Any) -> dict[str, Any]:
    return {"tool_uses": [{"name": f"mcp__tools__{name}", "input": input}]}


def create_mcp_app(authority: TokenAuthority, base_url: str) -> Any:
    """An MCP server for the host's side: `slow` and `add`, each call recorded with the token it carried. It is
    reached from the proxy container at the compose network's gateway, not at localhost, so the SDK's DNS-rebinding
    check (which accepts only localhost Host headers) is off."""
    server = MCPServer(
        "corral-compose-mcp",
        token_verifier=AuthorityVerifier(authority),
        auth=AuthSettings(issuer_url=base_url, resource_server_url=None),
        log_level="WARNING",
    )

    def caller_token() -> str:
        token = get_access_token()
        assert token is not None
        return token.token

    @server.tool()
    def slow(seconds: float) -> str:
        """Sleep, then answer."""
        authority.record_tool_call("slow", caller_token())
        time.sleep(seconds)
        return "done"

    @server.tool()
    def add(a: int, b: int) -> int:
        """Add two integers."""
        authority.record_tool_call("add", caller_token())
        return a + b

    security = TransportSecuritySettings(enable_dns_rebinding_protection=False)
    return server.streamable_http_app(transport_security=security, host="0.0.0.0")


def _host_mcp_server(stack: OfflineStack, authority: TokenAuthority) -> tuple[ServerThread, str]:
    """The MCP server, started on the host, and its URL as the proxy containers reach it."""
    server = ServerThread(
        lambda url: create_mcp_app(authority, url), name="mcp", host="0.0.0.0", lifespan="on", app_takes_url=True
    )
    server.start()
    network = stack.engine.networks.get(f"{stack.project}_default")
    host = network.attrs["IPAM"]["Config"][0]["Gateway"]  # the host, as the proxy container sees it
    return server, f"http://{host}:{server.port}/mcp"


PUSH = (
    "cd /workspace/app && git checkout -q -b feature && echo more >> README.md && "
    "git -c user.email=agent@corral.invalid -c user.name=agent commit -qam 'agent change' && "
    "git push -q origin feature && echo pushed"
)
SCRIPT: list[dict[str, Any]] = [
    # A first turn: the sandbox is made, with the repository cloned into it through the git proxy.
    tool("cd /workspace/app && git log --oneline | wc -l"), {"text": "reply-1"},
    tool(PIPED_COMMAND), {"text": "reply-2"},  # the harness is killed while the command runs
    {"text": LONG_REPLY, "first_token_latency": 1, "tokens_per_second": 5, "pace_hits": 1},  # the model, mid-stream
    tool(SANDBOX_COMMAND), tool("wc -l < /workspace/count"), {"text": "reply-4"},  # the sandbox hand, mid-command
    # The proxy, mid MCP call; then a push through the restarted proxy's git proxy.
    mcp("slow", seconds=4), mcp("add", a=2, b=40), tool(PUSH), tool("cat /workspace/app/.git/config; env"),
    {"text": "reply-5"},
    # The utility hand: its calls take microseconds, so its container is killed before the call and started once
    # the call waits for it.
    {"tool_uses": [{"name": "calculate", "input": {"expression": "6*7"}}]}, {"text": "reply-6"},
]  # fmt: skip
LONG_STEP = next(index for index, step in enumerate(SCRIPT) if step.get("text") == LONG_REPLY)
"""The script step of the reply the model worker dies in."""


async def _send_turn(client: anthropic.AsyncAnthropic, handle: WorkflowHandle, turn: int) -> int:
    """Send turn `turn`'s message through the gateway; the message's position in the log."""
    message = {"type": "user.message", "content": [{"type": "text", "text": f"turn {turn}"}]}
    await client.beta.sessions.events.send(handle.id, events=[message])  # type: ignore[list-item]
    sent: list[SessionEvent] = []

    async def logged() -> bool:
        sent[:] = [event for event in await read_events(handle) if event.type == "user.message"]
        return len(sent) == turn

    await until(logged, f"turn {turn}'s message in its log", 90)
    return sent[-1].position


async def _count(handle: WorkflowHandle, event_type: str, after: int) -> int:
    return sum(1 for event in await read_events(handle, after=after) if event.type == event_type)


def _command_runs(engine: docker.DockerClient, session_id: str, needle: str) -> bool:
    running = [c for c in session_containers(engine, session_id) if c.status == "running"]
    return any(needle in c.exec_run(["ps", "-eo", "args"]).output.decode() for c in running)


def _release(stack: OfflineStack, handle: WorkflowHandle) -> None:
    """Let the turn's held command go on."""
    [holding] = [c for c in session_containers(stack.engine, handle.id)
                 if c.status == "running" and ON_PIPE in c.exec_run(["ps", "-eo", "args"]).output.decode()]  # fmt: skip
    done = holding.exec_run(["timeout", "30", "sh", "-c", "echo go > /workspace/.held"])
    assert done.exit_code == 0, done.output


def sleeping(stack: OfflineStack, handle: WorkflowHandle) -> Any:
    """Whether the turn's command runs (held on its pipe) in the session's sandbox container."""

    async def ready() -> bool:
        return await asyncio.to_thread(_command_runs, stack.engine, handle.id, ON_PIPE)

    return ready


async def _kill_and_restart(stack: OfflineStack, role: str, still: Any = None) -> None:
    """`docker kill` (SIGKILL) of the role's container, then `docker start`, as an operator would. `still`, when
    given, is what the kill must land in the middle of (an async check): it must still hold once the role is dead."""
    container = stack.container(f"offline-{role}")
    await asyncio.to_thread(container.kill)
    container.reload()
    assert container.status != "running", f"offline-{role} survived docker kill"
    await asyncio.to_thread(container.start)
    if still is not None:  # after the start, so as not to hold it up: still going, so going at the kill
        assert await still(), f"offline-{role} was killed after the work it was meant to interrupt ended"


def _host_git_server(
    stack: OfflineStack, directory: Path, token: str
) -> tuple[ServerThread, dict[str, Any], Path, GitServerLog]:
    """A git server on the host with one repository demanding `token`: the server, the session resource naming the
    repository as the proxy containers reach it, the bare repository, and what the server saw."""
    (directory / "repos").mkdir()
    bare = make_bare_repository(directory / "repos", "app", directory / "scratch")
    seen = GitServerLog()
    server = ServerThread(create_git_app(directory / "repos", token, seen), name="git-server", host="0.0.0.0")
    server.start()
    network = stack.engine.networks.get(f"{stack.project}_default")
    host = network.attrs["IPAM"]["Config"][0]["Gateway"]
    resource = {"type": "github_repository", "url": f"http://{host}:{server.port}/app.git",
                "authorization_token": token, "checkout": {"type": "branch", "name": "main"}}  # fmt: skip
    return server, resource, bare, seen


def _sandbox_files(stack: OfflineStack, session_id: str) -> str:
    """Every file of the session's running sandbox containers, as one text (to scan for a secret)."""
    command = ["tar", "-cf", "-", "--exclude=/proc", "--exclude=/sys", "/"]
    containers = [c for c in session_containers(stack.engine, session_id) if c.status == "running"]
    return b"".join(c.exec_run(command, user="0").output for c in containers).decode("latin-1")


async def test_a_session_survives_killing_each_worker_role_mid_turn(
    offline_stack: OfflineStack, tmp_path: Path
) -> None:
    stack = offline_stack
    temporal = await connect(stack.temporal_address)
    key, _ = await create_key(Records(temporal, task_queue=HARNESS_TASK_QUEUE), f"compose-{uuid.uuid4().hex[:8]}")
    client = anthropic.AsyncAnthropic(base_url=stack.gateway_url, api_key=key, max_retries=2)
    script = f"compose-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient(base_url=stack.model_url) as http:
        (await http.put(f"/_corral/scripts/{script}", json={"steps": SCRIPT})).raise_for_status()
    authority = TokenAuthority()
    mcp_server, mcp_url = _host_mcp_server(stack, authority)
    git_token = f"ghp_canary{uuid.uuid4().hex}"
    git_server, repository, bare, git_log = _host_git_server(stack, tmp_path, git_token)
    vault = await client.beta.vaults.create(display_name="compose")
    token = authority.issue_access_token()
    await client.beta.vaults.credentials.create(  # through the gateway into the stack's OpenBao
        vault.id, auth={"type": "static_bearer", "mcp_server_url": mcp_url, "token": token}
    )
    agent = await client.beta.agents.create(
        name="compose",
        model=f"script:{script}",
        mcp_servers=[{"type": "url", "name": "tools", "url": mcp_url}],
        tools=[
            {"type": "agent_toolset_20260401"},
            {"type": "corral_utility"},  # type: ignore[typeddict-item]
            {"type": "mcp_toolset", "mcp_server_name": "tools",
             "default_config": {"permission_policy": {"type": "always_allow"}}},
        ],
    )  # fmt: skip
    environment = await client.beta.environments.create(name="compose")
    session = await client.beta.sessions.create(
        agent=agent.id,
        environment_id=environment.id,
        vault_ids=[vault.id],
        resources=[repository],  # type: ignore[list-item]
    )
    handle = temporal.get_workflow_handle(session.id)
    try:
        # Turn 1: nothing is killed; the session's sandbox is made through the containerised sandbox hand, and the
        # repository cloned into it through the proxy container's git proxy.
        asked = await _send_turn(client, handle, 1)
        await wait_for_idle(handle, after=asked, within_seconds=TURN_WITHIN)

        # Turn 2: the harness, while the turn's command runs in the sandbox.
        asked = await _send_turn(client, handle, 2)
        await until(sleeping(stack, handle), "turn 2's command running", 90)
        await _kill_and_restart(stack, "harness", still=sleeping(stack, handle))
        await asyncio.to_thread(_release, stack, handle)
        await wait_for_idle(handle, after=asked, within_seconds=TURN_WITHIN)

        # Turn 3: the model worker, while the reply streams: after its first delta reached the client through the
        # gateway, and before its end (the reply's text shown then is a strict prefix of it).
        shown = Previews()
        async with await client.beta.sessions.events.stream(handle.id, event_deltas=["agent.message"]) as stream:
            asked = await _send_turn(client, handle, 3)
            first_delta = read_until(stream, [], shown, lambda: shown.deltas >= 1)
            await asyncio.wait_for(first_delta, TURN_WITHIN)
            await _kill_and_restart(stack, "model")
            [shown_at_kill] = [shown.text(preview) for preview in shown.texts]
        await wait_for_idle(handle, after=asked, within_seconds=TURN_WITHIN)

        # Turn 4: the sandbox hand, while the command runs in the sandbox (which outlives the worker).
        asked = await _send_turn(client, handle, 4)
        await until(sleeping(stack, handle), "turn 4's command running", 90)
        await _kill_and_restart(stack, "sandbox", still=sleeping(stack, handle))
        await asyncio.to_thread(_release, stack, handle)
        await wait_for_idle(handle, after=asked, within_seconds=TURN_WITHIN)

        # Turn 5: the proxy worker, while its MCP call runs (the MCP server takes 4 s to answer).
        def calls(name: str) -> int:
            return [tool for tool, _ in authority.tool_calls].count(name)

        async def slow_call_made() -> bool:
            return calls("slow") >= 1

        asked = await _send_turn(client, handle, 5)
        await until(slow_call_made, "turn 5's MCP call at the server", 90)
        await _kill_and_restart(stack, "proxy")
        await wait_for_idle(handle, after=asked, within_seconds=TURN_WITHIN)
        # No wait for the slow call made again: it would reach the server before its activity ended, so before the
        # turn's next call (`add`), which the counts below include.

        # Turn 6: the utility hand, dead when its call is made; started again while the call waits for it.
        utility = stack.container("offline-utility-hand")
        await asyncio.to_thread(utility.kill)
        asked = await _send_turn(client, handle, 6)

        async def calculating() -> bool:
            return await _count(handle, "agent.tool_use", asked) >= 1

        await until(calculating, "turn 6's call", 90)
        await asyncio.to_thread(utility.start)
        await wait_for_idle(handle, after=asked, within_seconds=TURN_WITHIN)

        log = await read_events(handle)
        async with httpx.AsyncClient(base_url=stack.model_url) as http:
            model_requests = (await http.get(f"/_corral/scripts/{script}/requests")).raise_for_status().json()
        listed = [event async for event in client.beta.sessions.events.list(session.id, limit=100)]
        sandbox = await asyncio.to_thread(_sandbox_files, stack, handle.id)
        history = await history_text(handle)
    finally:
        mcp_server.stop()
        git_server.stop()
        with contextlib.suppress(Exception):
            await handle.terminate("test over")
        await asyncio.to_thread(remove_session, stack.engine, handle.id, True)

    assert_whole([log])
    assert [(event.id, event.type) for event in listed] == [(event.id, event.type) for event in log], (
        "the gateway lists the log as Temporal holds it"
    )
    assert texts(log) == ["reply-1", "reply-2", LONG_REPLY, "reply-4", "reply-5", "reply-6"], "each reply once, whole"
    assert shown_at_kill and LONG_REPLY.startswith(shown_at_kill) and len(shown_at_kill) < len(LONG_REPLY), (
        f"the model worker was not killed mid-reply: the client had seen {shown_at_kill!r}"
    )
    assert [request["step"] for request in model_requests].count(LONG_STEP) == 2, "the cut reply was asked again"
    results = texts(log, "agent.tool_result")
    assert results[:2] == ["1", "turn-2"] and results[3:5] == ["1", "pushed"], results
    assert results[2].startswith("finished") and "[recovered: this command had already run" in results[2], results[2]
    # Git: cloned and pushed through the git proxy, which alone held the token (from OpenBao).
    assert "pxr_" in results[5] and str(git_server.port) not in results[5], "origin is the git proxy"
    assert "agent change" in git("--git-dir", str(bare), "log", "--oneline", "feature"), "the push arrived"
    assert [c for c in git_log.credentials if c] and all(
        c == ("x-access-token", git_token) for c in git_log.credentials if c
    )
    places = {"sandbox": sandbox, "history": history, "events": "\n".join(e.model_dump_json() for e in log)}
    assert sandbox and [where for where, text in places.items() if git_token in text or token in text] == []
    # The MCP call the proxy died in is not made again: the model is told its outcome is unknown, and the next
    # call goes through the restarted proxy with the credential from OpenBao.
    mcp_results = [event for event in log if isinstance(event, AgentMcpToolResult)]
    assert [result.is_error for result in mcp_results] == [True, False]
    assert "outcome is unknown" in texts(log, "agent.mcp_tool_result")[0]
    assert texts(log, "agent.mcp_tool_result")[1] == "42"
    assert (calls("slow"), calls("add")) == (1, 1), authority.tool_calls
    assert {used for _, used in authority.tool_calls} == {token}
    errors = [(e.error.type, e.error.retry_status.type) for e in log if isinstance(e, SessionError)]
    assert errors == [("mcp_connection_failed_error", "exhausted")]
    types = [event.type for event in log]
    assert types.count("user.message") == 6 and types.count("session.status_idle") == 6, types
    assert results[6:] == ["6*7 = 42"], results


# ---- two replicas of each worker role, sessions spread across them ------------------------------------------------

REPLICATED: dict[str, tuple[str, TaskQueueType.ValueType, tuple[str, ...]]] = {
    "harness": (HARNESS_TASK_QUEUE, TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW, ("offline-harness",)),
    "model": (MODEL_TASK_QUEUE, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY, ("offline-model",)),
    "sandbox": (SANDBOX_TASK_QUEUE, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY, ("offline-sandbox",)),
    "utility-hand": (UTILITY_HAND_TASK_QUEUE, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY, ("offline-utility-hand",)),
    "proxy": (PROXY_TASK_QUEUE, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY, ("offline-proxy", "offline-proxy-replica")),
}
"""Each worker role: the task queue its replicas poll, and the services whose containers are its replicas."""
SCALE = ("offline-harness=2", "offline-model=2", "offline-sandbox=2", "offline-utility-hand=2",
         "offline-proxy-replica=1")  # fmt: skip
MUST_SPREAD = ("harness", "model", "sandbox", "utility-hand", "proxy")
"""The roles every session uses (the proxy for its MCP call)."""
SESSIONS_PER_ROUND = 6
MOST_ROUNDS = 4
"""Tasks go to whichever replica polls first, so a round may leave a replica idle (all 6 sessions' first workflow
task on one harness: 1 in 32); another round of new sessions is run, at most this many in all."""
SPREAD_SCRIPT: list[dict[str, Any]] = [
    tool("echo spread"),  # the sandbox hand
    {"tool_uses": [{"name": "calculate", "input": {"expression": "6*7"}}]},  # the utility hand
    mcp("add", a=2, b=40),  # the proxy, with the credential from the stack's OpenBao
    {"text": "spread-done"},
]


def _hostname(identity: str) -> str:
    """The host of a worker's identity (the SDK's default, `pid@host`); in a container, its hostname."""
    return identity.rpartition("@")[2]


async def _pollers(temporal: Client, queue: str, kind: TaskQueueType.ValueType) -> set[str]:
    request = DescribeTaskQueueRequest(
        namespace=temporal.namespace, task_queue=TaskQueue(name=queue), task_queue_type=kind
    )
    described = await temporal.workflow_service.describe_task_queue(request)
    return {_hostname(poller.identity) for poller in described.pollers}


async def _identities(handle: WorkflowHandle) -> set[str]:
    """The identity of every worker that started one of the session's workflow or activity tasks."""
    history = await handle.fetch_history()
    found = set()
    for event in history.events:
        if event.HasField("workflow_task_started_event_attributes"):
            found.add(event.workflow_task_started_event_attributes.identity)
        elif event.HasField("activity_task_started_event_attributes"):
            found.add(event.activity_task_started_event_attributes.identity)
    return found


async def test_sessions_spread_across_two_replicas_of_each_worker_role(offline_stack: OfflineStack) -> None:
    stack = offline_stack
    started = time.monotonic()
    stack.run("up", "--detach", *(word for scale in SCALE for word in ("--scale", scale)), replicas=True)
    replicas = {  # role -> {container hostname: container name}
        role: {c.attrs["Config"]["Hostname"]: c.name for service in services for c in stack.containers(service)}
        for role, (_, _, services) in REPLICATED.items()
    }
    assert all(len(hosts) == 2 for hosts in replicas.values()), replicas
    temporal = await connect(stack.temporal_address)

    async def all_polling() -> bool:
        for role, (queue, kind, _) in REPLICATED.items():
            if not set(replicas[role]) <= await _pollers(temporal, queue, kind):
                return False
        return True

    await until(all_polling, "every replica polling its task queue", 120.0)
    print(f"scaled to two replicas per worker role after {time.monotonic() - started:.0f} s")

    key, _ = await create_key(Records(temporal, task_queue=HARNESS_TASK_QUEUE), f"spread-{uuid.uuid4().hex[:8]}")
    client = anthropic.AsyncAnthropic(base_url=stack.gateway_url, api_key=key, max_retries=2)
    script = f"spread-{uuid.uuid4().hex[:8]}"
    async with httpx.AsyncClient(base_url=stack.model_url) as http:
        (await http.put(f"/_corral/scripts/{script}", json={"steps": SPREAD_SCRIPT})).raise_for_status()
    authority = TokenAuthority()
    mcp_server, mcp_url = _host_mcp_server(stack, authority)
    vault = await client.beta.vaults.create(display_name="spread")
    token = authority.issue_access_token()
    await client.beta.vaults.credentials.create(
        vault.id, auth={"type": "static_bearer", "mcp_server_url": mcp_url, "token": token}
    )
    agent = await client.beta.agents.create(
        name="spread",
        model=f"script:{script}",
        mcp_servers=[{"type": "url", "name": "tools", "url": mcp_url}],
        tools=[
            {"type": "agent_toolset_20260401"},
            {"type": "corral_utility"},  # type: ignore[typeddict-item]
            {"type": "mcp_toolset", "mcp_server_name": "tools",
             "default_config": {"permission_policy": {"type": "always_allow"}}},
        ],
    )  # fmt: skip
    environment = await client.beta.environments.create(name="spread")

    async def one_session() -> WorkflowHandle:
        session = await client.beta.sessions.create(agent=agent.id, environment_id=environment.id, vault_ids=[vault.id])
        handle = temporal.get_workflow_handle(session.id)
        handles.append(handle)
        asked = await _send_turn(client, handle, 1)
        await wait_for_idle(handle, after=asked, within_seconds=TURN_WITHIN)
        return handle

    handles: list[WorkflowHandle] = []
    worked: dict[str, set[str]] = {role: set() for role in REPLICATED}
    rounds = 0
    try:
        while rounds < MOST_ROUNDS and any(worked[role] != set(replicas[role]) for role in MUST_SPREAD):
            rounds += 1
            for handle in await asyncio.gather(*(one_session() for _ in range(SESSIONS_PER_ROUND))):
                hosts = {_hostname(identity) for identity in await _identities(handle)}
                for role in REPLICATED:
                    worked[role] |= hosts & set(replicas[role])
        logs = [await read_events(handle) for handle in handles]
    finally:
        mcp_server.stop()
        for handle in handles:
            with contextlib.suppress(Exception):
                await handle.terminate("test over")
        await asyncio.gather(*(asyncio.to_thread(remove_session, stack.engine, h.id, True) for h in handles))
    spread = {role: sorted(replicas[role][host] for host in hosts) for role, hosts in worked.items()}
    print(f"{len(handles)} sessions in {rounds} rounds, {time.monotonic() - started:.0f} s in all; worked: {spread}")

    for role in MUST_SPREAD:
        assert worked[role] == set(replicas[role]), f"{role}: only {spread[role]} of {sorted(replicas[role].values())}"
    assert len(handles) == rounds * SESSIONS_PER_ROUND
    assert [tool for tool, _ in authority.tool_calls] == ["add"] * len(handles), "each MCP call made once"
    assert {used for _, used in authority.tool_calls} == {token}
    assert_whole(logs)
    for log in logs:  # nothing lost, nothing twice: one message, two tool results, one reply, one idle
        assert texts(log) == ["spread-done"], texts(log)
        assert texts(log, "agent.tool_result") == ["spread", "6*7 = 42"], texts(log, "agent.tool_result")
        assert texts(log, "agent.mcp_tool_result") == ["42"], texts(log, "agent.mcp_tool_result")
        types = [event.type for event in log]
        assert types.count("user.message") == 1 and types.count("session.status_idle") == 1, types


# ---- the live channel: a relay and a gateway killed mid-reply -------------------------------------------------------

STREAMED_REPLY = " ".join(f"word{n}" for n in range(240))  # ~30 s at 8 words a second: long enough for both kills


async def test_a_relay_and_a_gateway_killed_mid_reply_the_client_sees_no_gap_and_no_repeat(
    offline_stack: OfflineStack,
) -> None:
    """The stack's two relays (`offline-stream`, `offline-stream-2`) and two gateways (`offline-gateway` and
    `offline-gateway-replica`): the container of the relay that owns the session is killed mid-reply, then the
    client's gateway; the client reopens its stream on the other gateway and lists what it missed. A killed
    container, unlike a killed process, resets no connection: the model worker sees the relay gone only because it
    stops acknowledging (`UNACKED_MILLISECONDS`)."""
    stack = offline_stack
    await asyncio.to_thread(stack.run, "up", "--detach", "--no-deps", "offline-gateway-replica", replicas=True)
    url_b = f"http://127.0.0.1:{stack.ports['CORRAL_API_2_PORT']}"
    until_sync(lambda: _answers(f"{url_b}/healthz"), "the second gateway came up", 120)
    temporal = await connect(stack.temporal_address)
    key, _ = await create_key(Records(temporal, task_queue=HARNESS_TASK_QUEUE), f"relays-{uuid.uuid4().hex[:8]}")
    client_a = anthropic.AsyncAnthropic(base_url=stack.gateway_url, api_key=key, max_retries=0)
    client_b = anthropic.AsyncAnthropic(base_url=url_b, api_key=key, max_retries=0)
    script = f"relays-{uuid.uuid4().hex[:8]}"
    steps = [{"text": STREAMED_REPLY, "first_token_latency": 0.3, "tokens_per_second": 8}]
    async with httpx.AsyncClient(base_url=stack.model_url) as http:
        (await http.put(f"/_corral/scripts/{script}", json={"steps": steps})).raise_for_status()
    agent = await client_a.beta.agents.create(name="streamer", model=f"script:{script}")
    environment = await client_a.beta.environments.create(name="relays")
    session = await client_a.beta.sessions.create(agent=agent.id, environment_id=environment.id)
    relays = yaml.safe_load(stack.run("config").stdout)["services"]["offline-model"]["environment"]["CORRAL_STREAM_URL"]
    owner = urlsplit(relay_order(session.id, relay_urls(relays))[0]).hostname  # the service the session's text uses
    try:

        async def kill_relay() -> None:
            await asyncio.to_thread(stack.container(str(owner)).kill)

        async def kill_gateway() -> None:
            await asyncio.to_thread(stack.container("offline-gateway").kill)

        log = await relay_then_gateway_killed(client_a, client_b, session.id, kill_relay, kill_gateway, within=90)
    finally:
        for service in (str(owner), "offline-gateway"):  # started again, as an operator would, for later tests
            await asyncio.to_thread(stack.container(service).start)
        until_sync(lambda: _answers(f"{stack.gateway_url}/healthz"), "the gateway up again", 120)
        with contextlib.suppress(Exception):
            await temporal.get_workflow_handle(session.id).terminate("test over")
        await client_a.close()
        await client_b.close()

    [message] = [event for event in log if event.type == "agent.message"]
    assert "".join(getattr(block, "text", "") for block in message.content) == STREAMED_REPLY


# ---- a new harness build deployed while a session is mid-turn -----------------------------------------------------

NEXT_BUILD = "next"
HELD = "until [ -e /workspace/go ]; do sleep 0.2; done; echo upgraded"
"""The mid-turn session's command: it runs until the test lets it finish, after the promotion."""


def _next_harness_override(stack: OfflineStack) -> Path:
    """A compose file adding `offline-harness-next`: the corral image running tests/timer_first_harness.py (an
    incompatible change to SessionWorkflow) as build `next` of the stack's deployment. The file is copied to a
    directory the image's non-root user can read (a clone in a `mktemp -d` directory is private)."""
    directory = Path(tempfile.mkdtemp(prefix="corral-upgrade-"))
    directory.chmod(0o755)
    script = directory / "harness_next.py"
    shutil.copyfile(ROOT / "tests" / "timer_first_harness.py", script)
    script.chmod(0o644)
    service = {
        "image": stack.env.get("CORRAL_IMAGE", "corral-offline/corral:local"),
        "pull_policy": "never",
        "profiles": ["offline"],
        "command": ["python", "-c", "import harness_next; harness_next.main()"],
        "environment": {
            "PYTHONPATH": "/upgrade",
            "CORRAL_TEMPORAL_ADDRESS": "offline-temporal:7233",
            "CORRAL_BLOB_STORE": "/var/lib/corral/blobs",
            "CORRAL_HARNESS_DEPLOYMENT": DEPLOYMENT,
            "CORRAL_HARNESS_BUILD_ID": NEXT_BUILD,
            "CORRAL_HARNESS_UPGRADE": "pinned",
        },
        "volumes": ["offline-blobs:/var/lib/corral/blobs", f"{script}:/upgrade/harness_next.py:ro"],
    }
    override = directory / "next.yml"
    override.write_text(yaml.safe_dump({"services": {"offline-harness-next": service}}))
    return override


async def _builds_of_runs(temporal: Client, handle: WorkflowHandle) -> list[set[str]]:
    """For each run of the session, first to last: the builds that completed its workflow tasks. Fails on a
    failed workflow task (a build that could not run the history it was given)."""
    runs: list[set[str]] = []
    described = await handle.describe()
    run_id: str | None = described.raw_description.workflow_execution_info.first_run_id
    while run_id is not None:
        history = await temporal.get_workflow_handle(handle.id, run_id=run_id).fetch_history()
        builds = set()
        run_id = None
        for event in history.events:
            assert not event.HasField("workflow_task_failed_event_attributes"), event
            if event.HasField("workflow_task_completed_event_attributes"):
                builds.add(event.workflow_task_completed_event_attributes.deployment_version.build_id)
            if event.HasField("workflow_execution_continued_as_new_event_attributes"):
                run_id = event.workflow_execution_continued_as_new_event_attributes.new_execution_run_id
        runs.append(builds)
    return runs


async def test_a_new_harness_build_takes_over_at_a_safe_point(offline_stack: OfflineStack) -> None:
    stack = offline_stack
    temporal = await connect(stack.temporal_address)
    state = await describe_deployment(temporal, DEPLOYMENT)
    assert state is not None and state.current is not None and state.current.startswith("code-"), state
    first = state.current  # the stack's own harness made itself current: a hash of its code
    key, _ = await create_key(Records(temporal, task_queue=HARNESS_TASK_QUEUE), f"upgrade-{uuid.uuid4().hex[:8]}")
    client = anthropic.AsyncAnthropic(base_url=stack.gateway_url, api_key=key, max_retries=2)
    scripts = {"held": [tool(HELD), {"text": "upgrade-done"}], "idle": [{"text": "upgrade-done"}]}
    handles = []
    environment = await client.beta.environments.create(name="upgrade")
    for name, steps in scripts.items():
        script = f"upgrade-{name}-{uuid.uuid4().hex[:8]}"
        async with httpx.AsyncClient(base_url=stack.model_url) as http:
            (await http.put(f"/_corral/scripts/{script}", json={"steps": steps, "loop": True})).raise_for_status()
        agent = await client.beta.agents.create(
            name="upgrade", model=f"script:{script}", tools=[{"type": "agent_toolset_20260401"}]
        )
        session = await client.beta.sessions.create(agent=agent.id, environment_id=environment.id)
        handles.append(temporal.get_workflow_handle(session.id))
    mid_turn, idle = handles
    override = _next_harness_override(stack)
    try:
        await _gateway_turn(client, idle.id, 1)
        turn = asyncio.create_task(_gateway_turn(client, mid_turn.id, 1))

        async def held() -> bool:
            return await asyncio.to_thread(_command_runs, stack.engine, mid_turn.id, "sleep 0.2")  # its wait

        await until(held, "the turn's command running", 90)

        # Deploy the next build beside the first, and promote it while the command runs.
        await asyncio.to_thread(stack.run, "up", "--detach", "--no-deps", "offline-harness-next", overrides=(override,))

        async def next_build_polls() -> bool:
            state = await describe_deployment(temporal, DEPLOYMENT)
            return state is not None and NEXT_BUILD in {build.build_id for build in state.builds}

        try:
            await until(next_build_polls, "the next build polling", 120.0)
        except AssertionError:
            dumped = stack.run("logs", "--no-color", "offline-harness-next", check=False, overrides=(override,))
            output = dumped.stdout[-3000:] + dumped.stderr[-2000:]
            raise AssertionError(f"offline-harness-next did not poll:\n{output}") from None
        promoted = await asyncio.to_thread(
            CliRunner().invoke, app,
            ["--address", stack.temporal_address, "harness", "promote", NEXT_BUILD, "--deployment", DEPLOYMENT,
             "--timeout", "120"],
        )  # fmt: skip
        assert promoted.exit_code == 0, promoted.output
        state = await describe_deployment(temporal, DEPLOYMENT)
        assert state is not None and state.current == NEXT_BUILD
        assert {build.build_id: build.status for build in state.builds}[first] == "draining", state

        # The session mid-turn ends its turn: its run stays on the first build (the next one could not replay
        # it), and it continues as new onto the next build before its next model call.
        for container in session_containers(stack.engine, mid_turn.id):
            await asyncio.to_thread(container.exec_run, ["touch", "/workspace/go"])
        await turn
        assert await _builds_of_runs(temporal, mid_turn) == [{first}, {NEXT_BUILD}]
        # The idle session moves when its next message comes.
        await _gateway_turn(client, idle.id, 2)
        idle_runs = await _builds_of_runs(temporal, idle)
        assert idle_runs[0] == {first} and idle_runs[-1] == {NEXT_BUILD}, idle_runs
        # The log across the runs, as the gateway lists it (earlier runs' events are in the stack's blob store).
        logs = [[event async for event in client.beta.sessions.events.list(h.id, limit=100)] for h in (mid_turn, idle)]
    finally:
        for handle in (idle, mid_turn):
            with contextlib.suppress(Exception):
                await handle.terminate("test over")
            await asyncio.to_thread(remove_session, stack.engine, handle.id, True)
        shutil.rmtree(override.parent, ignore_errors=True)
    for log in logs:  # each event once
        assert len({event.id for event in log}) == len(log)
    mid_turn_log, idle_log = ([event.model_dump(mode="json") for event in log] for log in logs)
    assert _kinds(mid_turn_log) == ["user.message", "session.status_running", "span.model_request_start",
                                    "span.model_request_end", "agent.tool_use", "agent.tool_result",
                                    "span.model_request_start", "span.model_request_end", "agent.message",
                                    "session.status_idle"]  # fmt: skip
    assert _texts(mid_turn_log, "agent.tool_result") == ["upgraded"]
    assert _texts(mid_turn_log, "agent.message")[-1] == "upgrade-done"
    assert _kinds(idle_log).count("user.message") == 2 and _kinds(idle_log).count("session.status_idle") == 2
    assert _texts(idle_log, "agent.message") == ["upgrade-done"] * 2


async def _gateway_turn(client: anthropic.AsyncAnthropic, session_id: str, turn: int) -> None:
    """Send turn `turn`'s message through the gateway and wait, listing the log through it, for the turn's end."""
    message = {"type": "user.message", "content": [{"type": "text", "text": f"turn {turn}"}]}
    await client.beta.sessions.events.send(session_id, events=[message])  # type: ignore[list-item]

    async def ended() -> bool:
        types = [event.type async for event in client.beta.sessions.events.list(session_id, limit=100)]
        return types.count("session.status_idle") == turn

    await until(ended, f"the end of turn {turn}", TURN_WITHIN)


def _kinds(log: list[dict[str, Any]]) -> list[str]:
    return [event["type"] for event in log if event["type"] != "agent.thinking"]


def _texts(log: list[dict[str, Any]], kind: str) -> list[str]:
    return ["".join(str(block.get("text", "")) for block in event.get("content") or []) for event in log
            if event["type"] == kind]  # fmt: skip
