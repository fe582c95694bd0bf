"""Where what does not belong in Temporal history is kept, by key: a session's archived log, and every payload
too large for history (a big document in a message, a large tool result, the state a run carries to the next).

One store per deployment, named by `CORRAL_BLOB_STORE`: a directory path, a `file://` URL, or an S3-compatible
bucket, `s3://BUCKET/PREFIX?endpoint=URL&region=NAME` (both options optional; credentials from boto3's usual
chain). Unset, it is `blobs/` under the state dir (`CORRAL_STATE_DIR`, default `.corral`). Every process that
reads a session's log (the CLI, the model workers, the HTTP API) must see the same store: `corral up` gives its
workers its own.

Keys are `/`-separated relative paths. A blob is written whole or not at all (a temporary file, then a rename), and
writing one key twice with the same bytes is harmless: activities that write blobs may be retried.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

from google.protobuf.message import DecodeError
from temporalio.api.common.v1 import Payload
from temporalio.api.sdk.v1.external_storage_pb2 import ExternalStorageReference
from temporalio.converter import (
    ExternalStorage,
    StorageDriver,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverStoreContext,
)

from corral.errors import BlobNotFound, BlobStoreError
from corral.names import ENV_BLOB_STORE, ENV_STATE_DIR


def _checked(key: str) -> str:
    """`key` if it is a relative `/`-separated path with no empty, `.` or `..` part, as UTF-8 with no NUL; else
    BlobStoreError."""
    if not key or "\x00" in key or any(part in ("", ".", "..") for part in key.split("/")):
        raise BlobNotFound(f"invalid blob key {key!r}")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate: no file or object can be named by it
        raise BlobNotFound(f"invalid blob key {key!r}") from None
    return key


class LocalBlobStore:
    """Blobs as files under `root` (made on first write)."""

    def __init__(self, root: Path) -> None:
        self.root = root.expanduser().absolute()

    @property
    def url(self) -> str:
        return self.root.as_uri()

    def _path(self, key: str) -> Path:
        return self.root.joinpath(*_checked(key).split("/"))

    def put(self, key: str, data: bytes) -> None:
        path = self._path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".tmp-", delete=False) as scratch:
            scratch.write(data)
        os.replace(scratch.name, path)

    def delete(self, key: str) -> None:
        """Remove one blob; none there is no error (a retried delete)."""
        self._path(key).unlink(missing_ok=True)

    def delete_prefix(self, prefix: str) -> None:
        """Remove every blob whose key starts with `prefix` (a folder: `sessions/<id>/`); none there is no error."""
        shutil.rmtree(self._path(prefix.rstrip("/")), ignore_errors=True)

    def get(self, key: str) -> bytes:
        try:
            return self._path(key).read_bytes()
        except (FileNotFoundError, NotADirectoryError, IsADirectoryError):
            raise BlobNotFound(f"blob {key!r} is not in the store at {self.url}") from None
        except OSError as exc:
            if exc.errno == errno.ENAMETOOLONG:  # a key no file can have
                raise BlobNotFound(f"blob {key!r} is not in the store at {self.url}: {exc.strerror}") from None
            raise BlobStoreError(f"blob {key!r} cannot be read from the store at {self.url}: {exc.strerror}") from None


class S3BlobStore:
    """Blobs as objects of an S3-compatible store (AWS S3, MinIO, Ceph …) under `prefix`, through boto3.

    Credentials come from boto3's own chain (`AWS_ACCESS_KEY_ID`/`AWS_SECRET_ACCESS_KEY`, a profile, an instance
    role), never from the URL."""

    def __init__(self, bucket: str, prefix: str = "", endpoint_url: str | None = None, region: str | None = None):
        try:
            import boto3
            from botocore.config import Config
        except ImportError:
            raise BlobStoreError(f"{ENV_BLOB_STORE}: an s3:// store needs boto3: pip install 'corral[s3]'") from None
        self.bucket, self.prefix, self._endpoint = bucket, prefix.strip("/"), endpoint_url
        config = Config(retries={"max_attempts": 5, "mode": "standard"})
        self._client = boto3.client("s3", endpoint_url=endpoint_url, region_name=region, config=config)

    @property
    def url(self) -> str:
        where = f"s3://{self.bucket}/{self.prefix}"
        return f"{where} at {self._endpoint}" if self._endpoint else where

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{_checked(key)}" if self.prefix else _checked(key)

    def put(self, key: str, data: bytes) -> None:
        self._client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)

    def delete(self, key: str) -> None:
        """Remove one object; none there is no error (S3 answers a delete of a missing key with success)."""
        self._client.delete_object(Bucket=self.bucket, Key=self._key(key))

    def delete_prefix(self, prefix: str) -> None:
        """Remove every object whose key starts with `prefix` (a folder: `sessions/<id>/`), a page at a time."""
        folder = self._key(prefix.rstrip("/")) + "/"
        pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=folder)
        for page in pages:
            keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
            if keys:  # a page holds at most 1,000 keys, as many as one delete takes
                self._client.delete_objects(Bucket=self.bucket, Delete={"Objects": keys, "Quiet": True})

    def get(self, key: str) -> bytes:
        from botocore.exceptions import ClientError

        try:
            body: bytes = self._client.get_object(Bucket=self.bucket, Key=self._key(key))["Body"].read()
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404"):
                raise BlobNotFound(f"blob {key!r} is not in the store at {self.url}") from None
            raise BlobStoreError(f"the store at {self.url} refused to read {key!r}: {exc}") from None
        return body


BlobStore = LocalBlobStore | S3BlobStore
"""The store interface: `put(key, bytes)`, `get(key) -> bytes` (BlobStoreError when missing), `delete(key)`,
`delete_prefix(prefix)`, `url`."""


def open_blob_store(url: str | None = None, environ: dict[str, str] | None = None) -> BlobStore:
    """The store `url` names, else `CORRAL_BLOB_STORE`'s, else `blobs/` under the state dir."""
    env = os.environ if environ is None else environ
    url = url or env.get(ENV_BLOB_STORE) or ""
    if not url:
        return LocalBlobStore(Path(env.get(ENV_STATE_DIR) or ".corral") / "blobs")
    parts = urlsplit(url)
    if parts.scheme in ("", "file"):
        path = unquote(parts.path) if parts.scheme == "file" else url
        if parts.scheme == "file" and parts.netloc not in ("", "localhost"):
            raise BlobStoreError(f"{ENV_BLOB_STORE}={url}: a file URL must name a local path (file:///...)")
        return LocalBlobStore(Path(path))
    if parts.scheme == "s3":
        if not parts.netloc:
            raise BlobStoreError(f"{ENV_BLOB_STORE}={url}: name a bucket (s3://BUCKET/PREFIX)")
        options = {key: values[-1] for key, values in parse_qs(parts.query).items()}
        unknown = sorted(set(options) - {"endpoint", "region"})
        if unknown:
            raise BlobStoreError(f"{ENV_BLOB_STORE}={url}: unknown option {', '.join(unknown)} (endpoint, region)")
        return S3BlobStore(parts.netloc, parts.path, options.get("endpoint"), options.get("region"))
    raise BlobStoreError(
        f"{ENV_BLOB_STORE}={url}: unsupported store (a directory, file:///PATH or s3://BUCKET/PREFIX?endpoint=URL)"
    )


