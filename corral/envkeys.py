"""Environment keys: what a self-hosted worker (the official SDK's `EnvironmentWorker`) holds instead of an API key.
Each key is a record (corral.records) of kind `environment_key`, in the workspace of the one self-hosted
environment it opens.

A key reads `sk-corral-<record id>-<secret>`, the record id being `envkey_…`. As with API keys (corral.apikeys), the
record holds the secret's SHA-256 and its first characters, never the key, which is shown once, when it is made. A
key opens its environment's work queue and the sessions in that environment, nothing else (gateway/work_auth.py
says what each credential may call); a revoked key, or one whose environment is gone, opens nothing.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime

from corral import names
from corral.apikeys import KEY_PREFIX, SHOWN_PREFIX_LENGTH, digest, parse_key
from corral.contract.records import RecordView
from corral.records import RecordNotFound, Records, VersionConflict

ENVIRONMENT_KEY_KIND = "environment_key"
ENVIRONMENT_KEY_ID_PREFIX = names.ENVIRONMENT_KEY_ID_PREFIX.removesuffix("_")
ENVIRONMENT_KIND = "environment"
SELF_HOSTED = "self_hosted"
"""The `config.type` of an environment whose hands are a worker the user runs: the only kind that has keys."""
REVOKE_ATTEMPTS = 3


@dataclass(frozen=True)
class EnvironmentKeyHolder:
    """What a verified key opens: one environment of one workspace."""

    workspace: str
    environment_id: str
    key_id: str


def is_self_hosted(environment: RecordView) -> bool:
    return (environment.body.get("config") or {}).get("type") == SELF_HOSTED


async def create_environment_key(
    records: Records, workspace: str, environment_id: str, name: str | None = None
) -> tuple[str, RecordView]:
    """A new key for the environment: the plaintext (returned here only, never stored) and its record. Whether the
    environment is a self-hosted one of `workspace` is the caller's to check first."""
    secret = secrets.token_urlsafe(32)
    body = {
        "name": name,
        "environment_id": environment_id,
        "sha256": digest(secret),
        "prefix": secret[:SHOWN_PREFIX_LENGTH],
        "revoked_at": None,
    }
    view = await records.create(ENVIRONMENT_KEY_KIND, workspace, body, ENVIRONMENT_KEY_ID_PREFIX)
    return f"{KEY_PREFIX}{view.id}-{secret}", view


def parse_environment_key(key: object) -> tuple[str, str] | None:
    """(record id, secret) of a well-formed environment key, else None (an API key is not one)."""
    return parse_key(key, ENVIRONMENT_KEY_ID_PREFIX)


async def verify_environment_key(records: Records, key: str) -> EnvironmentKeyHolder | None:
    """What `key` opens, or None: malformed, unknown, wrong secret, revoked, or its environment deleted. Only a
    failure to reach Temporal raises."""
    parsed = parse_environment_key(key)
    if parsed is None:
        return None
    record_id, secret = parsed
    try:
        view = await records.get_any(record_id, kind=ENVIRONMENT_KEY_KIND)
    except RecordNotFound:
        return None
    stored, environment_id = view.body.get("sha256"), view.body.get("environment_id")
    if not isinstance(stored, str) or not hmac.compare_digest(digest(secret), stored):
        return None
    if view.body.get("revoked_at") is not None or not isinstance(environment_id, str):
        return None
    try:  # a deleted environment's keys open nothing (an archived one's still serve the sessions it has)
        await records.get(environment_id, view.workspace, kind=ENVIRONMENT_KIND)
    except RecordNotFound:
        return None
    return EnvironmentKeyHolder(view.workspace, environment_id, view.id)


async def list_environment_keys(records: Records, workspace: str, environment_id: str) -> list[RecordView]:
    """Every key of the environment, newest first, revoked ones included. A listing reads Temporal's visibility,
    which shows a key a moment after it is made (corral.records)."""
    keys: list[RecordView] = []
    page: str | None = None
    while True:
        found, page = await records.list(ENVIRONMENT_KEY_KIND, workspace, include_archived=True, limit=100,
                                         page=page)  # fmt: skip
        keys += [key for key in found if key.body.get("environment_id") == environment_id]
        if page is None:
            return keys


async def environment_key(records: Records, workspace: str, environment_id: str, key_id: str) -> RecordView:
    """The key `key_id` of the environment; `RecordNotFound` for another environment's, as for none."""
    view = await records.get(key_id, workspace, kind=ENVIRONMENT_KEY_KIND)
    if view.body.get("environment_id") != environment_id:
        raise RecordNotFound(key_id)
    return view


async def revoke_environment_key(records: Records, workspace: str, environment_id: str, key_id: str) -> RecordView:
    """Revoke the environment's key `key_id` (again: no change); `RecordNotFound` when it has no such key."""
    for _ in range(REVOKE_ATTEMPTS):
        view = await environment_key(records, workspace, environment_id, key_id)
        if view.body.get("revoked_at") is not None:
            return view
        body = {**view.body, "revoked_at": datetime.now(UTC).isoformat().replace("+00:00", "Z")}
        try:
            return await records.put(view.id, workspace, body, view.version, kind=ENVIRONMENT_KEY_KIND)
        except VersionConflict:
            continue
    raise VersionConflict(f"{key_id} kept changing while it was being revoked")
