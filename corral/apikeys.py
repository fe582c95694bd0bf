"""API keys of the gateway: each key is a record (corral.records) of kind `api_key` in the workspace it opens.

A key reads `sk-corral-<record id>-<secret>`. The record holds the secret's SHA-256 and its first characters (to
tell keys apart in a listing), never the key: the plaintext is shown once, when it is made, and appears in no
workflow history. A key is checked by reading its record (the id is in the key) and comparing digests in constant
time; a revoked key, or one whose record is gone, opens nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from datetime import UTC, datetime

from corral import names
from corral.contract.records import RecordView
from corral.names import OPERATOR_WORKSPACE
from corral.records import InvalidRecord, RecordNotFound, Records, VersionConflict, is_record_id

API_KEY_KIND = "api_key"
API_KEY_ID_PREFIX = names.API_KEY_ID_PREFIX.removesuffix("_")
KEY_PREFIX = "sk-corral-"
SHOWN_PREFIX_LENGTH = 8
"""Characters of the secret kept in the record and shown in listings: 48 of its 256 bits, enough to tell keys
apart, far too few to guess the rest."""
MAX_KEY_LENGTH = 256
"""Longer is not a corral key: refused before anything is read."""
REVOKE_ATTEMPTS = 3


def digest(secret: str) -> str:
    """What a key's record keeps of its secret (an environment key's too, corral.envkeys)."""
    return hashlib.sha256(secret.encode("utf-8")).hexdigest()


async def create_key(records: Records, workspace: str, name: str | None = None) -> tuple[str, RecordView]:
    """A new key for `workspace`: the plaintext (returned here only, never stored) and its record. The operator's
    own workspace gets none: a key for it would open the hand registry to whoever held it."""
    if workspace == OPERATOR_WORKSPACE:
        raise InvalidRecord(f"{workspace!r} is the operator's workspace (corral hand); a key cannot open it")
    secret = secrets.token_urlsafe(32)
    body = {"name": name, "sha256": digest(secret), "prefix": secret[:SHOWN_PREFIX_LENGTH], "revoked_at": None}
    view = await records.create(API_KEY_KIND, workspace, body, API_KEY_ID_PREFIX)
    return f"{KEY_PREFIX}{view.id}-{secret}", view


def parse_key(key: object, id_prefix: str = API_KEY_ID_PREFIX) -> tuple[str, str] | None:
    """(record id, secret) of a well-formed key whose record id has `id_prefix` (an API key's by default; an
    environment key's is `envkey`), else None."""
    if not isinstance(key, str) or len(key) > MAX_KEY_LENGTH or not key.startswith(KEY_PREFIX):
        return None
    record_id, dash, secret = key.removeprefix(KEY_PREFIX).partition("-")  # record ids have no '-'
    if not dash or not secret or not secret.isascii() or not is_record_id(record_id, id_prefix):
        return None
    return record_id, secret


async def verify_key(records: Records, key: str) -> str | None:
    """The workspace `key` opens, or None: malformed, unknown, wrong secret, revoked or deleted. Only a failure to
    reach Temporal raises."""
    parsed = parse_key(key)
    if parsed is None:
        return None
    record_id, secret = parsed
    try:
        view = await records.get_any(record_id, kind=API_KEY_KIND)
    except RecordNotFound:
        return None
    stored = view.body.get("sha256")
    if not isinstance(stored, str) or not hmac.compare_digest(digest(secret), stored):
        return None
    if view.body.get("revoked_at") is not None:
        return None
    return view.workspace


async def list_keys(records: Records, workspace: str | None = None) -> list[RecordView]:
    """Every key of `workspace` (None: of every workspace), newest first, revoked ones included."""
    keys: list[RecordView] = []
    page: str | None = None
    while True:
        if workspace is None:
            found, page = await records.list_any_workspace(API_KEY_KIND, include_archived=True, limit=100, page=page)
        else:
            found, page = await records.list(API_KEY_KIND, workspace, include_archived=True, limit=100, page=page)
        keys += found
        if page is None:
            return keys


async def revoke_key(records: Records, key_id: str) -> RecordView:
    """Revoke a key by its record id (again: no change); `RecordNotFound` when there is no such key."""
    for _ in range(REVOKE_ATTEMPTS):
        view = await records.get_any(key_id, kind=API_KEY_KIND)
        if view.body.get("revoked_at") is not None:
            return view
        body = {**view.body, "revoked_at": datetime.now(UTC).isoformat().replace("+00:00", "Z")}
        try:
            return await records.put(view.id, view.workspace, body, view.version, kind=API_KEY_KIND)
        except VersionConflict:
            continue  # renamed meanwhile: read it again, keep the new name
    raise VersionConflict(f"{key_id} kept changing while it was being revoked")
