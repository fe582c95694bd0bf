"""Reading one variable of a worker's environment, for `workers.settings` (which alone reads the environment itself):
an empty variable counts as unset, and a malformed one is a `SettingsError` whose one-line message names it (never a
secret's value)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from urllib.parse import urlsplit

from workers.errors import SettingsError

Environ = Mapping[str, str]


def _text(environ: Environ, name: str) -> str | None:
    return environ.get(name) or None


def _invalid(name: str, value: object, expected: str) -> SettingsError:
    return SettingsError(f"{name} must be {expected}, got {value!r}")


def _seconds(environ: Environ, name: str, default: float) -> float:
    raw = _text(environ, name)
    if raw is None:
        return default
    try:
        return float(raw)
    except ValueError:
        raise _invalid(name, raw, "a number of seconds greater than 0") from None


def _count(environ: Environ, name: str, default: int) -> int:
    return _integer(environ, name, default, "a whole number")


def _port(environ: Environ, name: str, default: int) -> int:
    return _integer(environ, name, default, "a TCP port number (1-65535)")


def _integer(environ: Environ, name: str, default: int, expected: str) -> int:
    raw = _text(environ, name)
    if raw is None:
        return default
    try:
        return int(raw)
    except ValueError:
        raise _invalid(name, raw, expected) from None


def _url(environ: Environ, name: str) -> str | None:
    raw = _text(environ, name)
    if raw is not None:
        parts = urlsplit(raw)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise _invalid(name, raw, "an http:// or https:// URL")
    return raw


def _urls(environ: Environ, name: str) -> str | None:
    """A comma-separated list of http(s) URLs (one URL is a list of one), each checked like `_url`."""
    raw = _text(environ, name)
    if raw is not None:
        parts = [part.strip() for part in raw.split(",") if part.strip()]
        for part in parts or [raw]:
            url = urlsplit(part)
            if url.scheme not in ("http", "https") or not url.netloc:
                raise _invalid(name, raw, "an http:// or https:// URL, or a comma-separated list of them")
    return raw


def _check_positive(name: str, seconds: float) -> None:
    if not (math.isfinite(seconds) and seconds > 0):
        raise _invalid(name, seconds, "a number of seconds greater than 0")
