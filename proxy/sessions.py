"""Session-scoped access: opaque references that tie a session to its vaults, and the session's git tokens.

A workflow never holds a credential, only a reference (`pxr_…`, 32 random bytes) that `bind_session` issues.
The reference is filed in Vault under its SHA-256 with the session id and the vault ids, so:

- it resolves only inside the proxy (nothing else can read Vault),
- only together with the session id it was issued to (session B's reference never reaches session A's vaults),
- only while it is the session's current reference (re-binding or `revoke_session` kills it).

Git tokens are stored per session at session creation (`store_repository_token`) and read only by the git
proxy, through the session's reference; `revoke_session` destroys them. Where each is kept: `proxy.layout`.
"""

from __future__ import annotations

import base64
import hmac
import secrets
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, SecretStr

from proxy._ids import now, reference_key, stamp
from proxy._kv import KvStore, safe_segment
from proxy.errors import BindingRejected, VaultArchived
from proxy.layout import (
    binding_path,
    repositories_folder,
    repository_path,
    session_binding_path,
    sessions_folder,
)
from proxy.models import RepositoryAuthScheme, Vault

REFERENCE_PREFIX = "pxr_"
_REJECTED = "the proxy reference is not valid for this session (unknown, revoked, or issued to another session)"


class RepositoryInfo(BaseModel):
    """A repository registered for a session, without its token."""

    model_config = ConfigDict(frozen=True)

    session_id: str
    repo_id: str
    url: str
    scheme: RepositoryAuthScheme


@dataclass(frozen=True)
class ResolvedRepository:
    """INTERNAL: a repository's real URL and token, for the git proxy only. Its repr shows no token."""

    url: str
    scheme: RepositoryAuthScheme
    username: str
    token: SecretStr

    def authorization(self) -> str:
        """The `Authorization` header value for the upstream server (GitHub style Basic, or Bearer)."""
        token = self.token.get_secret_value()
        if self.scheme == "bearer":
            return f"Bearer {token}"
        return "Basic " + base64.b64encode(f"{self.username}:{token}".encode()).decode()


