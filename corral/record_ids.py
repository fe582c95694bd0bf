"""What names a record (its id, which carries its creation time; its workspace; its kind); the errors of the
records client are in corral.errors. Kept apart from
the client so that the ids, which callers check without a Temporal client, read on their own."""

from __future__ import annotations

import hashlib
import re
import secrets
import time
from datetime import datetime

from corral.contract.records import (
    ID_ALPHABET,
    ID_PREFIX_PATTERN,
    ID_SUFFIX_LENGTH,
    KIND_PATTERN,
    RECORD_ID_PATTERN,
    WORKSPACE_PATTERN,
)
from corral.errors import InvalidRecord, RecordArchived, RecordError, RecordNotFound, VersionConflict  # noqa: F401 - re-exported

_RECORD_ID = re.compile(RECORD_ID_PATTERN)
_WORKSPACE = re.compile(WORKSPACE_PATTERN)
_KIND = re.compile(KIND_PATTERN)
_ID_PREFIX = re.compile(rf"^{ID_PREFIX_PATTERN}$")


def new_record_id(id_prefix: str) -> str:
    """`<id_prefix>_` and 26 characters of Crockford base32, lower case, laid out as a ULID: 48 bits of the
    time in milliseconds, then 80 random bits. Ids of later records sort after earlier ones, which listings use."""
    if not _ID_PREFIX.match(id_prefix):
        raise InvalidRecord(f"{id_prefix!r} is not an id prefix (lower-case letters, digits and _)")
    value = (time.time_ns() // 1_000_000) << 80 | secrets.randbits(80)
    suffix = "".join(ID_ALPHABET[(value >> shift) & 31] for shift in range(5 * (ID_SUFFIX_LENGTH - 1), -1, -5))
    return f"{id_prefix}_{suffix}"


def record_id_at(id_prefix: str, when: datetime, key: str) -> str:
    """The id `new_record_id` would make at `when`, with the random bits taken from a hash of `key`: the same
    (`when`, `key`) always name the same object, so a fire retried after a crash finds the run it made before, and
    the id still sorts by time as every other record id does."""
    if not _ID_PREFIX.match(id_prefix):
        raise InvalidRecord(f"{id_prefix!r} is not an id prefix (lower-case letters, digits and _)")
    millis = int(when.timestamp() * 1000)
    value = millis << 80 | int.from_bytes(hashlib.sha256(key.encode()).digest()[:10], "big")
    suffix = "".join(ID_ALPHABET[(value >> shift) & 31] for shift in range(5 * (ID_SUFFIX_LENGTH - 1), -1, -5))
    return f"{id_prefix}_{suffix}"


def record_id_millis(id: str) -> int:
    """The creation time in a record id (see `new_record_id`), in milliseconds since the epoch."""
    value = 0
    for character in id.rsplit("_", 1)[1]:
        value = value << 5 | ID_ALPHABET.index(character)
    return value >> 80


def is_record_id(value: str, id_prefix: str | None = None) -> bool:
    """Whether `value` has the shape of a record id (of `id_prefix`, when given)."""
    match = _RECORD_ID.match(value)
    return match is not None and (id_prefix is None or match["prefix"] == id_prefix)


def check_workspace(workspace: str) -> str:
    if not isinstance(workspace, str) or not _WORKSPACE.match(workspace):
        raise InvalidRecord(f"{workspace!r} is not a workspace name ({WORKSPACE_PATTERN})")
    return workspace


def _check_kind(kind: str) -> str:
    if not isinstance(kind, str) or not _KIND.match(kind):
        raise InvalidRecord(f"{kind!r} is not a record kind ({KIND_PATTERN})")
    return kind
