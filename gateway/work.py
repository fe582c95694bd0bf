"""The work queue of a self-hosted environment (`/v1/environments/{id}/work`), exactly as the official SDK's
environment worker calls it (`client.beta.environments.work`): poll, ack, heartbeat, stop, list, retrieve, update
and stats, over the environment's `EnvironmentWorkQueue` (corral/work_queue.py).

What the worker needs of each answer, and gets here:
- **poll** holds an empty poll open up to `block_ms` (1-999) and then answers 200 with JSON `null` (a 204, or any
  body that is not JSON, is a connection error to the worker). An item is handed out with a fresh session-scoped
  token in its `secret`; the queue keeps only the token's SHA-256, so a token is never in any history.
- **heartbeat** takes its arguments in the query; a stale `expected_last_heartbeat` is a 412 whose
  `details.current_state` is the lease as the queue holds it (the SDK raises `BetaHeartbeatPreconditionFailedError`
  and gives the item up).
- **stop** of a stopped item is a 409 with `x-should-retry: false`: the worker ignores it, and does not retry it.

Credentials (gateway/work_auth.py): the environment key polls, acknowledges and lists; an item's session token
heartbeats and stops that item, with the environment key as the fallback; retrieve and update take an API key only,
and stats either key. Every route checks the environment id before anything else (its kind: 400; its workspace,
or for a worker's credential its own environment: 404; self-hosted: 400), then a work id's kind (400) and that it is
of the environment, and a session token's own (404).
"""

from __future__ import annotations

import asyncio
import hashlib
import secrets
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from corral.contract.work import (
    DEFAULT_LEASE_SECONDS,
    POLL_SIGNAL_SECONDS,
    SESSION_TOKEN_PREFIX,
    ClaimWork,
    HeartbeatWork,
    StopWork,
    WorkItem,
    WorkMetadataChange,
    work_secret,
)
from corral.records import RecordView
from corral.work_queue import HeartbeatPreconditionFailed, WorkAlreadyStopped, WorkNotFound, WorkNotQueued
from gateway.environment_config import SELF_HOSTED, config_type
from gateway.errors import ApiError, invalid, not_found
from gateway.http import Authed, body
from gateway.owned import MAX_ID_LENGTH, id_of, own_record
from gateway.pages import page_limit
from gateway.shapes import patch_metadata
from gateway.work_auth import API_KEY, ENVIRONMENT_KEY, SESSION_TOKEN, Caller, CallerKind
from gateway.work_shapes import (
    UNNAMED_WORKER,
    after_cursor,
    block_ms_of,
    claimable,
    heartbeat_view,
    lease_state,
    reclaim_ms_of,
    stats_view,
    ttl_of,
    work_cursor,
    work_view,
    worker_id_of,
)

if TYPE_CHECKING:
    from gateway.app import Gateway


LOOK_AGAIN_SECONDS = 0.2
"""How often a held poll reads the queue again for an item that came in meanwhile."""
WORKER_ID_HEADER = "anthropic-worker-id"
MAX_NOTED_POLLERS = 10_000
"""Pollers whose last `work_polled` signal this gateway remembers (to send it at most every
`POLL_SIGNAL_SECONDS`); past it, the ones noted longest ago are forgotten."""
BY_ENV_KEY: frozenset[CallerKind] = frozenset({ENVIRONMENT_KEY})
BY_TOKEN_OR_ENV_KEY: frozenset[CallerKind] = frozenset({SESSION_TOKEN, ENVIRONMENT_KEY})
BY_API_KEY: frozenset[CallerKind] = frozenset({API_KEY})
BY_EITHER_KEY: frozenset[CallerKind] = frozenset({API_KEY, ENVIRONMENT_KEY})
"""Who may call each route (gateway/work_auth.py): any other credential is a 403 that says what it may call."""


def session_token(environment_id: str, work_id: str) -> str:
    return f"{SESSION_TOKEN_PREFIX}{environment_id}-{work_id}-{secrets.token_urlsafe(32)}"


@contextmanager
def refusals(work_id: str) -> Iterator[None]:
    """The queue's refusals as the answers the SDK reads."""
    try:
        yield
    except WorkNotFound as exc:
        raise no_item(work_id) from exc
    except WorkNotQueued as exc:
        raise ApiError(409, str(exc), error_code="work_not_queued") from exc
    except WorkAlreadyStopped as exc:  # 409 is retried by the SDK unless told not to: error_response says so
        raise ApiError(409, str(exc), error_code="work_already_stopped") from exc
    except HeartbeatPreconditionFailed as exc:
        raise ApiError(412, str(exc), error_code="heartbeat_precondition_failed",
                       details={"current_state": lease_state(exc.current_state)}) from exc  # fmt: skip


def no_item(work_id: str) -> ApiError:
    return ApiError(404, f"work item {work_id!r} was not found", error_code="work_not_found")