class SessionScope:
    """Session bindings and repository tokens; mixed into `VaultStore`, which supplies `_kv` and vault lookup."""

    _kv: KvStore

    def _require_vault(self, vault_id: str) -> tuple[Vault, int]:
        raise NotImplementedError  # provided by VaultStore

    # --- bindings ---------------------------------------------------------------------------------------------

    def bind_session(self, session_id: str, vault_ids: list[str]) -> str:
        """Issue the session's reference to its vaults (replacing any earlier one, which stops working).

        Raises `VaultNotFound` / `VaultArchived` for a vault that cannot be used, before anything is written."""
        safe_segment(session_id, "session_id")
        for vault_id in vault_ids:
            vault, _ = self._require_vault(vault_id)
            if vault.archived_at is not None:
                raise VaultArchived(f"vault {vault_id} is archived and cannot be used by a new session")
        reference = REFERENCE_PREFIX + secrets.token_urlsafe(32)
        key = reference_key(reference)
        record = {
            "session_id": session_id,
            "vault_ids": list(vault_ids),
            "created_at": stamp(now()),
            "revoked_at": None,
        }
        self._kv.write(binding_path(key), record, cas=0)
        previous = self._kv.read(session_binding_path(session_id))
        self._kv.write(session_binding_path(session_id), {"reference_sha256": key})
        if previous is not None and previous[0]["reference_sha256"] != key:
            self._mark_revoked(previous[0]["reference_sha256"])
        return reference

    def resolve_binding(self, reference: str, session_id: str) -> list[str]:
        """The vault ids bound to `session_id`, if `reference` is that session's live reference.

        Raises `BindingRejected` otherwise, with one message whatever the reason, so a caller learns nothing."""
        record = self._live_binding(reference)
        if record is None or not hmac.compare_digest(record["session_id"].encode(), session_id.encode()):
            raise BindingRejected(_REJECTED)
        return list(record["vault_ids"])

    def revoke_session(self, session_id: str) -> None:
        """End the session's access: its reference stops resolving and its git tokens are destroyed. Idempotent."""
        safe_segment(session_id, "session_id")
        pointer = self._kv.read(session_binding_path(session_id))
        if pointer is not None:
            self._mark_revoked(pointer[0]["reference_sha256"])
            self._kv.delete(session_binding_path(session_id))
        for repo_id in self._kv.list(repositories_folder(session_id)):
            self._kv.delete(repository_path(session_id, repo_id))

    def bound_sessions(self) -> list[str]:
        """Sessions that hold a binding or repository tokens (for the proxy worker's reaper)."""
        return [name.rstrip("/") for name in self._kv.list(sessions_folder())]

    def _live_binding(self, reference: str) -> dict[str, Any] | None:
        if not reference.startswith(REFERENCE_PREFIX) or len(reference) > 128:
            return None
        key = reference_key(reference)
        found = self._kv.read(binding_path(key))
        if found is None or found[0].get("revoked_at") is not None:
            return None
        session_id = str(found[0]["session_id"])
        pointer = self._kv.read(session_binding_path(session_id))
        if pointer is None or not hmac.compare_digest(str(pointer[0]["reference_sha256"]), key):
            return None
        return found[0]

    def _mark_revoked(self, key: str) -> None:
        found = self._kv.read(binding_path(key))
        if found is not None and found[0].get("revoked_at") is None:
            self._kv.write(binding_path(key), {**found[0], "revoked_at": stamp(now())})

    # --- repository tokens ------------------------------------------------------------------------------------

    def store_repository_token(
        self,
        session_id: str,
        repo_id: str,
        url: str,
        token: SecretStr | str,
        *,
        scheme: RepositoryAuthScheme = "basic",
        username: str = "x-access-token",
    ) -> RepositoryInfo:
        """Keep a session's git token in Vault (called at session creation, so it never enters workflow input).

        `scheme="basic"` sends `username:token` (GitHub's `x-access-token` convention); `"bearer"` sends the token
        as a bearer token. Storing again for the same `repo_id` replaces the token."""
        safe_segment(session_id, "session_id")
        safe_segment(repo_id, "repo_id")
        if urlsplit(url).scheme not in ("http", "https") or urlsplit(url).username or urlsplit(url).password:
            raise ValueError("repository url must be http(s) with no credentials in it")
        secret = token if isinstance(token, SecretStr) else SecretStr(token)
        document = {"url": url, "scheme": scheme, "username": username, "token": secret.get_secret_value()}
        self._kv.write(repository_path(session_id, repo_id), document)
        return RepositoryInfo(session_id=session_id, repo_id=repo_id, url=url, scheme=scheme)

    def list_repositories(self, session_id: str) -> list[RepositoryInfo]:
        """The session's repositories (metadata only), e.g. to build the sandbox's `origin` URLs."""
        safe_segment(session_id, "session_id")
        infos = []
        for repo_id in self._kv.list(repositories_folder(session_id)):
            found = self._kv.read(repository_path(session_id, repo_id))
            if found is not None:
                document = found[0]
                infos.append(
                    RepositoryInfo(
                        session_id=session_id, repo_id=repo_id, url=document["url"], scheme=document["scheme"]
                    )
                )
        return infos

    def delete_repository_token(self, session_id: str, repo_id: str) -> None:
        """Destroy one repository token of a session. Idempotent."""
        self._kv.delete(repository_path(safe_segment(session_id, "session_id"), safe_segment(repo_id, "repo_id")))

    # --- INTERNAL: resolution for the git proxy -----------------------------------------------------------

    def _resolve_reference(self, reference: str) -> str | None:
        """INTERNAL (for `proxy.git`): the session id a live reference was issued to, else None."""
        record = self._live_binding(reference)
        return None if record is None else str(record["session_id"])

    def _resolve_repository(self, session_id: str, repo_id: str) -> ResolvedRepository | None:
        """INTERNAL (for `proxy.git`): the real URL and token of one of the session's repositories."""
        try:
            path = repository_path(safe_segment(session_id, "session_id"), safe_segment(repo_id, "repo_id"))
        except ValueError:
            return None
        found = self._kv.read(path)
        if found is None:
            return None
        document = found[0]
        return ResolvedRepository(
            url=document["url"],
            scheme=document["scheme"],
            username=document["username"],
            token=SecretStr(document["token"]),
        )
