"""API keys: a request names its key (`Authorization: Bearer`, as the SDK sends it, or `x-api-key`), and the key's
workspace scopes everything the request sees. A verified key is remembered for `KEY_CACHE_SECONDS`, so a revoked
key stops working within that time on every gateway. Which credential a route takes (an API key, or a self-hosted
worker's environment key or session token) is gateway/work_auth.py's to say.
"""

from __future__ import annotations

import time

from starlette.requests import Request

from corral.apikeys import KEY_PREFIX, verify_key
from corral.records import Records
from gateway.errors import ApiError

KEY_CACHE_SECONDS = 10.0


class ApiKeys:
    """The keys this gateway verified lately (a cache of their workspaces, by key), over the key records."""

    def __init__(self, records: Records) -> None:
        self.records = records
        self._keys: dict[str, tuple[str, float]] = {}

    async def workspace(self, request: Request) -> str:
        """The workspace of the request's key; the key's record id is left in `request.state.key_id` (the key's
        own bounds, such as its open streams, are counted by it: never by the secret)."""
        authorization = request.headers.get("authorization", "")
        key = authorization[7:].strip() if authorization.lower().startswith("bearer ") else ""
        key = key or request.headers.get("x-api-key", "").strip()
        if not key:
            raise ApiError(401, "no API key: send it as `Authorization: Bearer <key>` (or `x-api-key`)")
        request.state.key_id = key.removeprefix(KEY_PREFIX).partition("-")[0]  # only read once the key is verified
        cached = self._keys.get(key)
        if cached is not None and time.monotonic() - cached[1] < KEY_CACHE_SECONDS:
            return cached[0]
        workspace = await verify_key(self.records, key)
        if workspace is None:
            self._keys.pop(key, None)
            raise ApiError(401, "invalid API key (create one with `corral api-key create --workspace NAME`)")
        self._keys[key] = (workspace, time.monotonic())
        return workspace
