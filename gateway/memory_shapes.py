"""What every memory route shares (gateway/memory_stores.py, gateway/memories.py): the library, the one place its
errors become the API's, and the query values the routes read.

Not found is 404 (the same for another workspace's object), a bad value or an archived store 400, a taken path or
a precondition that does not hold 409 with `x-should-retry: false` (retrying cannot cure it: read the memory
again).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.requests import Request

from corral.memory_records import (
    Actor,
    InvalidMemoryRequest,
    MemoryConflict,
    MemoryObjectNotFound,
    api_actor,
    session_actor,
)
from corral.memory_stores import MemoryStores
from gateway.errors import ApiError, invalid, not_found
from gateway.owned import id_of

if TYPE_CHECKING:
    from gateway.app import Gateway

T = TypeVar("T")


class MemoryApi:
    """What every memory route shares: the library, the call that maps its errors, and the query values."""

    def __init__(self, gateway: Gateway) -> None:
        self.db = gateway.knowledge
        self.stores = MemoryStores(gateway.knowledge)
        self.tell = gateway.tell
        """Emits a webhook event (`Gateway.tell`)."""

    async def answer(self, function: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """`function(*args, **kwargs)` of the library on a worker thread, its refusals as the API's errors."""
        try:
            return await self.db.run(functools.partial(function, *args, **kwargs))
        except MemoryObjectNotFound as exc:
            raise not_found(exc.kind, exc.object_id) from exc
        except InvalidMemoryRequest as exc:
            raise invalid(str(exc)) from exc
        except MemoryConflict as exc:
            raise ApiError(409, str(exc), error_code=exc.code, headers={"x-should-retry": "false"}) from exc


def store_id_of(request: Request) -> str:
    return id_of(request.path_params["memory_store_id"], "memory_store_id", "memory store")


def actor_of(request: Request) -> Actor:
    """The API key the request was made with (its record id, never the secret), as the version's `created_by`."""
    session_id = getattr(request.state, "session_id", None)  # a self-hosted worker's session token (work_auth)
    return session_actor(session_id) if session_id else api_actor(str(request.state.key_id))


def full_view(request: Request, default: str) -> bool:
    """The `view` query value (`basic` or `full`, else 400), as whether content is included."""
    view = request.query_params.get("view") or default
    if view not in ("basic", "full"):
        raise invalid(f"view must be basic or full, not {view[:40]!r}")
    return view == "full"


def whole_number(request: Request, name: str, default: int) -> int:
    value = request.query_params.get(name)
    if value is None:
        return default
    try:
        return int(value)
    except ValueError as exc:
        raise invalid(f"{name} must be a whole number, not {value[:40]!r}") from exc


def fields_of(given: dict[str, Any], allowed: frozenset[str], what: str) -> dict[str, Any]:
    unknown = sorted(set(given) - allowed)
    if unknown:
        raise invalid(f"unknown {what} field(s): {', '.join(unknown)[:200]}")
    return given
