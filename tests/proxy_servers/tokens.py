"""The token authority shared by the test MCP server and the test token endpoint.

It plays the OAuth authorization server's memory: which access tokens are live (and until when), which refresh
tokens are, how the client must authenticate. It records every use so tests can assert which token each call
carried and how often the token endpoint was hit.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Literal

ClientAuth = Literal["none", "client_secret_basic", "client_secret_post"]


@dataclass
class RefreshRecord:
    """One request to the token endpoint, as the endpoint saw it."""

    refresh_token: str
    client_auth: str
    granted: bool


@dataclass
class TokenAuthority:
    """Issues, checks, expires and revokes tokens; thread-safe (the servers run in their own threads)."""

    client_id: str = "corral-test-client"
    client_secret: str | None = None
    client_auth: ClientAuth = "none"
    rotate_refresh_tokens: bool = True
    access_ttl: int = 3600
    access_tokens: dict[str, float] = field(default_factory=dict)  # token -> expires at (epoch seconds)
    refresh_tokens: set[str] = field(default_factory=set)
    tool_calls: list[tuple[str, str]] = field(default_factory=list)  # (tool, access token used)
    rejected: list[str] = field(default_factory=list)  # bearer tokens the MCP server refused
    refreshes: list[RefreshRecord] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def issue_access_token(self, ttl: int | None = None, prefix: str = "at") -> str:
        token = f"{prefix}-{secrets.token_urlsafe(16)}"
        with self._lock:
            self.access_tokens[token] = time.time() + (self.access_ttl if ttl is None else ttl)
        return token

    def issue_refresh_token(self, prefix: str = "rt") -> str:
        token = f"{prefix}-{secrets.token_urlsafe(16)}"
        with self._lock:
            self.refresh_tokens.add(token)
        return token

    def expire(self, access_token: str) -> None:
        """Make a token expire now, whatever its holder believes."""
        with self._lock:
            self.access_tokens[access_token] = time.time() - 1

    def revoke_refresh_token(self, refresh_token: str) -> None:
        with self._lock:
            self.refresh_tokens.discard(refresh_token)

    def expiry_of(self, access_token: str) -> float | None:
        """When a live token expires, or None if it is unknown or expired."""
        with self._lock:
            expires = self.access_tokens.get(access_token)
        return expires if expires is not None and expires > time.time() else None

    def record_rejection(self, token: str) -> None:
        with self._lock:
            self.rejected.append(token)

    def record_tool_call(self, tool: str, token: str) -> None:
        with self._lock:
            self.tool_calls.append((tool, token))

    def client_authenticates(self, client_id: str | None, client_secret: str | None) -> bool:
        if client_id != self.client_id:
            return False
        return self.client_auth == "none" or client_secret == self.client_secret

    def exchange(self, refresh_token: str, client_auth: str) -> tuple[str, str | None] | None:
        """Spend a refresh token: a new access token and (when rotating) a new refresh token, or None."""
        with self._lock:
            granted = refresh_token in self.refresh_tokens
            self.refreshes.append(RefreshRecord(refresh_token, client_auth, granted))
            if not granted:
                return None
            if self.rotate_refresh_tokens:
                self.refresh_tokens.discard(refresh_token)
        access = self.issue_access_token(prefix="at-refreshed")
        rotated = self.issue_refresh_token(prefix="rt-rotated") if self.rotate_refresh_tokens else None
        return access, rotated

    @property
    def tokens_used(self) -> list[str]:
        with self._lock:
            return [token for _, token in self.tool_calls]
