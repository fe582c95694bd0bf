"""What each process of the stack `corral up` starts may do, tried on that stack: the gateway writes credentials
with a Vault login that cannot read one back (and never holds the root token), the vault routes work there end to
end (a credential written over HTTP is the one a session's MCP call carries; a validation runs in the proxy), and
the stream relay serves only holders of the token `corral up` keeps in the state dir (`corral tail` among them)."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import stat
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anthropic
import httpx
import hvac
import hvac.exceptions
import pytest
from rich.console import Console

from cli.live import LiveText
from cli.stack import STREAM_TOKEN_ENV, StackConfig, StatePaths, follow_with_stream_token, read_stream_token
from corral.client import wait_for_idle
from corral.contract.events import AgentMcpToolResult
from corral.serving import ServerThread
from corral.temporal import connect
from deploy import openbao_entrypoint
from proxy import start_dev_vault
from proxy.access import gateway_policy
from proxy.layout import repository_path, secret_path
from relay import StreamEvent, subscribe
from tests.ports import free_port, listening_ephemeral_port
from tests.proxy_servers.devvault import scan_for
from tests.proxy_servers.mcp_server import create_mcp_app
from tests.proxy_servers.tokens import TokenAuthority
from tests.test_cli import corral, pids_in

pytestmark = pytest.mark.timeout(600)


@dataclass
class UpStack:
    """A stack `corral up` started, and what a test reads of it."""

    state_dir: Path
    env: dict[str, str]
    config: StackConfig

    def environ(self, name: str) -> dict[str, str]:
        """The environment the stack gave one of its processes, as the kernel holds it."""
        raw = Path(f"/proc/{pids_in(self.state_dir)[name]}/environ").read_bytes()
        return dict(entry.split("=", 1) for entry in raw.decode().split("\0") if "=" in entry)

    @property
    def root_token(self) -> str:
        return str(json.loads((self.state_dir / "openbao" / "init.json").read_text())["root_token"])

    @property
    def stream_token(self) -> str:
        return (self.state_dir / "stream.token").read_text().strip()

    def log(self, name: str) -> str:
        return (self.state_dir / "logs" / f"{name}.log").read_text(errors="replace")


@pytest.fixture(scope="module")
def up_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpStack]:
    state_dir = tmp_path_factory.mktemp("stack") / "state"
    env = {key: value for key, value in os.environ.items() if not key.startswith(("ANTHROPIC_", "CORRAL_", "VAULT_"))}
    env["CORRAL_STATE_DIR"] = str(state_dir)
    ports = ["--temporal-port", str(free_port()), "--ui-port", str(free_port()), "--model-port", str(free_port())]
    ports += ["--stream-port", str(free_port()), "--git-proxy-port", str(free_port()), "--api-port", str(free_port())]
    try:
        up = corral(env, "up", *ports, timeout=300)
        assert up.returncode == 0, up.stdout + up.stderr
        config = StackConfig.model_validate_json((state_dir / "stack.json").read_text())
        yield UpStack(state_dir, env, config)
    finally:
        corral(env, "down", "--sandboxes")


def test_the_gateway_gets_a_write_only_vault_login_and_never_the_root_token(up_stack: UpStack) -> None:
    gateway, proxy = up_stack.environ("gateway"), up_stack.environ("proxy-worker")
    root = up_stack.root_token
    assert proxy["VAULT_TOKEN"] == root, "the proxy worker reads credentials: it has the full login"
    assert "VAULT_TOKEN" not in gateway and root not in "\0".join(f"{k}={v}" for k, v in gateway.items())
    assert gateway["VAULT_ADDR"] == proxy["VAULT_ADDR"]

    # The gateway's own login, as the gateway logs in: Vault refuses it every read of a secret, allows the writes.
    client = hvac.Client(url=gateway["VAULT_ADDR"])
    client.auth.approle.login(role_id=gateway["VAULT_ROLE_ID"], secret_id=gateway["VAULT_SECRET_ID"])
    kv = client.secrets.kv.v2
    canary = "canary-write-only-" + uuid.uuid4().hex
    path = secret_path(f"vlt_{uuid.uuid4().hex[:26]}", "vcrd_written")
    kv.create_or_update_secret(path=path, secret={"token": canary}, mount_point="corral")
    repository = repository_path("sesn_x", "repo1")
    kv.create_or_update_secret(path=repository, secret={"token": canary}, mount_point="corral")
    for written in (path, repository):
        with pytest.raises(hvac.exceptions.Forbidden):
            kv.read_secret_version(path=written, mount_point="corral", raise_on_deleted_version=True)
    with pytest.raises(hvac.exceptions.Forbidden):
        client.sys.list_mounted_secrets_engines()
    full = hvac.Client(url=gateway["VAULT_ADDR"], token=root)
    stored = full.secrets.kv.v2.read_secret_version(path=path, mount_point="corral", raise_on_deleted_version=True)
    assert stored["data"]["data"] == {"token": canary}, "the write landed; only the proxy's login reads it back"
    login = up_stack.state_dir / "openbao" / "gateway.json"
    assert stat.S_IMODE(login.stat().st_mode) == 0o600


async def test_the_vault_routes_work_on_the_stack_corral_up_starts(up_stack: UpStack) -> None:
    assert up_stack.config.api_url is not None
    made = corral(up_stack.env, "api-key", "create", "--workspace", "vault-team")
    assert made.returncode == 0, made.stderr
    client = anthropic.AsyncAnthropic(base_url=up_stack.config.api_url, api_key=made.stdout.strip(), max_retries=0)
    authority = TokenAuthority()
    token = authority.issue_access_token(prefix="canary-bearer")
    validated = authority.issue_access_token(prefix="canary-oauth")
    repository_token = "ghp_canary" + uuid.uuid4().hex
    with ServerThread(lambda url: create_mcp_app(authority, url), name="mcp", lifespan="on", app_takes_url=True) as mcp:
        mcp_url = f"{mcp.base_url}/mcp"
        vault = await client.beta.vaults.create(display_name="on corral up")
        credential = await client.beta.vaults.credentials.create(
            vault.id, auth={"type": "static_bearer", "mcp_server_url": mcp_url, "token": token}
        )
        assert [c.id async for c in client.beta.vaults.credentials.list(vault.id)] == [credential.id]
        relabelled = await client.beta.vaults.credentials.update(credential.id, vault_id=vault.id, display_name="x")
        assert relabelled.display_name == "x"

        # mcp_oauth_validate needs the token, so the proxy worker runs it.
        checked = await client.beta.vaults.create(display_name="validated")
        oauth = await client.beta.vaults.credentials.create(
            checked.id, auth={"type": "mcp_oauth", "mcp_server_url": mcp_url, "access_token": validated}
        )
        verdict = await client.beta.vaults.credentials.mcp_oauth_validate(oauth.id, vault_id=checked.id)
        assert (verdict.status, verdict.mcp_probe) == ("valid", None)

        agent = await client.beta.agents.create(
            name="mcp user",
            model="corral-offline-stand-in",
            mcp_servers=[{"type": "url", "name": "tools", "url": mcp_url}],
            tools=[
                {
                    "type": "mcp_toolset",
                    "mcp_server_name": "tools",
                    "default_config": {"permission_policy": {"type": "always_allow"}},
                }
            ],
        )
        environment = await client.beta.environments.create(name="plain")
        session = await client.beta.sessions.create(
            agent=agent.id,
            environment_id=environment.id,
            vault_ids=[vault.id],
            resources=[
                {
                    "type": "github_repository",
                    "url": "https://git.example/acme/widgets.git",
                    "authorization_token": repository_token,
                }
            ],
        )
        await client.beta.sessions.events.send(
            session.id,
            events=[{"type": "user.message", "content": [{"type": "text", "text": "mcp__tools__echo hello there"}]}],
        )
        temporal = await connect(up_stack.config.temporal_address, up_stack.config.namespace)
        events = await wait_for_idle(temporal.get_workflow_handle(session.id), within_seconds=120)
        [result] = [event for event in events if isinstance(event, AgentMcpToolResult)]
        assert not result.is_error and result.content[0].text == "hello there"
        assert authority.tool_calls == [("echo", token)], "the call carried the token written over HTTP"
        listed = [e.model_dump_json() async for e in client.beta.sessions.events.list(session.id)]

    secrets = [token, validated, repository_token]
    assert scan_for(secrets, up_stack.log("gateway"), *listed, credential.model_dump_json()) == []


class RecordingLiveText(LiveText):
    """The CLI's live view (what `corral tail` prints deltas with), recording what the relay sent it."""

    def __init__(self) -> None:
        super().__init__(Console(file=io.StringIO()))
        self.ended = asyncio.Event()
        self.text = ""

    def on_stream(self, event: StreamEvent) -> None:
        self.text += event.text if event.type == "delta" else ""
        if event.type == "end":
            self.ended.set()
        super().on_stream(event)


