"""The one place the proxy talks to Vault's KV v2 engine through `hvac`.

Every hvac and requests exception is translated here into the proxy's own errors, so no caller sees a vendor
type and no vendor message (which can quote request paths) is chained into a user-facing one unread. Documents
are plain JSON objects; check-and-set versions make read-modify-write cycles safe between proxy processes.
"""

from __future__ import annotations

import re
from typing import Any, cast

import hvac
import hvac.exceptions
import requests

from proxy.errors import VaultUnavailable

# KV paths are built from ids that callers pass in: refuse anything that could climb out of its folder.
_SAFE_SEGMENT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")


class CasMismatch(Exception):
    """A check-and-set write lost a race: the document changed (or appeared) since it was read."""


def safe_segment(value: str, what: str) -> str:
    """Return `value` if it can be used as one KV path segment, else raise `ValueError` naming `what`."""
    if not _SAFE_SEGMENT.match(value) or ".." in value:
        raise ValueError(f"{what} must be 1-128 characters of letters, digits, '_', '.', '-': got {value!r}")
    return value


class KvStore:
    """JSON documents in one KV v2 mount: read (with version), write (optionally check-and-set), list, delete."""

    def __init__(self, client: hvac.Client, mount: str) -> None:
        self.client = client
        self.mount = mount

    def __repr__(self) -> str:
        # The hvac client holds the Vault token: never let it into a repr.
        return f"KvStore(url={self.client.url!r}, mount={self.mount!r})"

    def _unavailable(self, exc: Exception) -> VaultUnavailable:
        reason = type(exc).__name__
        return VaultUnavailable(f"Vault at {self.client.url} could not serve mount {self.mount!r} ({reason})")

    def read(self, path: str) -> tuple[dict[str, Any], int] | None:
        """The document at `path` and its version, or None when there is none (or it was deleted)."""
        try:
            response = self.client.secrets.kv.v2.read_secret_version(
                path=path, mount_point=self.mount, raise_on_deleted_version=True
            )
        except hvac.exceptions.InvalidPath:
            return None
        except (hvac.exceptions.VaultError, requests.RequestException) as exc:
            raise self._unavailable(exc) from exc
        data = response["data"]
        return cast(dict[str, Any], data["data"]), int(data["metadata"]["version"])

    def write(self, path: str, document: dict[str, Any], *, cas: int | None = None) -> int:
        """Write `document` at `path`; with `cas` (0 = must not exist yet) raise `CasMismatch` on a lost race."""
        try:
            response = self.client.secrets.kv.v2.create_or_update_secret(
                path=path, secret=document, cas=cas, mount_point=self.mount
            )
        except hvac.exceptions.InvalidRequest as exc:
            if cas is not None and "check-and-set" in str(exc):
                raise CasMismatch(path) from exc
            raise self._unavailable(exc) from exc
        except (hvac.exceptions.VaultError, requests.RequestException) as exc:
            raise self._unavailable(exc) from exc
        return int(response["data"]["version"])

    def list(self, folder: str) -> list[str]:
        """The keys directly under `folder` (sub-folders end with '/'); empty when the folder does not exist."""
        try:
            response = self.client.secrets.kv.v2.list_secrets(path=folder, mount_point=self.mount)
        except hvac.exceptions.InvalidPath:
            return []
        except (hvac.exceptions.VaultError, requests.RequestException) as exc:
            raise self._unavailable(exc) from exc
        return list(response["data"]["keys"])

    def delete(self, path: str) -> None:
        """Delete the document and every stored version of it (a destroyed secret cannot be read back)."""
        try:
            self.client.secrets.kv.v2.delete_metadata_and_all_versions(path=path, mount_point=self.mount)
        except hvac.exceptions.InvalidPath:
            return
        except (hvac.exceptions.VaultError, requests.RequestException) as exc:
            raise self._unavailable(exc) from exc
