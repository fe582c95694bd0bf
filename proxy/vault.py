"""Vaults and their credentials, kept in Vault's KV v2 engine: the Managed Agents vocabulary on top of `hvac`.

Secrets are write-only. The public methods take secrets in (`SecretStr` params) and hand back metadata only
(`Vault`, `Credential`). The single way a secret leaves this module is `VaultStore._resolve_mcp_credential`, an
internal method for `proxy.mcp`, which runs in the proxy process (the only one with Vault access).

Rule for the one-active-credential-per-server-URL constraint: adding a second credential for a URL the vault
already covers raises `CredentialConflict` naming the existing credential; replacing a secret is an explicit
`rotate_credential`, so a typo in a URL never silently overwrites a working credential. Archiving or deleting a
credential frees its URL. The rule is enforced with a check-and-set "claim" document per (vault, URL), so two
processes adding at once cannot both win.

Each vault, credential (its public and its secret part) and URL claim has its own document under the mount, at
the path `proxy.layout` gives: the secret part apart, so that the gateway's login writes it and never reads it
back (`proxy.access`). A credential written before the split kept its secret inside its public document: the
proxy still reads it there, and `move_inline_secrets` moves it.
"""

from __future__ import annotations

import contextlib
from datetime import datetime, timedelta
from typing import Any

import hvac
from pydantic import SecretStr

from corral.names import CREDENTIAL_ID_PREFIX, VAULT_ID_PREFIX
from proxy._credentials import ResolvedMcpCredential, _public, _public_part, _resolved, _secret_part
from proxy._ids import is_id, new_id, normalize_server_url, now, stamp, unstamp
from proxy._kv import CasMismatch, KvStore
from proxy.errors import CredentialConflict, CredentialInvalid, CredentialNotFound, VaultArchived, VaultNotFound
from proxy.layout import (
    DEFAULT_MOUNT,
    claim_path,
    claims_folder,
    credential_path,
    credentials_folder,
    secret_path,
    secrets_folder,
    vault_path,
    vaults_folder,
)
from proxy.models import (
    Credential,
    CredentialParams,
    Vault,
)
from proxy.sessions import SessionScope
from proxy.webhooks import WebhookSecretScope

VAULT_PREFIX = VAULT_ID_PREFIX
CREDENTIAL_PREFIX = CREDENTIAL_ID_PREFIX
_STALE_CLAIM = timedelta(minutes=1)


