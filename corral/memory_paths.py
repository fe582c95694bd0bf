"""The rules of a memory's path and content (and of a store's name, description and metadata, and a page's
limit), and the path arithmetic listings are built on.

A path starts with `/`, has 1 to 20 non-empty segments (none `.` or `..`), holds no control or format characters
(nor U+2028 / U+2029), is in Unicode Normalization Form C, is at most 1,024 bytes of UTF-8, and is compared
byte for byte (case-sensitive). A content is text of at most 102,400 bytes of UTF-8; its `content_sha256` is the
lowercase hex SHA-256 of those bytes, with no normalization, so a client computes the same digest itself.

Paths sort as their UTF-8 bytes (SQLite's BINARY collation, Postgres' `COLLATE "C"`), which makes every
memory under a prefix one contiguous range of the `(store_id, path)` index: `prefix_end` is where it stops.
"""

from __future__ import annotations

import hashlib
import unicodedata
from typing import Any

from corral.memory_records import InvalidMemoryRequest

MAX_PATH_BYTES = 1024
MAX_PATH_SEGMENTS = 20
MAX_CONTENT_BYTES = 102_400
MAX_NAME = 255
MAX_DESCRIPTION = 1024
MAX_METADATA = 16
MAX_LIMIT = 100
DEFAULT_LIMIT = 20
MAX_FULL_LIMIT = 20
"""A page with content (view=full) holds at most this many items, whatever its `limit`."""

_REFUSED_CATEGORIES = ("Cc", "Cf", "Zl", "Zp")
"""Control, format, line and paragraph separator characters (U+2028 is Zl, U+2029 Zp)."""


def check_path(path: object, where: str = "path") -> str:
    """`path` if it is a memory path by the rules above, else `InvalidMemoryRequest` naming the rule broken."""
    if not isinstance(path, str):
        raise InvalidMemoryRequest(f"{where} must be a string")
    shown = repr(path[:80] + ("…" if len(path) > 80 else ""))
    if not path.startswith("/"):
        raise InvalidMemoryRequest(f"{where}: {shown} must start with '/'")
    _check_text(path, where, shown)
    segments = path[1:].split("/")
    if len(segments) > MAX_PATH_SEGMENTS:
        raise InvalidMemoryRequest(f"{where}: {shown} has {len(segments)} segments; at most {MAX_PATH_SEGMENTS}")
    for segment in segments:
        if segment in ("", ".", ".."):
            raise InvalidMemoryRequest(f"{where}: {shown} has an empty, '.' or '..' segment")
    return path


def check_prefix(prefix: object, where: str = "path_prefix") -> str:
    """A listing's `path_prefix`: `/` (the whole store) or whole segments ending in `/`, by the path rules."""
    if not isinstance(prefix, str):
        raise InvalidMemoryRequest(f"{where} must be a string")
    if prefix == "/":
        return prefix
    if not prefix.endswith("/"):
        raise InvalidMemoryRequest(f"{where}: {prefix[:80]!r} must end with '/' (it matches whole segments)")
    check_path(prefix[:-1], where)
    return prefix


def _check_text(text: str, where: str, shown: str) -> None:
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidMemoryRequest(f"{where}: {shown} is not Unicode text (a lone surrogate)") from exc
    if size > MAX_PATH_BYTES:
        raise InvalidMemoryRequest(f"{where} is {size} bytes of UTF-8; at most {MAX_PATH_BYTES}")
    if any(unicodedata.category(character) in _REFUSED_CATEGORIES for character in text):
        raise InvalidMemoryRequest(f"{where}: {shown} holds a control, format or line separator character")
    if not unicodedata.is_normalized("NFC", text):
        raise InvalidMemoryRequest(f"{where}: {shown} is not in Unicode Normalization Form C")


def check_content(content: object, where: str = "content") -> str:
    """The text of a memory (None is the empty memory), at most `MAX_CONTENT_BYTES` of UTF-8."""
    if content is None:
        return ""
    if not isinstance(content, str):
        raise InvalidMemoryRequest(f"{where} must be a string")
    try:
        size = len(content.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise InvalidMemoryRequest(f"{where} is not Unicode text (a lone surrogate)") from exc
    if size > MAX_CONTENT_BYTES:
        raise InvalidMemoryRequest(f"{where} is {size} bytes of UTF-8; a memory holds at most {MAX_CONTENT_BYTES}")
    return content


def check_sha256(value: object, where: str) -> str:
    """A `content_sha256` as a client gives it: 64 lowercase hex characters."""
    if not isinstance(value, str) or len(value) != 64 or any(c not in "0123456789abcdef" for c in value):
        raise InvalidMemoryRequest(f"{where} must be 64 lowercase hexadecimal characters (a SHA-256 digest)")
    return value


def content_sha256(content: str) -> str:
    return hashlib.sha256(content.encode("utf-8")).hexdigest()


def prefix_end(prefix: str) -> str:
    """The least string above every path that starts with `prefix` (which ends in `/`): `/a/` gives `/a0`, as `0`
    is the character after `/`. A range `[prefix, prefix_end(prefix))` is exactly the paths under `prefix`."""
    return prefix[:-1] + chr(ord(prefix[-1]) + 1)


def rolled_prefix(path: str, prefix: str, depth: int) -> str | None:
    """The `memory_prefix` that `path` (under `prefix`) rolls up into at `depth`, or None when it is shown itself
    (depth 0 shows every memory)."""
    if depth == 0:
        return None
    segments = path[len(prefix) :].split("/")
    if len(segments) <= depth:
        return None
    return prefix + "/".join(segments[:depth]) + "/"


def check_name(name: Any) -> str:
    if not isinstance(name, str) or not 1 <= len(name) <= MAX_NAME:
        raise InvalidMemoryRequest(f"name must be a string of 1 to {MAX_NAME} characters")
    return name


def check_description(description: Any) -> str:
    if description is None:
        return ""
    if not isinstance(description, str) or len(description) > MAX_DESCRIPTION:
        raise InvalidMemoryRequest(f"description must be a string of at most {MAX_DESCRIPTION} characters")
    return description


def patched_metadata(current: dict[str, str], patch: Any) -> dict[str, str]:
    """`current` with `patch` applied (a string sets a key, null removes it), checked: at most 16 pairs, keys of
    1 to 64 characters, values of at most 512."""
    if not isinstance(patch, dict):
        raise InvalidMemoryRequest("metadata must be an object of strings")
    merged = dict(current)
    for key, value in patch.items():
        if not isinstance(key, str) or not 1 <= len(key) <= 64:
            raise InvalidMemoryRequest("metadata: keys are 1 to 64 characters")
        if value is None:
            merged.pop(key, None)
        elif isinstance(value, str) and len(value) <= 512:
            merged[key] = value
        else:
            raise InvalidMemoryRequest(f"metadata.{key[:64]} must be a string of at most 512 characters, or null")
    if len(merged) > MAX_METADATA:
        raise InvalidMemoryRequest(f"metadata holds at most {MAX_METADATA} pairs, not {len(merged)}")
    return merged


def checked_limit(limit: Any) -> int:
    if not isinstance(limit, int) or isinstance(limit, bool) or not 1 <= limit <= MAX_LIMIT:
        raise InvalidMemoryRequest(f"limit must be a whole number from 1 to {MAX_LIMIT}")
    return limit
