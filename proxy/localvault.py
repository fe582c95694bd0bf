"""The OpenBao server `corral up` runs: durable storage under the state dir, initialised once, unsealed each start.

Unlike the in-memory dev server (`devvault.py`, for tests), everything a user puts in it survives `corral down`,
`corral up` and a reboot. It lives in `<state_dir>/openbao/` (mode 0700):

- `data/`: the integrated (raft) storage, encrypted at rest by OpenBao;
- `init.json` (mode 0600): the unseal key and root token from the one-time initialisation. Whoever reads it reads
  every credential: it is kept for this user alone, like an SSH key. Production uses a real Vault or OpenBao with
  auto-unseal (a cloud KMS or an HSM) instead, and never stores an unseal key beside the data;
- `gateway.json` (mode 0600): the gateway's AppRole login (`proxy.access`): it writes credentials and cannot read
  one back; `corral up` gives the gateway this, never the root token;
- `config.hcl`, written at each start (the address may change); `server.json`: the running server's address and
  pid; `server.log`: its log, which holds neither the key nor the token (the server prints no banner in this mode).

One unseal key (one share, threshold one) is enough here: the key and the data sit on the same disk, so splitting
the key would only make it look safer.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, TypeVar

import httpx
from pydantic import BaseModel, SecretStr

from proxy.access import AppRoleLogin, ensure_gateway_role
from proxy.devvault import DevVault, ensure_kv_v2_mount, find_bao_binary, free_port_pair
from proxy.errors import DevVaultError
from proxy.layout import DEFAULT_MOUNT
from proxy.vault import VaultStore

LOCAL_DIR = "openbao"
_INIT = "init.json"
_SERVER = "server.json"
_GATEWAY = "gateway.json"

_M = TypeVar("_M", bound=BaseModel)

Arrival = Literal["running", "unsealed", "initialised"]
"""How `ensure_local_vault` found it: already up and unsealed, started and unsealed, or created just now."""


class _InitMaterial(BaseModel):
    unseal_key: SecretStr
    root_token: SecretStr


class _GatewayLogin(BaseModel):
    role_id: str
    secret_id: SecretStr


class _ServerRecord(BaseModel):
    address: str
    pid: int


@dataclass(frozen=True)
class LocalVault:
    """The running local OpenBao (`vault`), how it was found (`arrival`), and the gateway's write-only login."""

    vault: DevVault
    arrival: Arrival
    directory: Path
    gateway: AppRoleLogin


def local_vault_dir(state_dir: Path) -> Path:
    return state_dir / LOCAL_DIR


def ensure_local_vault(state_dir: Path, *, mount: str = DEFAULT_MOUNT, startup_timeout: float = 60.0) -> LocalVault:
    """The local OpenBao of `state_dir`, started, initialised and unsealed as needed, with a KV v2 engine at
    `mount`. Idempotent: a server that already answers is reused (and unsealed if it was sealed). A server started
    here is stopped again if it cannot be made ready, so a failed `corral up` leaves no process behind."""
    directory = local_vault_dir(state_dir)
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    record = _read_model(directory / _SERVER, _ServerRecord)
    started = record is None or not _is_ours(record.pid, directory) or _health(record.address) is None
    if started:
        record = _start(directory, record, startup_timeout)
    assert record is not None
    try:
        vault, arrival = _make_ready(directory, record, mount, startup_timeout)
        gateway = _gateway_login(directory, vault)
    except BaseException:
        if started:
            stop_local_vault(state_dir)
        raise
    return LocalVault(vault=vault, arrival=arrival, directory=directory, gateway=gateway)


def _gateway_login(directory: Path, vault: DevVault) -> AppRoleLogin:
    """The gateway's AppRole (made or kept), and no secret left where its policy lets it read (credentials written
    before secrets had their own path keep them inline: they are moved first)."""
    client = vault.client()
    VaultStore(client, vault.mount).move_inline_secrets()
    kept = _read_model(directory / _GATEWAY, _GatewayLogin)
    login = ensure_gateway_role(
        client, vault.mount, AppRoleLogin(kept.role_id, kept.secret_id) if kept is not None else None
    )
    if kept is None or (kept.role_id, kept.secret_id) != (login.role_id, login.secret_id):
        record = {"role_id": login.role_id, "secret_id": login.secret_id.get_secret_value()}
        _write_private(directory / _GATEWAY, json.dumps(record))
    return login


def _make_ready(directory: Path, record: _ServerRecord, mount: str, timeout: float) -> tuple[DevVault, Arrival]:
    arrival: Arrival = "running"
    state = _health(record.address)
    if state is not None and not state["initialized"]:
        _initialise(directory, record.address)
        arrival = "initialised"
    material = _read_model(directory / _INIT, _InitMaterial)
    if material is None:
        raise DevVaultError(
            f"the OpenBao in {directory} is initialised but its unseal key and token are missing ({directory / _INIT});"
            " restore that file from a backup of the state dir, or remove the directory to start afresh (its vaults"
            " are then lost)"
        )
    if state is None or state["sealed"]:
        _unseal(record.address, material.unseal_key, timeout)
        arrival = "initialised" if arrival == "initialised" else "unsealed"
    vault = DevVault(
        address=record.address, root_token=material.root_token, mount=mount, log_path=directory / "server.log",
        pid=record.pid,
    )  # fmt: skip
    _wait_active(vault, timeout)
    ensure_kv_v2_mount(vault.client(), mount)
    return vault, arrival


