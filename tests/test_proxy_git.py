"""git through the proxy: the real `git` CLI clones and pushes via `http://<proxy>/<reference>/<repo_id>` with no
token anywhere on its side, and a real smart-HTTP server (`git http-backend`) that demands the token receives it.
A reference that is wrong, revoked, or another session's never gets a request forwarded."""

from __future__ import annotations

import logging
import random
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from corral.serving import ServerThread
from proxy import GitProxyServer, VaultStore
from proxy.devvault import DevVault
from tests.proxy_servers.devvault import scan_for, shared_dev_vault
from tests.proxy_servers.git_server import (
    GIT_USER,
    GitServerLog,
    create_git_app,
    git,
    isolated_git_env,
    make_bare_repository,
)

GIT_TOKEN = "canary-git-token-77e1f0"


@dataclass
class GitWorld:
    store: VaultStore
    proxy: GitProxyServer
    upstream: str
    bare: Path
    log: GitServerLog
    env: dict[str, str]
    tmp: Path

    def session(self, session_id: str, token: str = GIT_TOKEN) -> str:
        """Register the `app` repository for a session (as session creation will) and return its reference."""
        self.store.store_repository_token(session_id, "app", f"{self.upstream}/app.git", token)
        return self.store.bind_session(session_id, [])


@pytest.fixture(scope="session")
def dev_vault() -> DevVault:
    return shared_dev_vault()


