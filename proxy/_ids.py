"""Ids, timestamps and URL keys shared by the store modules.

Ids are random and alphanumeric so they are safe as KV path segments; an id that does not have the expected
shape cannot exist, so lookups treat it as "not found" instead of building a path from it.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import string
from datetime import UTC, datetime
from urllib.parse import urlsplit, urlunsplit

_ALPHABET = string.ascii_letters + string.digits
_DEFAULT_PORTS = {"http": 80, "https": 443}


def new_id(prefix: str, length: int = 24) -> str:
    """A fresh id such as `vlt_4fZ…`: `length` random letters and digits after `prefix`."""
    return prefix + "".join(secrets.choice(_ALPHABET) for _ in range(length))


def is_id(value: str, prefix: str) -> bool:
    """Whether `value` has the shape `new_id(prefix)` produces."""
    return re.fullmatch(re.escape(prefix) + r"[A-Za-z0-9]{8,64}", value) is not None


def now() -> datetime:
    return datetime.now(UTC)


def stamp(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()


def unstamp(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)


def normalize_server_url(url: str) -> str:
    """The form two spellings of one MCP server URL share: lower-case scheme and host, no default port, no
    trailing slash. The one-credential-per-server rule and the lookup at call time both compare this form."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    port = parts.port
    netloc = host if port is None or _DEFAULT_PORTS.get(scheme) == port else f"{host}:{port}"
    return urlunsplit((scheme, netloc, parts.path.rstrip("/"), parts.query, ""))


def url_key(url: str) -> str:
    """A KV-safe key for a server URL (its normalized form, hashed)."""
    return hashlib.sha256(normalize_server_url(url).encode()).hexdigest()[:40]


def reference_key(reference: str) -> str:
    """Where a session reference is filed: its hash, so listing Vault never yields a usable reference."""
    return hashlib.sha256(reference.encode()).hexdigest()