def stop_local_vault(state_dir: Path, timeout: float = 10.0) -> bool:
    """Stop the recorded server (it seals itself; the data stays). True when one was running."""
    directory = local_vault_dir(state_dir)
    record = _read_model(directory / _SERVER, _ServerRecord)
    if record is None or not _is_ours(record.pid, directory):
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(record.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _is_ours(record.pid, directory) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _is_ours(record.pid, directory):
        with contextlib.suppress(ProcessLookupError):
            os.kill(record.pid, signal.SIGKILL)
    return True


def _start(directory: Path, previous: _ServerRecord | None, timeout: float) -> _ServerRecord:
    """Start the server on the port it had (so addresses others recorded stay right) if free, else a free pair."""
    port = int(previous.address.rsplit(":", 1)[1]) if previous is not None else None
    if port is None or not _free(port):
        port = free_port_pair("127.0.0.1")
    address = f"http://127.0.0.1:{port}"
    (directory / "data").mkdir(mode=0o700, exist_ok=True)
    config = directory / "config.hcl"
    config.write_text(
        f'storage "raft" {{\n  path = "{directory / "data"}"\n  node_id = "corral"\n  performance_multiplier = 1\n}}\n'
        f'listener "tcp" {{\n  address = "127.0.0.1:{port}"\n  cluster_address = "127.0.0.1:{port + 1}"\n'
        "  tls_disable = true\n}\n"
        f'api_addr = "{address}"\ncluster_addr = "http://127.0.0.1:{port + 1}"\nui = false\n'
    )
    # Only what a server needs: the user's environment may hold a model API key or other credentials.
    env = {key: os.environ[key] for key in ("PATH", "HOME", "TMPDIR", "LANG", "TZ") if key in os.environ}
    with (directory / "server.log").open("ab") as log:
        process = subprocess.Popen(
            [str(find_bao_binary()), "server", f"-config={config}"],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, cwd=directory, start_new_session=True,
        )  # fmt: skip
    record = _ServerRecord(address=address, pid=process.pid)
    deadline = time.monotonic() + timeout
    while _health(address) is None:
        if process.poll() is not None:
            raise DevVaultError(f"OpenBao exited with code {process.returncode}; see {directory / 'server.log'}")
        if time.monotonic() > deadline:
            process.kill()
            raise DevVaultError(f"OpenBao did not answer within {timeout:.0f} s; see {directory / 'server.log'}")
        time.sleep(0.05)
    _write_private(directory / _SERVER, record.model_dump_json())
    return record


def _initialise(directory: Path, address: str) -> None:
    """The one-time initialisation: one unseal key, kept with the root token in `init.json` (0600) before anything
    else can fail, since the server never shows them again."""
    response = httpx.put(f"{address}/v1/sys/init", json={"secret_shares": 1, "secret_threshold": 1}, timeout=120)
    if response.status_code != 200:
        raise DevVaultError(f"OpenBao refused to initialise (HTTP {response.status_code})")
    answer = response.json()
    material = _InitMaterial(unseal_key=answer["keys_base64"][0], root_token=answer["root_token"])
    _write_private(
        directory / _INIT,
        json.dumps({
            "unseal_key": material.unseal_key.get_secret_value(),
            "root_token": material.root_token.get_secret_value(),
        }),
    )  # fmt: skip


def _unseal(address: str, key: SecretStr, timeout: float) -> None:
    response = httpx.put(f"{address}/v1/sys/unseal", json={"key": key.get_secret_value()}, timeout=timeout)
    if response.status_code != 200 or response.json().get("sealed", True):
        raise DevVaultError(
            f"OpenBao at {address} did not unseal with the key in the state dir (HTTP {response.status_code})"
        )


def _wait_active(vault: DevVault, timeout: float) -> None:
    """After an unseal, the single raft node elects itself before it serves requests (429 = standby until then)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{vault.address}/v1/sys/health", timeout=2).status_code == 200:
                return
        time.sleep(0.1)
    raise DevVaultError(f"OpenBao at {vault.address} did not become active within {timeout:.0f} s")


def _health(address: str) -> dict[str, bool] | None:
    """`initialized` and `sealed`, or None when nothing answers there (any status counts as an answer)."""
    try:
        response = httpx.get(
            f"{address}/v1/sys/health", params={"standbyok": "true", "uninitcode": "200", "sealedcode": "200"},
            timeout=2,
        )  # fmt: skip
        body = response.json()
        return {"initialized": bool(body["initialized"]), "sealed": bool(body["sealed"])}
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return None


def _read_model(path: Path, model: type[_M]) -> _M | None:
    try:
        return model.model_validate_json(path.read_text())
    except (OSError, ValueError):
        return None


def _write_private(path: Path, text: str) -> None:
    """Write `text` to `path`, readable by this user alone from the first byte (then moved into place whole)."""
    partial = path.with_name(path.name + ".partial")
    partial.unlink(missing_ok=True)
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    partial.replace(path)


def _free(port: int) -> bool:
    for candidate in (port, port + 1):
        with socket.socket() as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds: TIME_WAIT is no obstacle
            try:
                probe.bind(("127.0.0.1", candidate))
            except OSError:
                return False
    return True


def _is_ours(pid: int, directory: Path) -> bool:
    """The pid runs `bao server` with this state dir's config (not a reused pid, not another user's server)."""
    try:
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return str(directory / "config.hcl").encode() in command and "\nState:\tZ" not in status
