"""The gateway's ASGI app: the shared state (`Gateway`) and the feature list (`FEATURES`) every route comes from.

How to add a resource (threads, files, skills, ...): write `gateway/<plural>.py` with a function
`<name>_routes(gateway: Gateway, authed: Authed) -> list[Route]`, and add it to `FEATURES` below: one module and
one line. Its handlers take `(request, workspace)`: `authed` has verified the API key, and refused a self-hosted
worker's credentials (`gateway/work_auth.py`, which also makes the routes a worker may call). Build it
on the core: `gateway.owned` checks every id's kind and workspace (400 / 404), `gateway.errors` makes the answers
the SDK reads, `gateway.http` reads bodies and query values, `gateway.pages` limits and cursors, and
`gateway.shapes` the views several families share. A resource that is a versioned record subclasses
`gateway.records.RecordResource` (see `gateway/agents.py`: a kind, a body and a view).
"""

from __future__ import annotations

from collections.abc import Callable

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from temporalio.client import Client

from corral import telemetry
from corral.blobs import BlobStore, open_blob_store
from corral.deployment_runs import DeploymentRuns
from corral.errors import SessionEnded
from corral.files import FileStore
from corral.knowledge_db import KnowledgeDB, open_knowledge_db
from corral.names import GATEWAY_TASK_QUEUE, HARNESS_TASK_QUEUE, MODEL_TASK_QUEUE
from corral.records import Records
from corral.webhooks import Webhooks, webhook_event
from corral.work_queue import WorkQueues
from gateway.agents import agent_routes
from gateway.auth import ApiKeys
from gateway.deployment_runs import deployment_run_routes
from gateway.deployment_schedules import DeploymentSchedules
from gateway.deployments import deployment_routes
from gateway.dreams import dream_routes
from gateway.environments import environment_routes
from gateway.errors import ApiError, api_error_handler, error_response
from gateway.events import event_routes
from gateway.files import file_routes
from gateway.http import DEFAULT_STREAMS_PER_KEY, Authed, StreamSlots
from gateway.memory_stores import memory_store_routes
from gateway.multiagent_session import DEFAULT_LIMITS, SessionLimits
from gateway.observed import ObservedRequests
from gateway.repositories import repository_routes
from gateway.session_admin import session_admin_routes
from gateway.session_knowledge import KnowledgeResolver
from gateway.session_status import session_ended_handler
from gateway.sessions import Sessions, session_routes
from gateway.skills import skill_routes
from gateway.threads import thread_routes
from gateway.vaults import vault_routes
from gateway.webhooks import webhook_routes
from gateway.work import work_routes
from gateway.work_auth import Credentials

DEFAULT_PORT = 8780


class Gateway:
    """The app's state: a Temporal client and what is built on it. Nothing else: two gateways serve alike."""

    def __init__(
        self,
        client: Client,
        harness_queue: str = HARNESS_TASK_QUEUE,
        model_queue: str = MODEL_TASK_QUEUE,
        streams_per_key: int = DEFAULT_STREAMS_PER_KEY,
        limits: SessionLimits = DEFAULT_LIMITS,
        gateway_queue: str = GATEWAY_TASK_QUEUE,
    ) -> None:
        self.client = client
        self.gateway_queue = gateway_queue
        """The queue of this gateway's own worker (gateway/deployment_runs.py), where deployment fires open runs."""
        self.harness_queue = harness_queue
        self.model_queue = model_queue
        self.records = Records(client, task_queue=harness_queue)
        self.work_queues = WorkQueues(client, task_queue=harness_queue)
        """The self-hosted environments' work queues, which run on the harness queue of the sessions they serve."""
        self.keys = ApiKeys(self.records)
        self.credentials = Credentials(self.keys, self.records, self.work_queues)
        self.knowledge: KnowledgeDB = open_knowledge_db()
        """Files' metadata, skills and memory stores (corral.knowledge_db), shared with the workers."""
        self.blobs: BlobStore = open_blob_store()
        """The bytes of files and skill bundles (corral.blobs), shared with the workers."""
        self.webhooks = Webhooks(client, self.knowledge, harness_queue)
        """The workspace's webhook endpoints, and `emit` for what the API changes (corral.webhooks)."""
        resolver = KnowledgeResolver(self.knowledge, self.blobs)
        self.sessions = Sessions(client, self.records, self.work_queues, harness_queue, model_queue, limits, resolver,
                                 self.webhooks)  # fmt: skip
        self.streams = StreamSlots(streams_per_key)
        self.files = FileStore(self.knowledge, self.blobs)
        """Files (corral.files): their quota and largest upload from `CORRAL_FILE_QUOTA_BYTES` and `…_MAX_BYTES`."""
        self.runs = DeploymentRuns(self.knowledge)
        """Deployment runs (corral.deployment_runs), in the knowledge database."""
        self.schedules = DeploymentSchedules(client, harness_queue, gateway_queue)
        """Deployments' Temporal Schedules (gateway/deployment_schedules.py)."""

    async def tell(self, type: str, subject_id: str, workspace: str, **extra: str) -> None:
        """Emit what the API just changed to the workspace's webhook endpoints (`Webhooks.tell`)."""
        await self.webhooks.tell(webhook_event(type, subject_id, workspace, extra=extra))

    def own_queues(self) -> tuple[str, str]:
        """The task queues of this gateway's own workers, which no hand may name."""
        return self.harness_queue, self.model_queue


FEATURES: list[Callable[[Gateway, Authed], list[Route]]] = [
    agent_routes,
    environment_routes,
    session_routes,
    session_admin_routes,
    event_routes,
    thread_routes,
    repository_routes,
    vault_routes,
    work_routes,
    memory_store_routes,
    dream_routes,
    skill_routes,
    file_routes,
    webhook_routes,
    deployment_routes,
    deployment_run_routes,
]
"""Each resource family's routes, in the order they are matched."""


def create_app(
    client: Client,
    harness_queue: str = HARNESS_TASK_QUEUE,
    model_queue: str = MODEL_TASK_QUEUE,
    streams_per_key: int = DEFAULT_STREAMS_PER_KEY,
    limits: SessionLimits = DEFAULT_LIMITS,
    gateway_queue: str = GATEWAY_TASK_QUEUE,
) -> Starlette:
    gateway = Gateway(client, harness_queue, model_queue, streams_per_key, limits, gateway_queue)

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    routes = [Route("/healthz", health)]
    for feature in FEATURES:
        routes += feature(gateway, gateway.credentials.authed)

    async def not_found_route(request: Request, exc: Exception) -> Response:
        return error_response(404, f"no such endpoint: {request.method} {request.url.path}")

    async def wrong_method(request: Request, exc: Exception) -> Response:
        return error_response(405, f"{request.method} is not supported on {request.url.path}")

    observed = telemetry.current()
    app = Starlette(
        routes=routes,
        exception_handlers={
            ApiError: api_error_handler,
            SessionEnded: session_ended_handler,
            404: not_found_route,
            405: wrong_method,
        },
        middleware=[Middleware(ObservedRequests)] if observed and (observed.tracing or observed.json_logs) else [],
    )
    app.state.gateway = gateway  # its own worker's activities use it (gateway/__main__.py)
    return app
