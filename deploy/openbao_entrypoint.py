"""The OpenBao container's main process (images/openbao): start `bao server`, make it ready, then wait on it.

The same steps as `corral up`'s local OpenBao (proxy/localvault.py), for a server that other containers reach:

1. start `bao server` with integrated (raft) storage in `/openbao/data`, listening on every address;
2. the first time, initialise it with one unseal key and keep the key and the root token in `/openbao/init.json`
   (mode 0600, on the same volume as the data: like `corral up`'s state dir, this is for one machine; production
   uses Vault or OpenBao with auto-unseal and never keeps an unseal key beside the data);
3. at every start, unseal it with that key and wait until it is active;
4. make the KV v2 engine the proxy uses (`corral/`, one version per secret), an ACL policy that allows that engine
   alone, and an AppRole with that policy; the AppRole's role_id and a secret_id go to `/openbao-login` (mode
   0640, group corral), a volume the proxy worker mounts read-only. The gateway gets an AppRole of its own, whose
   policy writes credentials but never reads one back (the one of proxy/access.py, copied here: this file imports
   nothing from corral), in `/openbao-gateway-login`, a volume only the gateway mounts. The root token never
   leaves this container;
5. wait for the server: its exit ends the container (and the restart policy starts it again, sealed, so step 3
   runs again); SIGTERM is passed on, and OpenBao seals itself as it stops.

`--check` is the container's health check: exit 0 once the server is active and the login is written.

It runs on Debian's python3 with the standard library alone (the image has no corral, no hvac): this module is
copied into the image as one file, so it imports nothing from corral either.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

HOME = Path(os.environ.get("CORRAL_OPENBAO_HOME", "/openbao"))
LOGIN_DIR = Path(os.environ.get("CORRAL_OPENBAO_LOGIN_DIR", "/openbao-login"))
GATEWAY_LOGIN_DIR = Path(os.environ.get("CORRAL_OPENBAO_GATEWAY_LOGIN_DIR", "/openbao-gateway-login"))
MOUNT = os.environ.get("CORRAL_VAULT_MOUNT", "corral")
PORT = 8200
ADDRESS = f"http://127.0.0.1:{PORT}"
ROLE = "corral-proxy"
READY_TIMEOUT_SECONDS = 60.0
POLICY = f"""
# What corral's proxy worker and gateway do: keep vaults and credentials in one KV v2 engine (proxy/vault.py), and
# check at login that the engine is there (proxy.devvault.ensure_kv_v2_mount reads the mount table).
path "{MOUNT}/*" {{ capabilities = ["create", "read", "update", "patch", "delete", "list"] }}
path "sys/mounts" {{ capabilities = ["read"] }}
"""
TOKEN_TTL = "768h"
"""Tokens of the AppRole: the proxy logs in once per process, so a token lives as long as the process may."""
GATEWAY_ROLE = "corral-gateway"
GATEWAY_TOKEN_TTL = "1h"
"""The gateway logs in again when Vault refuses an expired token (proxy/login.py's AppRole adapter)."""


def gateway_policy(mount: str) -> str:
    """proxy/access.py's `gateway_policy`, word for word (tests/test_stack_access.py compares them)."""
    lines = ["# corral's gateway: writes credentials, never reads one back (proxy/access.py)."]
    for folder in ("vaults", "credentials", "server_urls"):
        lines.append(f'path "{mount}/data/{folder}/*" {{ capabilities = ["create", "read", "update"] }}')
        lines.append(f'path "{mount}/metadata/{folder}/*" {{ capabilities = ["list", "delete"] }}')
    for folder in ("secrets", "webhook_secrets"):
        lines.append(f'path "{mount}/data/{folder}/*" {{ capabilities = ["create", "update"] }}')
        lines.append(f'path "{mount}/metadata/{folder}/*" {{ capabilities = ["list", "delete"] }}')
    lines.append(f'path "{mount}/data/sessions/+/repositories/*" {{ capabilities = ["create", "update"] }}')
    lines.append(f'path "{mount}/metadata/sessions/+/repositories/*" {{ capabilities = ["delete"] }}')
    return "\n".join(lines) + "\n"


class BootstrapError(Exception):
    """OpenBao could not be made ready; the message says which step failed (never a key or a token)."""


def config_text() -> str:
    return (
        f'storage "raft" {{\n  path = "{HOME / "data"}"\n  node_id = "corral"\n}}\n'
        f'listener "tcp" {{\n  address = "0.0.0.0:{PORT}"\n  cluster_address = "127.0.0.1:{PORT + 1}"\n'
        "  tls_disable = true\n}\n"
        f'api_addr = "{ADDRESS}"\ncluster_addr = "http://127.0.0.1:{PORT + 1}"\n'
        "disable_mlock = true\nui = false\n"
    )


def call(method: str, path: str, body: dict[str, Any] | None = None, token: str | None = None) -> dict[str, Any]:
    """One API call; the answer's JSON (empty for 204). An HTTP error is a BootstrapError naming the path."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{ADDRESS}/v1/{path}", data=data, method=method)
    request.add_header("Content-Type", "application/json")
    if token is not None:
        request.add_header("X-Vault-Token", token)
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            text = response.read().decode()
    except urllib.error.HTTPError as exc:
        raise BootstrapError(f"{method} /v1/{path}: HTTP {exc.code}") from None
    return json.loads(text) if text.strip() else {}


def health() -> dict[str, Any] | None:
    """`initialized`, `sealed`, `standby` whatever the state; None while nothing answers."""
    try:
        return call("GET", "sys/health?standbyok=true&uninitcode=200&sealedcode=200&standbycode=200")
    except (BootstrapError, OSError, ValueError):
        return None


def wait_for(condition: str, check: Any, process: subprocess.Popen[bytes] | None = None) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while not check():
        if process is not None and process.poll() is not None:
            raise BootstrapError(f"bao server exited with code {process.returncode} before it was {condition}")
        if time.monotonic() > deadline:
            raise BootstrapError(f"OpenBao was not {condition} within {READY_TIMEOUT_SECONDS:.0f} s")
        time.sleep(0.2)


def write_private(path: Path, text: str, mode: int) -> None:
    """Write `text` with `mode` from the first byte, then move it into place whole."""
    partial = path.with_name(path.name + ".partial")
    partial.unlink(missing_ok=True)
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(descriptor, "w") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    partial.replace(path)


def initialise_or_read() -> dict[str, str]:
    """The unseal key and root token: made now on a new server (kept before anything else can fail), else read."""
    init_file = HOME / "init.json"
    state = health()
    assert state is not None
    if not state["initialized"]:
        answer = call("PUT", "sys/init", {"secret_shares": 1, "secret_threshold": 1})
        made = {"unseal_key": answer["keys_base64"][0], "root_token": answer["root_token"]}
        write_private(init_file, json.dumps(made), 0o600)
        print("openbao: initialised; the unseal key and root token are in init.json on the data volume", flush=True)
        return made
    try:
        material: dict[str, str] = json.loads(init_file.read_text())
    except (OSError, ValueError):
        raise BootstrapError(
            f"OpenBao is initialised but {init_file} is missing or unreadable: restore it from a backup of the "
            "volume, or remove the volume to start afresh (its vaults are then lost)"
        ) from None
    return material


def unseal(material: dict[str, str]) -> None:
    state = health()
    if state is not None and state["sealed"]:
        answer = call("PUT", "sys/unseal", {"key": material["unseal_key"]})
        if answer.get("sealed", True):
            raise BootstrapError("OpenBao did not unseal with the key in init.json")
        print("openbao: unsealed", flush=True)

    def active() -> bool:
        try:
            call("GET", "sys/health")  # 200 only when initialised, unsealed and active
        except (BootstrapError, OSError, ValueError):
            return False
        return True

    wait_for("active", active)


def configure(token: str) -> None:
    """The KV v2 engine, the policy and the AppRole; each step is skipped when already done (every start runs it)."""
    mounts = call("GET", "sys/mounts", token=token)
    mounts = mounts.get("data", mounts)
    if f"{MOUNT}/" not in mounts:
        call("POST", f"sys/mounts/{MOUNT}", {"type": "kv", "options": {"version": "2"}}, token=token)
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while True:  # a new KV v2 engine answers 400 "Upgrading from non-versioned" for a moment
        try:
            call("POST", f"{MOUNT}/config", {"max_versions": 1}, token=token)
            break
        except BootstrapError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    auth = call("GET", "sys/auth", token=token)
    if "approle/" not in auth.get("data", auth):
        call("POST", "sys/auth/approle", {"type": "approle"}, token=token)
    approle(token, ROLE, POLICY, TOKEN_TTL, LOGIN_DIR)
    approle(token, GATEWAY_ROLE, gateway_policy(MOUNT), GATEWAY_TOKEN_TTL, GATEWAY_LOGIN_DIR)
    print(f"openbao: ready (KV v2 at {MOUNT}/, AppRoles {ROLE} and {GATEWAY_ROLE} written to {LOGIN_DIR} and "
          f"{GATEWAY_LOGIN_DIR})", flush=True)  # fmt: skip


def approle(token: str, name: str, policy: str, ttl: str, directory: Path) -> None:
    """A policy `name` and an AppRole `name` with it; its role_id and a secret_id written to `directory`."""
    call("PUT", f"sys/policies/acl/{name}", {"policy": policy}, token=token)
    role = {"token_policies": [name], "token_ttl": ttl, "token_max_ttl": ttl, "secret_id_ttl": "0"}
    call("POST", f"auth/approle/role/{name}", role, token=token)
    role_id = call("GET", f"auth/approle/role/{name}/role-id", token=token)["data"]["role_id"]
    write_private(directory / "role_id", role_id, 0o640)
    if not (directory / "secret_id").is_file():  # kept across restarts: running processes may log in again with it
        secret_id = call("POST", f"auth/approle/role/{name}/secret-id", {}, token=token)["data"]["secret_id"]
        write_private(directory / "secret_id", secret_id, 0o640)


def check() -> int:
    """The health check: active, and the login written."""
    try:
        call("GET", "sys/health")
    except (BootstrapError, OSError, ValueError):
        return 1
    logins = [directory / name for directory in (LOGIN_DIR, GATEWAY_LOGIN_DIR) for name in ("role_id", "secret_id")]
    return 0 if all(path.is_file() for path in logins) else 1


def main(argv: list[str]) -> int:
    if argv[1:] == ["--check"]:
        return check()
    (HOME / "data").mkdir(mode=0o700, exist_ok=True)
    config = HOME / "config.hcl"
    config.write_text(config_text())
    env = {key: os.environ[key] for key in ("PATH", "HOME", "LANG", "TZ") if key in os.environ}
    server = subprocess.Popen(["bao", "server", f"-config={config}"], env=env)
    signal.signal(signal.SIGTERM, lambda number, frame: server.send_signal(signal.SIGTERM))
    signal.signal(signal.SIGINT, lambda number, frame: server.send_signal(signal.SIGINT))
    try:
        wait_for("answering", lambda: health() is not None, server)
        material = initialise_or_read()
        unseal(material)
        configure(material["root_token"])
    except (BootstrapError, OSError, KeyError, ValueError) as exc:
        print(f"openbao: bootstrap failed: {exc}", file=sys.stderr, flush=True)
        server.terminate()
        server.wait()
        return 1
    return server.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv))