async def test_the_stream_relay_serves_only_holders_of_the_token(
    up_stack: UpStack, monkeypatch: pytest.MonkeyPatch
) -> None:
    token_file = up_stack.state_dir / "stream.token"
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    relay = up_stack.config.stream_url
    assert relay is not None
    for name in ("stream-relay", "gateway", "all-in-one"):
        assert up_stack.environ(name)["CORRAL_STREAM_TOKEN"] == up_stack.stream_token, name
    assert "CORRAL_STREAM_TOKEN" not in up_stack.environ("proxy-worker")

    record = json.dumps({"span_id": "span_x", "block": 0, "kind": "text", "offset": 0, "text": "hi"}) + "\n"
    async with httpx.AsyncClient(base_url=relay, timeout=10) as http:
        for headers in ({}, {"Authorization": "Bearer not-the-token"}):
            refused = await http.post("/v1/streams/sesn_x/publish", content=record, headers=headers)
            assert refused.status_code == 401, refused.text
            async with http.stream("GET", "/v1/streams/sesn_x", headers=headers) as response:
                assert response.status_code == 401

    # The model worker publishes with the token: a subscriber holding it sees the reply's text live.
    seen: list[StreamEvent] = []
    started = corral(up_stack.env, "start", "hello relay")  # the relay keeps a span's text for late subscribers
    assert started.returncode == 0, started.stdout + started.stderr
    session_id = started.stdout.strip()

    async def follow() -> None:
        async with contextlib.aclosing(subscribe(relay, session_id, token=up_stack.stream_token)) as events:
            async for event in events:
                seen.append(event)
                if event.type == "end":
                    return

    await asyncio.wait_for(follow(), timeout=120)
    assert "".join(event.text for event in seen if event.type == "delta").startswith("[offline stand-in model]")

    # The CLI's live view takes the token from the state dir (as every `corral` command does at start) and gets
    # the text; without it, it would get a 401 and show nothing live (a lost live view is silent by design).
    monkeypatch.setenv(STREAM_TOKEN_ENV, "not-the-token")  # restored afterwards; the CLI's start replaces it
    monkeypatch.delenv("CORRAL_STREAM_URL", raising=False)
    follow_with_stream_token(read_stream_token(StatePaths(up_stack.state_dir)))
    live = RecordingLiveText()
    following = asyncio.create_task(live.follow(relay, session_id))
    ended = asyncio.create_task(live.ended.wait())
    await asyncio.wait({following, ended}, timeout=120, return_when=asyncio.FIRST_COMPLETED)
    following.cancel()
    ended.cancel()
    assert live.ended.is_set() and live.text.startswith("[offline stand-in model]"), live.text

    # `corral tail` (a process of its own) runs through, and prints the reply.
    tail = corral(up_stack.env, "tail", session_id)
    assert tail.returncode == 0, tail.stdout + tail.stderr
    assert "offline stand-in" in tail.stdout