# ---- the routes -------------------------------------------------------------------------------------------------


class WorkApi:
    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.queues = gateway.work_queues
        self._noted: dict[tuple[str, str], float] = {}
        """(environment, worker) -> when this gateway last signalled the queue that the worker polled."""
        self._started: set[str] = set()
        """Environments whose queue this gateway has made sure of."""

    # ---- what every route checks ----

    async def environment(self, request: Request, caller: Caller) -> RecordView:
        """The path's environment: of the caller's workspace, within its credential's reach (a worker's credential
        reaches its own environment only: another is a 404, as for none), and self-hosted."""
        record = await own_record(self.gateway.records, caller.workspace, request.path_params["id"], "environment",
                                  "environment_id")  # fmt: skip
        if not caller.reaches_environment(record.id):
            raise not_found("environment", record.id)
        kind = config_type(record.body)
        if kind != SELF_HOSTED:
            raise invalid(f"environment_id: {record.id} is a {kind} environment; only a {SELF_HOSTED} environment "
                          "has a work queue")  # fmt: skip
        return record

    def work_id(self, request: Request, caller: Caller) -> str:
        work_id = id_of(request.path_params["work_id"], "work_id", "work item")
        if len(work_id) > MAX_ID_LENGTH or not work_id.isascii() or not work_id.isprintable():
            raise no_item(work_id[:MAX_ID_LENGTH])
        if not caller.reaches_work(work_id):
            raise no_item(work_id)
        return work_id

    async def item(self, environment_id: str, work_id: str) -> WorkItem:
        item = await self.queues.item(environment_id, work_id)
        if item is None:
            raise no_item(work_id)
        return item

    def lease_seconds(self, request: Request) -> float:
        """This gateway's lease when a heartbeat asks for none (`CORRAL_WORK_LEASE_SECONDS`, gateway/__main__.py)."""
        return float(getattr(request.app.state, "work_lease_seconds", None) or DEFAULT_LEASE_SECONDS)

    # ---- poll and ack (the environment key) ----

    async def poll(self, request: Request, caller: Caller) -> Response:
        environment = await self.environment(request, caller)
        block_ms = block_ms_of(request.query_params.get("block_ms"))
        reclaim_ms = reclaim_ms_of(request.query_params.get("reclaim_older_than_ms"))
        worker_id = worker_id_of(request.headers.get(WORKER_ID_HEADER))
        await self.note_poller(environment, worker_id)
        give_up_at = time.monotonic() + block_ms / 1000
        while True:
            delivered = await self.deliver(environment.id, worker_id, reclaim_ms)
            if delivered is not None:
                return JSONResponse(delivered)
            left = give_up_at - time.monotonic()
            if left <= 0:
                return JSONResponse(None)  # JSON null, never a 204: the SDK reads a body that is not JSON as an error
            await asyncio.sleep(min(LOOK_AGAIN_SECONDS, left))

    async def deliver(self, environment_id: str, worker_id: str, reclaim_ms: int) -> dict[str, Any] | None:
        """The oldest claimable item as the poll's answer, with its new token; None when there is none to give.
        The query comes first so that an empty poll writes nothing to the queue's history."""
        now = datetime.now(UTC)
        waiting = [item for item in await self.queues.items(environment_id) if claimable(item, now, reclaim_ms)]
        if not waiting:
            return None
        expected = min(waiting, key=lambda item: (item.created_at, item.id))
        token = session_token(environment_id, expected.id)
        claim = ClaimWork(worker_id=worker_id, reclaim_older_than_ms=reclaim_ms, work_id=expected.id,
                          token_sha256=hashlib.sha256(token.encode()).hexdigest())  # fmt: skip
        item = await self.queues.claim(environment_id, claim)  # None: another poll took it first; look again
        return None if item is None else work_view(item, work_secret(token))

    async def note_poller(self, environment: RecordView, worker_id: str) -> None:
        """Tell the queue that `worker_id` polls (what `workers_polling` counts), at most every
        `POLL_SIGNAL_SECONDS` per worker from this gateway, and start the queue the first time if it is not."""
        if environment.id not in self._started:
            await self.queues.ensure(environment.id, environment.workspace)
            self._started.add(environment.id)
        if worker_id == UNNAMED_WORKER:
            return
        now, key = time.monotonic(), (environment.id, worker_id)
        noted = self._noted.get(key)
        if noted is not None and now - noted < POLL_SIGNAL_SECONDS:
            return
        if len(self._noted) >= MAX_NOTED_POLLERS:
            for old in sorted(self._noted, key=self._noted.__getitem__)[: MAX_NOTED_POLLERS // 2]:
                del self._noted[old]
        self._noted[key] = now
        await self.queues.polled(environment.id, worker_id)

    async def ack(self, request: Request, caller: Caller) -> Response:
        environment = await self.environment(request, caller)
        work_id = self.work_id(request, caller)
        with refusals(work_id):
            item = await self.queues.ack(environment.id, work_id)
        return JSONResponse(work_view(item))

    # ---- heartbeat and stop (the item's session token, or the environment key) ----

    async def heartbeat(self, request: Request, caller: Caller) -> Response:
        environment = await self.environment(request, caller)
        work_id = self.work_id(request, caller)
        expected = request.query_params.get("expected_last_heartbeat")
        if expected is None:
            raise invalid("expected_last_heartbeat is required: NO_HEARTBEAT to take the lease, then the "
                          "last_heartbeat of the previous heartbeat's answer")  # fmt: skip
        if len(expected) > 256:
            raise invalid("expected_last_heartbeat is at most 256 characters")
        ttl = ttl_of(request.query_params.get("desired_ttl_seconds"), self.lease_seconds(request))
        with refusals(work_id):
            beat = await self.queues.heartbeat(environment.id, HeartbeatWork(
                work_id=work_id, expected_last_heartbeat=expected, ttl_seconds=ttl))  # fmt: skip
        return JSONResponse(heartbeat_view(beat))

    async def stop(self, request: Request, caller: Caller) -> Response:
        environment = await self.environment(request, caller)
        work_id = self.work_id(request, caller)
        sent = await body(request)
        unknown = sorted(set(sent) - {"force"})
        if unknown:
            raise invalid(f"unknown field(s) of a stop: {', '.join(unknown)}")
        force = sent.get("force")
        if force is not None and not isinstance(force, bool):
            raise invalid("force must be true or false")
        with refusals(work_id):
            item = await self.queues.stop(environment.id, StopWork(work_id=work_id, force=bool(force)))
        return JSONResponse(work_view(item))

    # ---- reads and metadata ----

    async def list(self, request: Request, caller: Caller) -> Response:
        environment = await self.environment(request, caller)
        limit = page_limit(request.query_params.get("limit"))
        items = after_cursor(await self.queues.items(environment.id), request.query_params.get("page"))
        page, rest = items[:limit], items[limit:]
        return JSONResponse({"data": [work_view(item) for item in page],
                             "next_page": work_cursor(page[-1]) if rest else None})  # fmt: skip

    async def retrieve(self, request: Request, caller: Caller) -> Response:
        environment = await self.environment(request, caller)
        return JSONResponse(work_view(await self.item(environment.id, self.work_id(request, caller))))

    async def update(self, request: Request, caller: Caller) -> Response:
        environment = await self.environment(request, caller)
        work_id = self.work_id(request, caller)
        sent = await body(request)
        unknown = sorted(set(sent) - {"metadata"})
        if unknown:
            raise invalid(f"unknown field(s) of a work item update: {', '.join(unknown)}")
        if not isinstance(sent.get("metadata"), dict):
            raise invalid("metadata must be an object: a string sets a key, null deletes it")
        current = await self.item(environment.id, work_id)
        patch_metadata(current.metadata, sent["metadata"])  # strings or nulls, merged within the limits, or a 400
        patch: dict[str, str | None] = {key: value or None for key, value in sent["metadata"].items()}
        with refusals(work_id):
            item = await self.queues.update_metadata(environment.id, WorkMetadataChange(work_id=work_id,
                                                                                        metadata=patch))  # fmt: skip
        return JSONResponse(work_view(item))

    async def stats(self, request: Request, caller: Caller) -> Response:
        environment = await self.environment(request, caller)
        state = await self.queues.state(environment.id, environment.workspace)
        return JSONResponse(stats_view(state, datetime.now(UTC)))


def work_routes(gateway: Gateway, authed: Authed) -> list[Route]:
    """The routes; `/poll` and `/stats` come before `/{work_id}`, which would take their names as work ids."""
    work = WorkApi(gateway)
    scoped = gateway.credentials.scoped
    base = "/v1/environments/{id}/work"
    one = base + "/{work_id}"
    return [
        Route(base + "/poll", scoped(work.poll, BY_ENV_KEY), methods=["GET"]),
        Route(base + "/stats", scoped(work.stats, BY_EITHER_KEY), methods=["GET"]),
        Route(base, scoped(work.list, BY_ENV_KEY), methods=["GET"]),
        Route(one + "/ack", scoped(work.ack, BY_ENV_KEY), methods=["POST"]),
        Route(one + "/heartbeat", scoped(work.heartbeat, BY_TOKEN_OR_ENV_KEY), methods=["POST"]),
        Route(one + "/stop", scoped(work.stop, BY_TOKEN_OR_ENV_KEY), methods=["POST"]),
        Route(one, scoped(work.retrieve, BY_API_KEY), methods=["GET"]),
        Route(one, scoped(work.update, BY_API_KEY), methods=["POST"]),
    ]
