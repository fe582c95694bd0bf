"""INTERIM, TO BE REPLACED by the keys part's `gateway/work_auth.py` (issue 26): who calls a work route, as the
`Caller` and `scoped` that module defines (DESIGN26.md, "Credentials"), so that gateway/work.py is written against
that interface before it lands. Only API keys and session tokens are resolved here: an environment key needs the
key records that module brings (corral/envkeys.py). When it lands, gateway/work.py imports `Caller` and `scoped`
from it instead, and this file is deleted.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from starlette.requests import Request
from starlette.responses import Response

from corral.contract.work import parse_session_token
from gateway.errors import ApiError
from gateway.owned import WORKSPACE_HEADER, check_selected_workspace

if TYPE_CHECKING:
    from gateway.app import Gateway

CallerKind = Literal["api_key", "environment_key", "session_token"]


@dataclass(frozen=True)
class Caller:
    workspace: str
    kind: CallerKind
    environment_id: str | None = None
    work_id: str | None = None
    session_id: str | None = None


CallerHandler = Callable[[Request, Caller], Awaitable[Response]]
Endpoint = Callable[[Request], Awaitable[Response]]


def scoped_for(gateway: Gateway) -> Callable[[CallerHandler, frozenset[CallerKind]], Endpoint]:
    def scoped(handler: CallerHandler, allow: frozenset[CallerKind]) -> Endpoint:
        async def endpoint(request: Request) -> Response:
            caller = await _caller(gateway, request)
            if caller.kind not in allow:
                raise ApiError(403, f"a {caller.kind.replace('_', ' ')} may not call {request.method} "
                                    f"{request.url.path}")  # fmt: skip
            check_selected_workspace(request.headers.get(WORKSPACE_HEADER), caller.workspace)
            return await handler(request, caller)

        return endpoint

    return scoped


async def _caller(gateway: Gateway, request: Request) -> Caller:
    authorization = request.headers.get("authorization", "")
    token = authorization[7:].strip() if authorization.lower().startswith("bearer ") else ""
    parsed = parse_session_token(token)
    if parsed is None:
        return Caller(await gateway.keys.workspace(request), "api_key")
    environment_id, work_id, _ = parsed
    item = await gateway.work_queues.item(environment_id, work_id)
    digest = hashlib.sha256(token.encode()).hexdigest()
    if item is None or item.state == "stopped" or not hmac.compare_digest(digest, item.token_sha256 or ""):
        raise ApiError(401, "invalid session token (its work item stopped, or was delivered again)")
    return Caller(item.workspace, "session_token", environment_id, work_id, item.session_id)
