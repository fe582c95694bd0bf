"""Which relay a session's live text goes to, when there are several: rendezvous (highest-random-weight) hashing.

Every model worker computes, for each session, the same preference order of the configured relays: each relay gets
the weight `hash(relay URL, session id)` and the order is by weight, highest first. It is a pure function of the
*set* of URLs, so it does not depend on the order they are listed in, and removing one relay moves only the sessions
it was first for (every other session keeps its first choice); adding one takes about 1/N of the sessions. An
attempt publishes to the first relay of its session's order and moves down the order only when that one fails.
Subscribers do not need the order: they follow every relay (`LiveMerge`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence


def relay_urls(value: str | Iterable[str]) -> tuple[str, ...]:
    """The relays named by `value`: a comma-separated list (one URL is a list of one) or a sequence of URLs.

    Spaces and trailing slashes are dropped and repeats removed, keeping the first place of each, so that the same
    relays written slightly differently are the same names for the hash. Raises ValueError for an empty list.
    """
    parts = value.split(",") if isinstance(value, str) else list(value)
    urls: dict[str, None] = {}
    for part in parts:
        url = part.strip().rstrip("/")
        if url:
            urls[url] = None
    if not urls:
        raise ValueError("no stream relay URL given")
    return tuple(urls)


def _weight(url: str, session_id: str) -> int:
    digest = hashlib.blake2b(f"{url}\n{session_id}".encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def relay_order(session_id: str, urls: Sequence[str]) -> list[str]:
    """`urls` in the session's preference order: highest weight first (ties, never seen in practice, by URL)."""
    if len(urls) == 1:
        return [urls[0]]
    return sorted(urls, key=lambda url: (-_weight(url, session_id), url))