class VaultStore(SessionScope, WebhookSecretScope):
    """Vaults, credentials, session bindings, git tokens and webhook signing secrets in one KV v2 mount (`corral/`
    by default)."""

    def __init__(self, client: hvac.Client, mount: str = DEFAULT_MOUNT) -> None:
        self._kv = KvStore(client, mount)

    def __repr__(self) -> str:
        return f"VaultStore({self._kv!r})"

    # --- vaults -------------------------------------------------------------------------------------------

    def create_vault(self, display_name: str, metadata: dict[str, str] | None = None) -> Vault:
        """Create an empty vault; its id (`vlt_…`) is what sessions name in `vault_ids`."""
        if not 1 <= len(display_name) <= 255:
            raise ValueError("display_name must be 1-255 characters")
        return self.open_vault(new_id(VAULT_PREFIX), display_name, metadata or {})

    def open_vault(self, vault_id: str, display_name: str, metadata: dict[str, str]) -> Vault:
        """Create an empty vault under an id chosen elsewhere (the gateway's record's)."""
        if not is_id(vault_id, VAULT_PREFIX):
            raise ValueError(f"vault ids are {VAULT_PREFIX} and letters and digits: got {vault_id!r}")
        moment = now()
        vault = Vault(id=vault_id, display_name=display_name, metadata=metadata, created_at=moment, updated_at=moment)
        self._kv.write(vault_path(vault_id), vault.model_dump(mode="json"), cas=0)
        return vault

    def relabel_vault(self, vault_id: str, display_name: str, metadata: dict[str, str]) -> Vault:
        """Change a vault's display name and metadata."""
        vault, version = self._require_vault(vault_id)
        changed = vault.model_copy(update={"display_name": display_name, "metadata": metadata, "updated_at": now()})
        self._kv.write(vault_path(vault_id), changed.model_dump(mode="json"), cas=version)
        return changed

    def get_vault(self, vault_id: str) -> Vault:
        found = self._read_vault(vault_id)
        if found is None:
            raise VaultNotFound(f"no vault {vault_id!r}")
        return found[0]

    def list_vaults(self, *, include_archived: bool = False) -> list[Vault]:
        """Every vault, oldest first; archived ones only when asked."""
        vaults = [found[0] for key in self._kv.list(vaults_folder()) if (found := self._read_vault(key)) is not None]
        vaults = [vault for vault in vaults if include_archived or vault.archived_at is None]
        return sorted(vaults, key=lambda vault: vault.created_at)

    def archive_vault(self, vault_id: str) -> Vault:
        """Archive a vault: it keeps its record, takes no new credential, binds no new session, and its
        credentials are no longer resolved for calls. Idempotent."""
        vault, version = self._require_vault(vault_id)
        if vault.archived_at is not None:
            return vault
        moment = now()
        archived = vault.model_copy(update={"archived_at": moment, "updated_at": moment})
        self._kv.write(vault_path(vault_id), archived.model_dump(mode="json"), cas=version)
        return archived

    def delete_vault(self, vault_id: str) -> None:
        """Delete a vault and destroy every credential in it (all stored versions). Idempotent."""
        if self._read_vault(vault_id) is None:
            return
        for credential_id in self._kv.list(secrets_folder(vault_id)):
            self._kv.delete(secret_path(vault_id, credential_id))
        for credential_id in self._kv.list(credentials_folder(vault_id)):
            self._kv.delete(credential_path(vault_id, credential_id))
        for key in self._kv.list(claims_folder(vault_id)):
            self._kv.delete(claims_folder(vault_id) + key)
        self._kv.delete(vault_path(vault_id))

    def _read_vault(self, vault_id: str) -> tuple[Vault, int] | None:
        if not is_id(vault_id, VAULT_PREFIX):
            return None
        found = self._kv.read(vault_path(vault_id))
        return None if found is None else (Vault.model_validate(found[0]), found[1])

    def _require_vault(self, vault_id: str) -> tuple[Vault, int]:
        found = self._read_vault(vault_id)
        if found is None:
            raise VaultNotFound(f"no vault {vault_id!r}")
        return found

    # --- credentials --------------------------------------------------------------------------------------

    def add_credential(
        self,
        vault_id: str,
        params: CredentialParams,
        *,
        display_name: str | None = None,
        metadata: dict[str, str] | None = None,
    ) -> Credential:
        """Store a credential for one MCP server URL; returns its metadata (never its secret).

        Raises `CredentialConflict` if the vault already has an active credential for that URL."""
        vault, _ = self._require_vault(vault_id)
        if vault.archived_at is not None:
            raise VaultArchived(f"vault {vault_id} is archived: it takes no new credentials")
        moment = now()
        credential = Credential(
            id=new_id(CREDENTIAL_PREFIX),
            vault_id=vault_id,
            display_name=display_name,
            metadata=metadata or {},
            auth=_public_part(params),
            created_at=moment,
            updated_at=moment,
        )
        self._claim_url(vault_id, params.mcp_server_url, credential.id)
        self._kv.write(secret_path(vault_id, credential.id), _secret_part(params))
        self._kv.write(credential_path(vault_id, credential.id), credential.model_dump(mode="json"), cas=0)
        return credential

    def get_credential(self, vault_id: str, credential_id: str) -> Credential:
        return _public(self._require_credential(vault_id, credential_id)[0])

    def list_credentials(self, vault_id: str, *, include_archived: bool = False) -> list[Credential]:
        """The vault's credentials as metadata, oldest first; archived ones only when asked."""
        self._require_vault(vault_id)
        credentials = []
        for credential_id in self._kv.list(credentials_folder(vault_id)):
            found = self._read_credential(vault_id, credential_id)
            if found is not None and (include_archived or found[0].get("archived_at") is None):
                credentials.append(_public(found[0]))
        return sorted(credentials, key=lambda credential: credential.created_at)

    def rotate_credential(self, vault_id: str, credential_id: str, params: CredentialParams) -> Credential:
        """Replace a credential's secret (and expiry/refresh settings). Kind and server URL cannot change:
        add a new credential for another server instead. Older secret versions are destroyed by the mount's
        `max_versions=1` (see `devvault.ensure_kv_v2_mount`)."""
        document, version = self._require_credential(vault_id, credential_id)
        current = _public(document)
        if document.get("archived_at") is not None:
            raise CredentialInvalid(f"credential {credential_id} is archived and cannot be rotated")
        if params.type != current.kind:
            raise CredentialInvalid(
                f"credential {credential_id} is {current.kind}; a rotation cannot make it {params.type}"
            )
        if normalize_server_url(params.mcp_server_url) != normalize_server_url(current.mcp_server_url):
            raise CredentialInvalid(
                f"credential {credential_id} serves {current.mcp_server_url}; its URL cannot change"
            )
        rotated = current.model_copy(update={"auth": _public_part(params), "updated_at": now()})
        # The public part first, check-and-set: of a rotation and a proxy's refresh, one wins, and only then writes.
        self._kv.write(credential_path(vault_id, credential_id), rotated.model_dump(mode="json"), cas=version)
        self._kv.write(secret_path(vault_id, credential_id), _secret_part(params))
        return rotated

    def relabel_credential(
        self, vault_id: str, credential_id: str, display_name: str | None, metadata: dict[str, str]
    ) -> Credential:
        """Change a credential's display name and metadata; its secret is not touched (nor read)."""
        for _ in range(3):
            document, version = self._require_credential(vault_id, credential_id)
            updated = {**document, "display_name": display_name, "metadata": metadata, "updated_at": stamp(now())}
            try:
                self._kv.write(credential_path(vault_id, credential_id), updated, cas=version)
            except CasMismatch:
                continue  # refreshed by the proxy meanwhile: apply the labels to the new version
            return _public(updated)
        raise CredentialConflict(f"credential {credential_id} is changing: try again")

    def archive_credential(self, vault_id: str, credential_id: str) -> Credential:
        """Archive a credential: its secret is destroyed, its metadata kept, and its server URL freed. Idempotent."""
        document, _ = self._require_credential(vault_id, credential_id)
        if document.get("archived_at") is not None:
            return _public(document)
        moment = now()
        archived = _public(document).model_copy(update={"archived_at": moment, "updated_at": moment})
        self._kv.delete(secret_path(vault_id, credential_id))
        # Delete-then-write leaves no older version (one written before the split held the secret), whatever the
        # mount's max_versions.
        self._kv.delete(credential_path(vault_id, credential_id))
        self._kv.write(credential_path(vault_id, credential_id), archived.model_dump(mode="json"))
        self._release_url(vault_id, archived.mcp_server_url, credential_id)
        return archived

    def delete_credential(self, vault_id: str, credential_id: str) -> None:
        """Destroy a credential (all stored versions) and free its server URL. Idempotent."""
        self._require_vault(vault_id)
        found = self._read_credential(vault_id, credential_id)
        if found is None:
            return
        self._kv.delete(secret_path(vault_id, credential_id))
        self._kv.delete(credential_path(vault_id, credential_id))
        self._release_url(vault_id, found[0]["auth"]["mcp_server_url"], credential_id)

    def _read_credential(self, vault_id: str, credential_id: str) -> tuple[dict[str, Any], int] | None:
        if not (is_id(vault_id, VAULT_PREFIX) and is_id(credential_id, CREDENTIAL_PREFIX)):
            return None
        return self._kv.read(credential_path(vault_id, credential_id))

    def _require_credential(self, vault_id: str, credential_id: str) -> tuple[dict[str, Any], int]:
        self._require_vault(vault_id)
        found = self._read_credential(vault_id, credential_id)
        if found is None:
            raise CredentialNotFound(f"no credential {credential_id!r} in vault {vault_id}")
        return found

    def _claim_url(self, vault_id: str, url: str, credential_id: str) -> None:
        """Make `credential_id` the holder of the vault's claim on `url`, or raise `CredentialConflict`.

        Every change to a claim is a check-and-set write, so of two racing adders exactly one wins. A claim is
        free when it names no credential, an archived one, or one that does not exist and was claimed more than
        `_STALE_CLAIM` ago (a crash between the claim and the credential write); a younger claim whose credential
        does not exist yet is an add in progress, and is respected."""
        path = claim_path(vault_id, url)
        claim = {"credential_id": credential_id, "claimed_at": stamp(now())}
        for _ in range(3):
            found = self._kv.read(path)
            if found is not None:
                holder_id = found[0].get("credential_id")
                if holder_id is not None and not self._claim_is_free(vault_id, found[0]):
                    raise CredentialConflict(
                        f"vault {vault_id} already has credential {holder_id} for {url}: "
                        "rotate it, or archive or delete it first"
                    )
            try:
                self._kv.write(path, claim, cas=0 if found is None else found[1])
                return
            except CasMismatch:
                continue  # someone changed the claim meanwhile: look again
        raise CredentialConflict(f"vault {vault_id} is busy with another credential for {url}: try again")

    def _claim_is_free(self, vault_id: str, claim: dict[str, Any]) -> bool:
        holder = self._read_credential(vault_id, claim["credential_id"])
        if holder is not None:
            return holder[0].get("archived_at") is not None
        claimed_at = unstamp(claim.get("claimed_at"))
        return claimed_at is None or now() - claimed_at > _STALE_CLAIM

    def _release_url(self, vault_id: str, url: str, credential_id: str) -> None:
        """Free the claim if `credential_id` still holds it (check-and-set, so a new holder is never evicted)."""
        path = claim_path(vault_id, url)
        found = self._kv.read(path)
        if found is not None and found[0].get("credential_id") == credential_id:
            with contextlib.suppress(CasMismatch):
                self._kv.write(path, {"credential_id": None, "claimed_at": None}, cas=found[1])

    # --- INTERNAL: resolution for the proxy's own calls -----------------------------------------------------

    def _resolve_mcp_credential(self, vault_ids: list[str], mcp_server_url: str) -> ResolvedMcpCredential | None:
        """INTERNAL (for `proxy.mcp`): the active credential for `mcp_server_url` in the first of
        `vault_ids` that has one, with its secrets; None if none does. Archived vaults are skipped."""
        for vault_id in vault_ids:
            found_vault = self._read_vault(vault_id)
            if found_vault is None or found_vault[0].archived_at is not None:
                continue
            claim = self._kv.read(claim_path(vault_id, mcp_server_url))
            if claim is None or claim[0].get("credential_id") is None:
                continue
            found = self._with_secret(vault_id, claim[0]["credential_id"])
            if found is not None:
                return _resolved(*found)
        return None

    def _reread_mcp_credential(self, resolved: ResolvedMcpCredential) -> ResolvedMcpCredential | None:
        """INTERNAL: the current state of a credential resolved earlier (another process may have refreshed it)."""
        found = self._with_secret(resolved.vault_id, resolved.credential_id)
        return None if found is None else _resolved(*found)

    def _with_secret(self, vault_id: str, credential_id: str) -> tuple[dict[str, Any], int] | None:
        """INTERNAL: an active credential's document with its secret part under "secret", and the public part's
        version; None when it is missing, archived or has no secret."""
        found = self._read_credential(vault_id, credential_id)
        if found is None or found[0].get("archived_at") is not None:
            return None
        document, version = found
        if "secret" in document:  # written before the split (see `move_inline_secrets`)
            return document, version
        secret = self._kv.read(secret_path(vault_id, credential_id))
        return None if secret is None else ({**document, "secret": secret[0]}, version)

    def move_inline_secrets(self) -> int:
        """Move the secrets that credentials written before the split keep inside their public document to their
        own path, so that a write-only login never reads one; the number moved. Idempotent; needs full access."""
        moved = 0
        for vault_id in [key for key in self._kv.list(vaults_folder()) if not key.endswith("/")]:
            for credential_id in self._kv.list(credentials_folder(vault_id)):
                found = self._read_credential(vault_id, credential_id)
                if found is None or "secret" not in found[0]:
                    continue
                document = dict(found[0])
                self._kv.write(secret_path(vault_id, credential_id), document.pop("secret"))
                try:
                    self._kv.write(credential_path(vault_id, credential_id), document, cas=found[1])
                except CasMismatch:
                    continue  # changed meanwhile (a refresh wrote the secret inline): the next run moves it
                moved += 1
        return moved

    def _store_refreshed_token(
        self,
        resolved: ResolvedMcpCredential,
        access_token: SecretStr,
        expires_at: datetime | None,
        refresh_token: SecretStr | None,
    ) -> ResolvedMcpCredential:
        """INTERNAL: write a refreshed access token (and a rotated refresh token, if the endpoint sent one) back,
        check-and-set against the version that was refreshed. Raises `CasMismatch` if another writer won."""
        found = self._with_secret(resolved.vault_id, resolved.credential_id)
        if found is None or found[1] != resolved.version:
            raise CasMismatch(resolved.credential_id)
        document = dict(found[0])
        auth = dict(document["auth"], expires_at=stamp(expires_at))
        secret = dict(document.pop("secret"), access_token=access_token.get_secret_value())
        if refresh_token is not None:
            secret["refresh_token"] = refresh_token.get_secret_value()
        document.update(auth=auth, updated_at=stamp(now()))
        # The public part first, check-and-set against the version refreshed: the winner alone writes the secret.
        ids = (resolved.vault_id, resolved.credential_id)
        version = self._kv.write(credential_path(*ids), document, cas=found[1])
        self._kv.write(secret_path(*ids), secret)
        return _resolved({**document, "secret": secret}, version)
