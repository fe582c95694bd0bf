"""Who is asking: every request names its API key (`Authorization: Bearer`, as the SDK sends it, or `x-api-key`);
the key's workspace scopes everything the request sees. A verified key is remembered for `KEY_CACHE_SECONDS`, so a
revoked key stops working within that time on every gateway.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from starlette.requests import Request
from starlette.responses import Response

from corral.apikeys import KEY_PREFIX, verify_key
from corral.records import Records
from gateway.errors import ApiError
from gateway.http import Handler
from gateway.owned import WORKSPACE_HEADER, check_selected_workspace

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

    def authed(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        """`handler` as a Starlette endpoint that learns the caller's workspace first (and refuses a request that
        selects another one)."""

        async def endpoint(request: Request) -> Response:
            workspace = await self.workspace(request)
            check_selected_workspace(request.headers.get(WORKSPACE_HEADER), workspace)
            return await handler(request, workspace)

        return endpoint
