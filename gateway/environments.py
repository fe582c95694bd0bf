"""Environments (`/v1/environments`): records of the sandbox a session runs in (its engine, packages, network); a
session's recipe is read from one when the session is made (`gateway.shapes.environment_recipe`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.routing import Route

from corral.records import RecordView
from gateway.http import Authed
from gateway.records import RecordResource
from gateway.shapes import environment_body, environment_view

if TYPE_CHECKING:
    from gateway.app import Gateway


class Environments(RecordResource):
    kind = "environment"
    plural = "environments"
    created_at_bounds = ()
    """The SDK's `environments.list` has none, so a listing refuses them all."""

    def make_body(self, request: dict[str, Any], current: dict[str, Any] | None = None) -> dict[str, Any]:
        return environment_body(request, current)

    def show(self, record: RecordView) -> dict[str, Any]:
        return environment_view(record.id, record.body, record.created_at, record.updated_at, record.archived_at)


def environment_routes(gateway: Gateway, authed: Authed) -> list[Route]:
    return Environments(gateway).routes(authed)