def test_a_port_in_the_ephemeral_range_is_warned_about_and_a_taken_port_is_named(tmp_path: Path) -> None:
    """`corral up` with a port in the kernel's range for outgoing connections says why that is fragile; a port
    that is taken is named, with the option that moves it and the process that holds it."""
    low, high = (int(part) for part in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    env = {key: value for key, value in os.environ.items() if not key.startswith(("ANTHROPIC_", "CORRAL_", "VAULT_"))}
    env["CORRAL_STATE_DIR"] = str(tmp_path / "state")
    with listening_ephemeral_port() as taken:
        assert low <= taken <= high, "the kernel gave a port from its own range"
        up = corral(env, "up", "--temporal-port", str(taken), "--ui-port", str(free_port()), timeout=120)
    try:
        said = " ".join((up.stdout + up.stderr).split())
        assert up.returncode != 0
        assert f"port {taken} (--temporal-port) lies in the kernel's range for outgoing connections" in said
        assert f"port {taken} (Temporal gRPC, set by --temporal-port) is already in use by pid {os.getpid()}" in said
        assert "Traceback" not in said
    finally:
        corral(env, "down")


def test_the_gateway_policy_is_one_in_the_guide_corral_up_and_the_compose_openbao() -> None:
    guide = (Path(__file__).resolve().parent.parent / "docs" / "operations.md").read_text()
    assert f"```hcl\n{gateway_policy('corral')}```" in guide
    for mount in ("corral", "other"):  # the compose image's copy (it imports nothing from corral)
        assert openbao_entrypoint.gateway_policy(mount) == gateway_policy(mount)


def test_the_compose_openbao_gives_the_gateway_a_login_of_its_own_that_cannot_read_a_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The compose file's OpenBao bootstrap on a real OpenBao: two logins in two directories (two volumes), the
    proxy's reads credentials, the gateway's writes them and is refused the read."""
    with start_dev_vault(tmp_path / "bao") as vault:
        monkeypatch.setattr(openbao_entrypoint, "ADDRESS", vault.address)
        monkeypatch.setattr(openbao_entrypoint, "LOGIN_DIR", tmp_path / "proxy-login")
        monkeypatch.setattr(openbao_entrypoint, "GATEWAY_LOGIN_DIR", tmp_path / "gateway-login")
        for directory in (tmp_path / "proxy-login", tmp_path / "gateway-login"):
            directory.mkdir()
        openbao_entrypoint.configure(vault.root_token.get_secret_value())

        def logged_in(directory: Path) -> hvac.Client:
            client = hvac.Client(url=vault.address)
            role_id, secret_id = ((directory / name).read_text() for name in ("role_id", "secret_id"))
            client.auth.approle.login(role_id=role_id, secret_id=secret_id)
            return client

        proxy, gateway = logged_in(tmp_path / "proxy-login"), logged_in(tmp_path / "gateway-login")
        path = secret_path("vlt_compose", "vcrd_compose")
        gateway.secrets.kv.v2.create_or_update_secret(path=path, secret={"token": "canary"}, mount_point="corral")
        with pytest.raises(hvac.exceptions.Forbidden):
            gateway.secrets.kv.v2.read_secret_version(path=path, mount_point="corral", raise_on_deleted_version=True)
        read = proxy.secrets.kv.v2.read_secret_version(path=path, mount_point="corral", raise_on_deleted_version=True)
        assert read["data"]["data"] == {"token": "canary"}
