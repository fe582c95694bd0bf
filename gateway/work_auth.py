"""Who is calling, and what that credential may call: API keys, and the two credentials of self-hosted workers.

Three credentials reach the gateway, each as `Authorization: Bearer <it>` (or `x-api-key`):

- an **API key** (`sk-corral-apikey_…`, corral.apikeys) opens its workspace: every route but the worker-only ones;
- an **environment key** (`sk-corral-envkey_…`, corral.envkeys) opens one self-hosted environment's work queue
  (poll, ack, list, stats, and as a fallback heartbeat and stop) and the sessions in that environment (retrieve,
  events list, stream and send);
- a **session token** (`sk-corral-work-<env>-<work>-…`, corral.contract.work), handed out in a work item's `secret`
  on poll, opens that item (heartbeat, stop), that item's session (retrieve, events list, stream and send), and what
  the worker syncs for it: the memories of the stores attached to the session (its writes are the session's) and the
  versions of the skills its agent uses. It is good while its item is not stopped and is the item's latest delivery
  (the item keeps the token's SHA-256 only).

A credential that is not valid is a 401. A valid one on a route it may not call is a 403 `permission_error` that
says what it may call. A valid one naming a session or environment out of its reach is a 404, exactly as another
workspace's id is: a token never learns what else exists.

Routes say which credentials they take when they are made: `Credentials.authed` (API keys: every resource family's
routes, `gateway/app.py`), `Credentials.for_session` (the session routes a worker reads and writes), and
`Credentials.scoped` (the work queue's routes, whose handlers get the `Caller`), and `Credentials.for_attached` (the
memory and skill routes a worker syncs through).
"""

from __future__ import annotations

import hashlib
import hmac
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Literal

from starlette.requests import Request
from starlette.responses import Response

from corral.contract.work import parse_session_token
from corral.envkeys import parse_environment_key, verify_environment_key
from corral.records import Records
from corral.work_queue import WorkQueues
from gateway.auth import KEY_CACHE_SECONDS, ApiKeys
from gateway.errors import ApiError, not_found
from gateway.http import Handler
from gateway.owned import WORKSPACE_HEADER, check_selected_workspace, id_of, own_session

CallerKind = Literal["api_key", "environment_key", "session_token"]
AttachedKind = Literal["memory_store", "skill"]
API_KEY: CallerKind = "api_key"
ENVIRONMENT_KEY: CallerKind = "environment_key"
SESSION_TOKEN: CallerKind = "session_token"
WORKER_CREDENTIALS: frozenset[CallerKind] = frozenset({ENVIRONMENT_KEY, SESSION_TOKEN})

MAY = {
    API_KEY: "an API key opens its workspace, but not the routes a self-hosted worker calls with its environment key",
    ENVIRONMENT_KEY: "an environment key opens only its environment's work queue (poll, ack, list, stats, heartbeat, "
    "stop) and the sessions in that environment (retrieve, events list, stream and send)",
    SESSION_TOKEN: "a session token opens only its own work item (heartbeat, stop), its own session (retrieve, "
    "events list, stream and send), the memories of the stores attached to it and its agent's skills' versions",
}
"""What each credential may call, as a 403 tells it."""
NAMES = {API_KEY: "an API key", ENVIRONMENT_KEY: "an environment key", SESSION_TOKEN: "a session token"}


@dataclass(frozen=True)
class Caller:
    """A verified credential: the workspace it acts in, and for a worker's credential what it is bound to."""

    workspace: str
    kind: CallerKind
    environment_id: str | None = None
    """The environment of an environment key or a session token (None for an API key)."""
    work_id: str | None = None
    """The work item of a session token."""
    session_id: str | None = None
    """The session of a session token's item."""
    key_id: str = ""
    """What the caller's own bounds (its open streams) are counted by: the API key's or environment key's record
    id, or the session token's work item; never the secret."""

    def reaches_environment(self, environment_id: str) -> bool:
        """Whether the caller may name `environment_id` (of its workspace): an API key any, a worker's credential
        its own only. A route answers 404 when it may not, as for no such environment."""
        return self.kind == API_KEY or environment_id == self.environment_id

    def reaches_work(self, work_id: str) -> bool:
        """Whether the caller may name the work item `work_id` (of an environment it reaches): a session token
        its own only."""
        return self.kind != SESSION_TOKEN or work_id == self.work_id


