"""Files over HTTP (`/v1/files`): upload (multipart), list, metadata, download and delete, on `corral.files`.

Every id is checked for its kind (a `file_…`, else 400) and its workspace (another's is a 404, as a missing one).
A file past its expiry time answers 404 `file_expired` on every read, before its durable timer has removed it
(workflows/file_expiry.py; the gateway starts the timer with the upload). A file made with `downloadable=False`
answers its content with 400 `file_not_downloadable`; uploads and the files sessions write are downloadable.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from starlette.datastructures import UploadFile
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from corral.file_expiry import schedule_file_expiry
from corral.files import (
    MAX_EXPIRES_IN_SECONDS,
    MIN_EXPIRES_IN_SECONDS,
    FileExpired,
    FileNotFound,
    FileRecord,
    FileStore,
    FileTooLarge,
    StorageQuotaExceeded,
)
from gateway.errors import ApiError, invalid, not_found
from gateway.http import Authed
from gateway.owned import id_of
from gateway.pages import page_limit

if TYPE_CHECKING:
    from gateway.app import Gateway

MAX_IDS = 100
"""A listing's `ids[]` names at most this many files."""
MULTIPART_SLACK = 64 * 1024
"""What a multipart body adds to its file (boundaries, headers, the form's small fields)."""
PAGE_PREFIX = "page_"
MEDIA_TYPE = re.compile(r"[a-z0-9][a-z0-9!#$&^_.+-]{0,63}/[a-z0-9][a-z0-9!#$&^_.+-]{0,126}")
"""A media type as RFC 6838 spells it (lower-cased here), which is safe to send back as a Content-Type."""


def file_error(exc: Exception, file_id: str) -> ApiError:
    """The API's answer for a refusal of corral.files."""
    if isinstance(exc, FileExpired):
        return ApiError(404, f"file {file_id!r} has expired", error_code="file_expired")
    if isinstance(exc, StorageQuotaExceeded):
        return ApiError(400, str(exc), error_code="storage_quota_exceeded")
    if isinstance(exc, FileTooLarge):
        return ApiError(413, str(exc), error_code="file_too_large")
    return not_found("file", file_id)


async def own_file(files: FileStore, workspace: str, value: Any, field: str) -> FileRecord:
    """The file `value` names, if it is a file id (else 400) of `workspace`'s (else 404) that has not expired (else
    404 `file_expired`)."""
    file_id = id_of(value, field, "file")
    try:
        return await files.db.run(files.get, workspace, file_id)
    except (FileNotFound, FileExpired) as exc:
        raise file_error(exc, file_id) from exc


def upload_filename(given: str | None) -> str:
    """Only the last component of the client's file name (either slash), so no path of its machine is kept."""
    name = (given or "").replace("\\", "/").rsplit("/", 1)[-1].strip()
    name = "".join(character for character in name if character.isprintable())
    return name if name not in ("", ".", "..") else "unnamed"


def expires_in(value: Any) -> timedelta | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise invalid("expires_in_seconds must be a form field, not a file")
    try:
        seconds = int(value)
    except ValueError as exc:
        raise invalid(f"expires_in_seconds must be a whole number of seconds, not {value[:32]!r}") from exc
    if not MIN_EXPIRES_IN_SECONDS <= seconds <= MAX_EXPIRES_IN_SECONDS:
        raise invalid(f"expires_in_seconds must be from {MIN_EXPIRES_IN_SECONDS} (one hour) to "
                      f"{MAX_EXPIRES_IN_SECONDS} (90 days), not {seconds}")  # fmt: skip
    return timedelta(seconds=seconds)


def page_cursor(position: int) -> str:
    return f"{PAGE_PREFIX}{position}"


def page_after(page: str) -> int:
    """The position a files page ended at."""
    number = page.removeprefix(PAGE_PREFIX)
    if page.startswith(PAGE_PREFIX) and number.isdigit() and number.isascii() and len(number) < 19:
        return int(number)
    raise invalid("page: not a cursor this list gave")


def content_disposition(filename: str) -> str:
    """`attachment`, with the name as ASCII for old clients and as UTF-8 (RFC 5987) for the rest."""
    fallback = "".join(c if c.isascii() and c.isprintable() and c not in '"\\' else "_" for c in filename)
    return f"attachment; filename=\"{fallback}\"; filename*=UTF-8''{quote(filename, safe='')}"


