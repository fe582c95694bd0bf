"""The Vault login is read from an environment in one place (`proxy.login`), and every process reads it there.

Pure functions: no Vault is needed to read an environment (logging in is tested against OpenBao in
test_proxy_vault.py, test_gateway_vaults.py and test_worker_settings.py)."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import proxy
from cli.main import app
from proxy import VaultLogin, VaultLoginIncomplete, vault_address
from proxy.layout import DEFAULT_MOUNT
from proxy.login import LOGIN_ENV, NO_ADDRESS, NO_LOGIN, vault_mount

ROOT = Path(__file__).resolve().parents[1]
CANARY = "canary-vault-login-5e1f0a"


@pytest.mark.parametrize("address", ["VAULT_ADDR", "BAO_ADDR"])
@pytest.mark.parametrize("token", ["VAULT_TOKEN", "BAO_TOKEN"])
def test_either_address_and_either_token_make_a_login(address: str, token: str) -> None:
    login = VaultLogin.from_environment({address: "http://vault:8200", token: CANARY})
    assert (login.address, login.token, login.role_id, login.secret_id) == ("http://vault:8200", CANARY, None, None)


def test_the_vault_names_win_over_the_openbao_ones_and_an_empty_one_counts_as_unset() -> None:
    both = {"VAULT_ADDR": "http://v", "BAO_ADDR": "http://b", "VAULT_TOKEN": "vt", "BAO_TOKEN": "bt"}
    login = VaultLogin.from_environment(both)
    assert (login.address, login.token) == ("http://v", "vt")
    login = VaultLogin.from_environment({**both, "VAULT_ADDR": "", "VAULT_TOKEN": ""})
    assert (login.address, login.token) == ("http://b", "bt")
    assert vault_address({"VAULT_ADDR": "", "BAO_ADDR": ""}) is None


def test_an_approle_login_and_a_token_winning_over_it() -> None:
    approle = {"BAO_ADDR": "http://bao:8200", "VAULT_ROLE_ID": "role-1", "VAULT_SECRET_ID": CANARY}
    login = VaultLogin.from_environment(approle)
    assert (login.token, login.role_id, login.secret_id) == (None, "role-1", CANARY)
    assert VaultLogin.from_environment({**approle, "VAULT_TOKEN": "t"}).token == "t"
    half = {"VAULT_ADDR": "http://v", "VAULT_TOKEN": "t", "VAULT_ROLE_ID": "role-1"}
    assert VaultLogin.from_environment(half).token == "t", "a token needs no AppRole: half of one is not looked at"


@pytest.mark.parametrize(
    ("given", "message"),
    [
        ({"VAULT_ROLE_ID": "role-1"}, "VAULT_ROLE_ID is set without VAULT_SECRET_ID: "),
        ({"VAULT_SECRET_ID": CANARY}, "VAULT_SECRET_ID is set without VAULT_ROLE_ID: "),
        ({"VAULT_ROLE_ID": "role-1", "VAULT_SECRET_ID": ""}, "VAULT_ROLE_ID is set without VAULT_SECRET_ID: "),
        ({}, ""),
    ],
)
def test_a_half_given_approle_or_no_login_is_refused_naming_what_to_set(given: dict[str, str], message: str) -> None:
    with pytest.raises(VaultLoginIncomplete) as refused:
        VaultLogin.from_environment({"VAULT_ADDR": "http://vault:8200", **given})
    assert str(refused.value) == message + NO_LOGIN
    assert NO_LOGIN == "set VAULT_TOKEN, or VAULT_ROLE_ID and VAULT_SECRET_ID (AppRole)"
    assert CANARY not in str(refused.value)


def test_no_address_is_refused_naming_both_variables() -> None:
    with pytest.raises(VaultLoginIncomplete, match=r"set VAULT_ADDR \(or BAO_ADDR\)") as refused:
        VaultLogin.from_environment({"VAULT_TOKEN": CANARY, "VAULT_ADDR": ""})
    assert str(refused.value) == NO_ADDRESS and CANARY not in str(refused.value)


def test_the_mount_defaults_to_corral() -> None:
    assert DEFAULT_MOUNT == "corral"
    token = {"VAULT_ADDR": "http://v", "VAULT_TOKEN": "t"}
    assert VaultLogin.from_environment(token).mount == vault_mount({}) == "corral"
    assert VaultLogin.from_environment({**token, "CORRAL_VAULT_MOUNT": ""}).mount == "corral"
    assert VaultLogin.from_environment({**token, "CORRAL_VAULT_MOUNT": "team-kv"}).mount == "team-kv"


def test_no_token_or_secret_id_shows_in_a_repr() -> None:
    shown = repr(VaultLogin("http://v", token=CANARY)) + repr(VaultLogin("http://v", role_id="r", secret_id=CANARY))
    assert CANARY not in shown and "http://v" in shown


def test_the_cli_refuses_a_half_given_approle_and_starts_no_vault_of_its_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`corral vault` reads the login as the proxy worker does: a Vault named without a whole login is refused,
    saying what to set, and no OpenBao of the state dir (which the proxy would never see) takes the credential."""
    for name in (*LOGIN_ENV, "CORRAL_VAULT_MOUNT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("VAULT_ADDR", "http://127.0.0.1:9")  # never asked: the login is refused before
    monkeypatch.setenv("VAULT_ROLE_ID", "role-1")
    result = CliRunner().invoke(app, ["--state-dir", str(tmp_path), "vault", "create", "team"])
    assert result.exit_code == 2, result.output
    assert "VAULT_ROLE_ID is set without VAULT_SECRET_ID" in result.output and "Traceback" not in result.output
    assert not (tmp_path / "openbao").exists(), "no OpenBao was started in the state dir"


# ---- read in one place ----------------------------------------------------------------------------------------------

HOME = ROOT / "proxy" / "login.py"
ELSEWHERE = {ROOT / "deploy" / "openbao_entrypoint.py"}
"""The OpenBao container's entry point runs on the standard library alone (it is copied into an image without
corral), so it spells the one variable it reads, the mount, itself."""


def test_no_module_but_proxy_login_spells_a_vault_login_variable() -> None:
    """A variable's name written as a string elsewhere is a second reading of the login: import it instead."""
    names = {*LOGIN_ENV, "CORRAL_VAULT_MOUNT"}
    found = []
    for package in ("corral", "workflows", "activities", "workers", "proxy", "gateway", "cli", "relay", "deploy"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path == HOME or path in ELSEWHERE:
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Constant) and node.value in names:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {node.value}")
    assert found == [], f"read these from proxy.login: {found}"


def test_a_worker_reading_its_settings_loads_no_mcp_or_vault_client() -> None:
    """Every worker reads its settings through `proxy.login`; the proxy's heavy modules load on first use only."""
    probe = "import sys, workers.settings; print(sorted(m for m in sys.modules if m in ('proxy.mcp', 'proxy.vault')))"
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert loaded.strip() == "[]"


def test_every_public_name_of_the_proxy_resolves_from_its_home() -> None:
    assert sorted(proxy.__all__) == sorted(proxy.HOMES)
    for name in proxy.__all__:
        assert getattr(proxy, name) is getattr(importlib.import_module(proxy.HOMES[name]), name), name