CallerHandler = Callable[[Request, Caller], Awaitable[Response]]
"""An endpoint that is given the verified `Caller` (see `Credentials.scoped`)."""
Endpoint = Callable[[Request], Awaitable[Response]]


class Credentials:
    """Every credential this gateway verifies, and the wrappers that make endpoints of handlers. Environment keys
    are remembered for `KEY_CACHE_SECONDS` like API keys (a key revoked through this gateway is forgotten at once);
    a session token is checked against its item on every request, so it stops working the moment the item stops."""

    def __init__(self, api_keys: ApiKeys, records: Records, work_queues: WorkQueues) -> None:
        self.api_keys = api_keys
        self.records = records
        self.work_queues = work_queues
        self._environment_keys: dict[str, tuple[Caller, float]] = {}

    async def caller(self, request: Request) -> Caller:
        """The request's verified credential (401 when there is none, or it opens nothing), with its key id left in
        `request.state.key_id` for the bounds counted per key."""
        credential = _presented(request)
        if parse_session_token(credential) is not None:
            caller = await self._session_token(credential)
        elif parse_environment_key(credential) is not None:
            caller = await self._environment_key(credential)
        else:
            caller = Caller(await self.api_keys.workspace(request), API_KEY, key_id=request.state.key_id)
        request.state.key_id = caller.key_id
        check_selected_workspace(request.headers.get(WORKSPACE_HEADER), caller.workspace)
        return caller

    def forget_environment_key(self, key_id: str) -> None:
        """Drop a revoked key from this gateway's cache (other gateways forget it within `KEY_CACHE_SECONDS`)."""
        for credential, (caller, _) in list(self._environment_keys.items()):
            if caller.key_id == key_id:
                del self._environment_keys[credential]

    # ---- the wrappers routes are made with ----------------------------------------------------------------------

    def authed(self, handler: Handler) -> Endpoint:
        """`handler(request, workspace)` as an endpoint for API keys only: a worker's credential is a 403 that says
        what it may call. Every resource family's routes are made with it (`gateway/app.py`)."""

        async def endpoint(request: Request) -> Response:
            caller = await self.caller(request)
            if caller.kind != API_KEY:
                raise _forbidden(request, caller, frozenset({API_KEY}))
            return await handler(request, caller.workspace)

        return endpoint

    def scoped(self, handler: CallerHandler, allow: frozenset[CallerKind]) -> Endpoint:
        """`handler(request, caller)` as an endpoint for the credentials in `allow` (any other is a 403 that says
        what it may call). For the work queue's routes: the handler still checks that what the request names is
        within the caller's reach (`Caller.reaches_environment`, `Caller.reaches_work`: 404 when not)."""
        if not allow:
            raise ValueError("a scoped route must allow at least one credential")

        async def endpoint(request: Request) -> Response:
            caller = await self.caller(request)
            if caller.kind not in allow:
                raise _forbidden(request, caller, allow)
            return await handler(request, caller)

        return endpoint

    def for_session(self, handler: Handler) -> Endpoint:
        """`handler(request, workspace)` as an endpoint of a session route a worker uses (`/v1/sessions/{id}` and
        its events: retrieve, list, stream, send): an API key as `authed` takes it; a session token for its own
        session only; an environment key for the sessions of its environment. Another session is a 404."""

        async def endpoint(request: Request) -> Response:
            caller = await self.caller(request)
            if caller.kind != API_KEY:
                await self._check_session_reach(caller, request.path_params["id"])
            return await handler(request, caller.workspace)

        return endpoint

    def for_attached(self, handler: Handler, kind: AttachedKind, param: str) -> Endpoint:
        """`handler(request, workspace)` for an API key, or for a session token whose session the object named by
        `param` is attached to: a memory store among its resources, a skill its agent uses (what the SDK's worker
        syncs). A session token's writes are its session's (`request.state.session_id`). An environment key is a
        403; an object the session does not have is a 404."""

        async def endpoint(request: Request) -> Response:
            caller = await self.caller(request)
            if caller.kind == ENVIRONMENT_KEY:
                raise _forbidden(request, caller, frozenset({API_KEY, SESSION_TOKEN}))
            if caller.kind == SESSION_TOKEN:
                await self._check_attached(caller, kind, request.path_params[param])
                request.state.session_id = caller.session_id
            return await handler(request, caller.workspace)

        return endpoint

    # ---- verification --------------------------------------------------------------------------------------------

    async def _session_token(self, token: str) -> Caller:
        parsed = parse_session_token(token)
        assert parsed is not None
        environment_id, work_id, _ = parsed
        item = await self.work_queues.item(environment_id, work_id)
        digest = hashlib.sha256(token.encode("utf-8")).hexdigest()
        if item is None or item.state == "stopped" or not hmac.compare_digest(digest, item.token_sha256 or ""):
            raise ApiError(401, "invalid session token: its work item has stopped, or was delivered again since")
        return Caller(item.workspace, SESSION_TOKEN, environment_id, work_id, item.session_id, key_id=work_id)

    async def _environment_key(self, key: str) -> Caller:
        cached = self._environment_keys.get(key)
        if cached is not None and time.monotonic() - cached[1] < KEY_CACHE_SECONDS:
            return cached[0]
        holder = await verify_environment_key(self.records, key)
        if holder is None:
            self._environment_keys.pop(key, None)
            raise ApiError(401, "invalid environment key: revoked, or its environment was deleted (make one with "
                                "`corral environment key create ENV`)")  # fmt: skip
        caller = Caller(holder.workspace, ENVIRONMENT_KEY, holder.environment_id, key_id=holder.key_id)
        self._environment_keys[key] = (caller, time.monotonic())
        return caller

    async def _check_session_reach(self, caller: Caller, session_id: object) -> None:
        """404 unless the session is the token's own, or in the environment key's environment (the environment a
        session was made in is in its memo: gateway/sessions.py)."""
        session_id = id_of(session_id, "session_id", "session")
        if caller.kind == SESSION_TOKEN:
            if session_id != caller.session_id:
                raise not_found("session", session_id)
            return
        _, description = await own_session(self.records.client, caller.workspace, session_id)
        memo = await description.memo()
        if memo.get("environment_id") != caller.environment_id:
            raise not_found("session", session_id)

    async def _check_attached(self, caller: Caller, kind: AttachedKind, object_id: object) -> None:
        """404 unless the token's session has the store among its resources, or its agent uses the skill (the
        session's memo keeps both: gateway/sessions.py)."""
        _, description = await own_session(self.records.client, caller.workspace, caller.session_id or "")
        memo = await description.memo()
        if kind == "memory_store":
            attached = {resource.get("memory_store_id") for resource in memo.get("resources") or []}
        else:
            attached = {skill.get("skill_id") for skill in (memo.get("agent") or {}).get("skills") or []}
        if object_id not in attached:
            raise not_found(kind.replace("_", " "), str(object_id))


def _presented(request: Request) -> str:
    authorization = request.headers.get("authorization", "")
    credential = authorization[7:].strip() if authorization.lower().startswith("bearer ") else ""
    return credential or request.headers.get("x-api-key", "").strip()


def _forbidden(request: Request, caller: Caller, allow: frozenset[CallerKind]) -> ApiError:
    takes = " or ".join(NAMES[kind] for kind in (API_KEY, ENVIRONMENT_KEY, SESSION_TOKEN) if kind in allow)
    return ApiError(403, f"{MAY[caller.kind]}; {request.method} {request.url.path} takes {takes}")