class Files:
    """The file endpoints of one gateway."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.files: FileStore = gateway.files

    async def upload(self, request: Request, workspace: str) -> Response:
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.files.max_file_bytes + MULTIPART_SLACK:
            raise file_error(FileTooLarge(f"the upload is {declared} bytes; one file may be at most "
                                          f"{self.files.max_file_bytes} bytes"), "")  # fmt: skip
        if not request.headers.get("content-type", "").startswith("multipart/form-data"):
            raise invalid("an upload is a multipart/form-data body with the file in its `file` part")
        try:
            form = await request.form(max_files=1, max_fields=8)
        except HTTPException as exc:
            raise invalid(f"the multipart body does not parse: {exc.detail}") from exc
        try:
            part = form.get("file")
            if not isinstance(part, UploadFile):
                raise invalid("file: the upload has no `file` part holding a file (a part with a filename)")
            unknown = sorted(set(form.keys()) - {"file", "expires_in_seconds"})
            if unknown:
                raise invalid(f"unknown upload field(s): {', '.join(unknown)}")
            lifetime = expires_in(form.get("expires_in_seconds"))
            data = await part.read(self.files.max_file_bytes + 1)
            filename = upload_filename(part.filename)
            given_type = (part.content_type or "").split(";")[0].strip().lower()
        finally:
            await form.close()
        # A type of the media-type grammar is kept; none, the generic one or a malformed one is guessed from the name.
        mime_type = (
            given_type if MEDIA_TYPE.fullmatch(given_type) and given_type != "application/octet-stream" else None
        )
        expires_at = datetime.now(UTC) + lifetime if lifetime is not None else None
        try:
            record = await self.files.db.run(lambda: self.files.create(workspace, filename, data, mime_type,
                                                                       expires_at=expires_at))  # fmt: skip
        except (FileTooLarge, StorageQuotaExceeded) as exc:
            raise file_error(exc, "") from exc
        if record.expires_at is not None:
            await schedule_file_expiry(self.gateway.client, record, self.gateway.harness_queue,
                                       self.gateway.model_queue)  # fmt: skip
        return JSONResponse(record.view())

    async def listing(self, request: Request, workspace: str) -> Response:
        params = request.query_params
        unknown = sorted(set(params) - {"limit", "page", "scope_id", "ids[]", "ids"})
        if unknown:
            raise invalid(f"unknown query parameter(s): {', '.join(unknown)}")
        scope = params.get("scope_id")
        scope_id = id_of(scope, "scope_id", "session") if scope is not None else None
        ids: Sequence[str] | None = None
        if "ids[]" in params or "ids" in params:
            given = params.getlist("ids[]") + params.getlist("ids")
            if "page" in params or "limit" in params:
                raise invalid("ids[] names the files of one page: send it without page or limit")
            if len(given) > MAX_IDS:
                raise invalid(f"ids[] names at most {MAX_IDS} files, not {len(given)}")
            ids = [id_of(value, f"ids[{index}]", "file") for index, value in enumerate(given)]
        limit = page_limit(params.get("limit")) if ids is None else MAX_IDS
        page = params.get("page")
        before = page_after(page) if page else None
        found, following = await self.files.db.run(
            lambda: self.files.list(workspace, limit=limit, before=before, scope_session_id=scope_id, ids=ids)
        )
        next_page = page_cursor(following) if following is not None else None
        return JSONResponse({"data": [record.view() for record in found], "next_page": next_page})

    async def retrieve(self, request: Request, workspace: str) -> Response:
        record = await own_file(self.files, workspace, request.path_params["id"], "file_id")
        return JSONResponse(record.view())

    async def content(self, request: Request, workspace: str) -> Response:
        record = await own_file(self.files, workspace, request.path_params["id"], "file_id")
        if not record.downloadable:
            raise ApiError(400, f"file {record.id!r} is not downloadable (it may only be mounted into sessions)",
                           error_code="file_not_downloadable")  # fmt: skip
        data = await self.files.db.run(self.files.read, record)
        # An attachment, never sniffed: a file's bytes are not a page of this origin's, whatever its type says.
        headers = {"content-disposition": content_disposition(record.filename), "x-content-type-options": "nosniff"}
        return Response(data, media_type=record.mime_type, headers=headers)

    async def delete(self, request: Request, workspace: str) -> Response:
        file_id = id_of(request.path_params["id"], "file_id", "file")
        try:
            await self.files.db.run(self.files.delete, workspace, file_id)
        except FileNotFound as exc:
            raise file_error(exc, file_id) from exc
        return JSONResponse({"id": file_id, "type": "file_deleted"})

    def routes(self, authed: Authed) -> list[Route]:
        return [
            Route("/v1/files", authed(self.upload), methods=["POST"]),
            Route("/v1/files", authed(self.listing), methods=["GET"]),
            Route("/v1/files/{id}", authed(self.retrieve), methods=["GET"]),
            Route("/v1/files/{id}", authed(self.delete), methods=["DELETE"]),
            Route("/v1/files/{id}/content", authed(self.content), methods=["GET"]),
        ]


def file_routes(gateway: Gateway, authed: Authed) -> list[Route]:
    return Files(gateway).routes(authed)