@pytest.fixture
def world(dev_vault: DevVault, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> Iterator[GitWorld]:
    caplog.set_level(logging.DEBUG)
    root = tmp_path / "repositories"
    root.mkdir()
    bare = make_bare_repository(root, "app", tmp_path / "seed")
    log = GitServerLog()
    store = VaultStore(dev_vault.client())
    with (
        ServerThread(create_git_app(root, GIT_TOKEN, log), name="test-git-server") as upstream,
        GitProxyServer(store) as proxy,
    ):
        assert upstream.base_url is not None
        yield GitWorld(store, proxy, upstream.base_url, bare, log, isolated_git_env(tmp_path / "home"), tmp_path)
    assert scan_for([GIT_TOKEN], caplog.text) == [], "the git token reached the log"


def test_the_git_server_demands_the_token(world: GitWorld) -> None:
    refused = subprocess.run(
        ["git", "ls-remote", f"{world.upstream}/app.git"], env=world.env, capture_output=True, text=True
    )
    assert refused.returncode != 0 and world.log.credentials == [None]


def test_clone_pull_and_push_through_the_proxy_with_no_token_on_the_client(world: GitWorld) -> None:
    reference = world.session("sesn_git_A")
    origin = world.proxy.repository_url(reference, "app")
    clone = world.tmp / "clone"
    output = git("clone", origin, str(clone), env=world.env)
    assert (clone / "README.md").read_text() == "# app\n"

    # An upstream change arrives with a plain pull.
    upstream_work = world.tmp / "upstream-work"
    git("clone", "-q", str(world.bare), str(upstream_work), env=world.env)
    (upstream_work / "CHANGELOG").write_text("upstream change\n")
    git("add", "CHANGELOG", cwd=upstream_work, env=world.env)
    git("commit", "-q", "-m", "upstream change", cwd=upstream_work, env=world.env)
    git("push", "-q", "origin", "main", cwd=upstream_work, env=world.env)
    output += git("pull", "--ff-only", cwd=clone, env=world.env)
    assert (clone / "CHANGELOG").exists()

    # A branch pushed from the clone arrives in the bare repository.
    git("checkout", "-q", "-b", "feature", cwd=clone, env=world.env)
    (clone / "feature.txt").write_text("made in the sandbox\n")
    git("add", "feature.txt", cwd=clone, env=world.env)
    git("commit", "-q", "-m", "add feature", cwd=clone, env=world.env)
    output += git("push", "origin", "feature", cwd=clone, env=world.env)
    pushed = git("--git-dir", str(world.bare), "show", "feature:feature.txt", env=world.env)
    assert pushed == "made in the sandbox\n"
    assert git("rev-parse", "HEAD", cwd=clone, env=world.env) == git(
        "--git-dir", str(world.bare), "rev-parse", "feature", env=world.env
    )

    # Every request reached the server with the token; the client side never held it.
    assert world.log.credentials and set(world.log.credentials) == {(GIT_USER, GIT_TOKEN)}
    client_side = [output, (clone / ".git" / "config").read_text(), *world.env.values()]
    client_side += [path.read_text(errors="replace") for path in (world.tmp / "home").rglob("*") if path.is_file()]
    assert scan_for([GIT_TOKEN], *client_side) == []
    assert f"url = {origin}" in (clone / ".git" / "config").read_text()


@pytest.mark.parametrize(
    "path",
    [
        "/pxr_not-a-real-reference/app/info/refs?service=git-upload-pack",
        "/{reference}/other-repo/info/refs?service=git-upload-pack",
        "/{reference}/app/info/refs",  # no service: the dumb protocol is not proxied
        "/{reference}/app/HEAD",
        "/{reference}/app/objects/info/packs",
        "/{reference}/../app/info/refs?service=git-upload-pack",
    ],
)
def test_anything_but_the_sessions_smart_http_endpoints_is_404(world: GitWorld, path: str) -> None:
    reference = world.session("sesn_git_B")
    assert world.proxy.base_url is not None
    response = httpx.get(world.proxy.base_url + path.format(reference=reference))
    assert response.status_code == 404
    assert world.log.credentials == []  # nothing was forwarded


def test_another_sessions_reference_cannot_reach_this_sessions_repository(world: GitWorld) -> None:
    world.session("sesn_git_owner")
    other_reference = world.store.bind_session("sesn_git_other", [])  # a live reference, with no repositories
    refused = subprocess.run(
        ["git", "clone", world.proxy.repository_url(other_reference, "app"), str(world.tmp / "stolen")],
        env=world.env,
        capture_output=True,
        text=True,
    )
    assert refused.returncode != 0 and "not found" in refused.stderr
    assert world.log.credentials == []


def test_a_revoked_session_loses_git_access(world: GitWorld) -> None:
    reference = world.session("sesn_git_C")
    origin = world.proxy.repository_url(reference, "app")
    git("ls-remote", origin, env=world.env)
    forwarded = len(world.log.credentials)
    world.store.revoke_session("sesn_git_C")
    assert httpx.get(f"{origin}/info/refs?service=git-upload-pack").status_code == 404
    assert len(world.log.credentials) == forwarded


def test_a_token_the_server_rejects_is_a_502_without_a_password_prompt(world: GitWorld) -> None:
    reference = world.session("sesn_git_D", token="canary-wrong-token")
    response = httpx.get(f"{world.proxy.repository_url(reference, 'app')}/info/refs?service=git-upload-pack")
    assert response.status_code == 502 and "www-authenticate" not in response.headers
    assert "canary-wrong-token" not in response.text


def test_a_push_larger_than_gits_post_buffer_streams_through(world: GitWorld) -> None:
    """Over `http.postBuffer` (1 MiB) git sends the pack chunked, with no Content-Length: the proxy streams it."""
    reference = world.session("sesn_git_E")
    clone = world.tmp / "big"
    git("clone", "-q", world.proxy.repository_url(reference, "app"), str(clone), env=world.env)
    payload = random.Random(7).randbytes(3 * 1024 * 1024)  # incompressible, so the pack stays over 1 MiB
    (clone / "blob.bin").write_bytes(payload)
    git("add", "blob.bin", cwd=clone, env=world.env)
    git("commit", "-q", "-m", "big blob", cwd=clone, env=world.env)
    git("push", "-q", "origin", "main", cwd=clone, env=world.env)
    shown = subprocess.run(
        ["git", "--git-dir", str(world.bare), "show", "main:blob.bin"], env=world.env, capture_output=True, check=True
    )
    assert shown.stdout == payload
    assert "chunked" in world.log.body_encodings