# ---- Temporal payloads by reference --------------------------------------------------------------------------

PAYLOAD_THRESHOLD = 256 * 1024
"""A payload at least this large goes to the blob store; history holds a reference (well under Temporal's 2 MB
payload limit and its 4 MB request limit, whatever a session carries)."""


class BlobStoreDriver(StorageDriver):
    """Temporal's external payload storage (`temporalio.converter.ExternalStorage`) on a blob store: each payload
    under the hash of its bytes, so storing one twice (a retried activity, a replay) writes the same blob."""

    def __init__(self, store: BlobStore) -> None:
        self._store = store

    def name(self) -> str:
        return "corral-blobs"

    async def store(self, context: StorageDriverStoreContext, payloads: Sequence[Payload]) -> list[StorageDriverClaim]:
        return await asyncio.to_thread(self._store_all, payloads)

    def _store_all(self, payloads: Sequence[Payload]) -> list[StorageDriverClaim]:
        claims = []
        for payload in payloads:
            data = payload.SerializeToString(deterministic=True)
            key = f"payloads/{hashlib.sha256(data).hexdigest()}"
            self._store.put(key, data)
            claims.append(StorageDriverClaim(claim_data={"key": key}))
        return claims

    async def retrieve(
        self, context: StorageDriverRetrieveContext, claims: Sequence[StorageDriverClaim]
    ) -> list[Payload]:
        return await asyncio.to_thread(self._retrieve_all, claims)

    def _retrieve_all(self, claims: Sequence[StorageDriverClaim]) -> list[Payload]:
        payloads = []
        for claim in claims:
            key = claim.claim_data.get("key")
            try:
                data = self._store.get(key) if isinstance(key, str) else None
                payload = Payload()
                payload.ParseFromString(data or b"")
                if data is None or not payload.metadata:
                    raise BlobNotFound(f"blob {key!r} does not hold a payload")
            except (BlobNotFound, DecodeError) as exc:
                # A reference to what is not there: forged by a raw client, or sent by a client whose blob store is
                # not this one. Failing here would fail the workflow task that decodes it, again and again; the
                # payload converter refuses this stand-in instead (a dropped signal, a rejected update).
                payload = missing_blob(str(exc))
            payloads.append(payload)
        return payloads


MISSING_BLOB_ENCODING = b"corral/missing-blob"


def missing_blob(message: str) -> Payload:
    """What a reference to a blob that is not in the store decodes to (corral.converter refuses it)."""
    return Payload(metadata={"encoding": MISSING_BLOB_ENCODING}, data=message.encode("utf-8", "replace"))


class CorralExternalStorage(ExternalStorage):
    """Temporal's external storage, except that a reference this store cannot have written (an unknown driver, a
    claim that does not parse) is left as it is for the payload converter to refuse, instead of failing the
    workflow task that decodes it (the SDK raises there: a raw client could wedge a session with one signal)."""

    def _decode_reference(self, payload: Payload) -> ExternalStorageReference | None:
        try:
            reference = super()._decode_reference(payload)
        except Exception:  # a reference whose JSON does not parse
            return None
        if reference is not None and reference.driver_name not in self._driver_map:
            return None
        return reference


def payload_storage(store: BlobStore | None = None) -> ExternalStorage:
    """Large payloads of every Temporal client and worker to `store` (default: `open_blob_store()`)."""
    return CorralExternalStorage(
        drivers=[BlobStoreDriver(store or open_blob_store())], payload_size_threshold=PAYLOAD_THRESHOLD
    )
