"""The blob store: a local directory by default, any S3-compatible bucket in production (here a real S3 server,
moto's, over HTTP). Both hold the same things: the archive of a session's earlier runs and payloads too large for
Temporal history."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import anthropic
import boto3
import pytest
from moto.server import ThreadedMotoServer
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from corral.archive import forget_session
from corral.blobs import BlobStore, BlobStoreError, LocalBlobStore, S3BlobStore, open_blob_store, payload_storage
from corral.client import read_events, send_text, start_session, wait_for_idle
from corral.contract.events import UserMessage
from corral.contract.session import AgentConfig, SessionInput
from tests.conftest import Stack, assert_log_is_whole, unique
from tests.ports import free_port
from workers.roles import harness_worker, model_worker

BUCKET = "corral-test"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture
def s3_store(s3_endpoint: str, monkeypatch: pytest.MonkeyPatch) -> S3BlobStore:
    # moto accepts any credentials; these are not secrets, and boto3 reads them as it would real ones.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "corral-test-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "corral-test-secret")
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(Bucket=BUCKET)
    store = open_blob_store(f"s3://{BUCKET}/{unique('prefix')}?endpoint={s3_endpoint}&region=us-east-1")
    assert isinstance(store, S3BlobStore)
    return store


def _check_store(store: BlobStore) -> None:
    store.put("a/b.bin", b"\x00one")
    store.put("a/b.bin", b"\x00one")  # a retried write of the same bytes
    assert store.get("a/b.bin") == b"\x00one"
    with pytest.raises(BlobStoreError, match="'a/missing' is not in the store"):
        store.get("a/missing")
    for bad in ("", "../up", "a//b", "./a"):
        with pytest.raises(BlobStoreError, match="invalid blob key"):
            store.put(bad, b"x")
    # A deleted session's blobs go, with all its keys (more than one S3 page of them); another's stay.
    for n in range(1_005):
        store.put(f"sessions/sesn_gone/log/{n:012d}.jsonl", b"x")
    store.put("sessions/sesn_gone/outputs/call", b"x")
    store.put("sessions/sesn_gone2/log/000000000001.jsonl", b"kept")
    forget_session(store, "sesn_gone")
    forget_session(store, "sesn_never")  # nothing there: no error
    for key in ("sessions/sesn_gone/log/000000000000.jsonl", "sessions/sesn_gone/log/000000001004.jsonl",
                "sessions/sesn_gone/outputs/call"):  # fmt: skip
        with pytest.raises(BlobStoreError, match="is not in the store"):
            store.get(key)
    assert store.get("sessions/sesn_gone2/log/000000000001.jsonl") == b"kept"
    assert store.get("a/b.bin") == b"\x00one"


def test_a_local_store_keeps_blobs(tmp_path: Path) -> None:
    store = open_blob_store(f"file://{tmp_path}/blobs")
    assert isinstance(store, LocalBlobStore) and store.root == tmp_path / "blobs"
    _check_store(store)
    assert not [p for p in (tmp_path / "blobs").rglob("*") if p.name.startswith(".tmp-")], "no scratch file left"


def test_an_s3_store_keeps_blobs(s3_store: S3BlobStore) -> None:
    _check_store(s3_store)


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://host/x", "unsupported store"),
        ("s3:///prefix", "name a bucket"),
        ("s3://bucket/p?colour=red", "unknown option colour"),
        ("file://otherhost/x", "must name a local path"),
    ],
)
def test_a_bad_store_url_is_a_clear_error(url: str, message: str) -> None:
    with pytest.raises(BlobStoreError, match=message):
        open_blob_store(url)


def test_the_default_store_is_under_the_state_dir(tmp_path: Path) -> None:
    store = open_blob_store(environ={"CORRAL_STATE_DIR": str(tmp_path)})
    assert isinstance(store, LocalBlobStore) and store.root == tmp_path / "blobs"


async def test_a_session_on_an_s3_store(stack: Stack, s3_store: S3BlobStore, s3_endpoint: str) -> None:
    """Everything large or archived goes to the bucket: a session that continues as new and carries a message over
    256 KiB reads back whole, through a client and workers that all use the bucket."""
    converter = dataclasses.replace(pydantic_data_converter, external_storage=payload_storage(s3_store))
    config = stack.client.config()
    client = await Client.connect(
        stack.client.service_client.config.target_host, namespace=config["namespace"], data_converter=converter
    )
    harness, models = unique("s3-harness"), unique("s3-model")
    model = stack.script([{"text": "Noted.", "echo_last_user": True}], loop=True)
    anthropic_client = anthropic.AsyncAnthropic(base_url=stack.model_server.base_url, api_key="test", max_retries=0)
    async with harness_worker(client, harness), model_worker(client, anthropic_client, models, blobs=s3_store):
        agent = AgentConfig(model=model)
        input = SessionInput(agent=agent, model_task_queue=models, continue_as_new_after_events=200)
        handle = await start_session(client, input, task_queue=harness)
        large = "large " * 60_000  # 360 KB: by reference
        after = 0
        for n in range(25):
            await send_text(handle, large if n == 3 else f"message {n}")
            after = (await wait_for_idle(handle, after=after))[-1].position
        events = await read_events(handle, blobs=s3_store)
        await handle.terminate("test finished")
    assert_log_is_whole(events)
    messages = [e for e in events if isinstance(e, UserMessage)]
    assert len(messages) == 25 and messages[3].content[0].model_dump()["text"] == large
    keys = [
        o["Key"] for o in boto3.client("s3", endpoint_url=s3_store._endpoint).list_objects_v2(Bucket=BUCKET)["Contents"]
    ]
    assert any(f"sessions/{handle.id}/log/" in key for key in keys), "earlier runs archived in the bucket"
    assert any("/payloads/" in key for key in keys), "the large message stored by reference in the bucket"
    assert not (Path(open_blob_store().url.removeprefix("file://")) / "sessions" / handle.id).exists()
