"""Skills and their versions over HTTP (`/v1/skills`), as the SDK's `client.beta.skills` calls them, on the library
`corral.skills` (metadata in the knowledge database, bundles in the blob store).

An upload is multipart: repeated `files[]` parts whose filenames are paths under one top directory with `SKILL.md`
at its root (`anthropic.lib.files_from_dir` makes them), and on create an optional `display_name`. A bad folder is
a 400 naming the problem (corral.skill_bundles). Deleting a skill deletes all its versions; a skill always has a
version, so its only one is refused (409: delete the skill). `latest` names the newest version wherever a version
is read; a delete names the version's id. Every id is checked for its kind (400) and its workspace (404).
"""

from __future__ import annotations

import base64
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any

from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartException, MultiPartParser
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from corral.errors import InvalidSkillBundle, SkillConflict, SkillNotFound
from corral.skill_bundles import MAX_BUNDLE_BYTES, MAX_BUNDLE_FILES, bundle_zip
from corral.skills import LATEST, SOURCE_CUSTOM, Skill, Skills, SkillVersion
from gateway.errors import ApiError, invalid, not_found
from gateway.http import Authed
from gateway.owned import MAX_ID_LENGTH, id_of
from gateway.pages import page_limit
from gateway.shapes import when

if TYPE_CHECKING:
    from gateway.app import Gateway

MAX_UPLOAD_BYTES = MAX_BUNDLE_BYTES + 4 * 1024 * 1024
"""A multipart upload's bound as it arrives: the files' own limit and room for each part's headers."""
FILES_FIELDS = ("files[]", "files")
"""The SDK names each part `files[]`; a plain form's `files` is taken too."""
SOURCES = (SOURCE_CUSTOM, "anthropic")


def skill_view(skill: Skill) -> dict[str, Any]:
    return {
        "type": "skill",
        "id": skill.id,
        "display_name": skill.display_name,
        "latest_version_id": skill.latest_version,
        "source": {"type": skill.source},  # an object in the SDK's `BetaSkill` (a string in the list's filter)
        "created_at": when(skill.created_at),
        "updated_at": when(skill.updated_at),
    }


def version_view(version: SkillVersion) -> dict[str, Any]:
    return {
        "type": "skill_version",
        "id": version.id,
        "skill_id": version.skill_id,
        "name": version.name,
        "description": version.description,
        "created_at": when(version.created_at),
    }


def skill_id_of(value: Any, field: str = "skill_id") -> str:
    """A skill id (400 for another kind); one longer than any corral makes is one that is not found."""
    skill_id = id_of(value, field, "skill")
    if len(skill_id) > MAX_ID_LENGTH:
        raise not_found("skill", skill_id)
    return skill_id


def version_of(value: Any, field: str = "version", latest: bool = True) -> str:
    """A version id, or `latest` where a version is read."""
    if value == LATEST:
        if latest:
            return LATEST
        raise invalid(f"{field}: name the version's id (skillver_…); 'latest' is taken where a version is read")
    version = id_of(value, field, "skill version")
    if len(version) > MAX_ID_LENGTH:
        raise not_found("skill version", version)
    return version


def refused(error: Exception) -> ApiError:
    """A library refusal as the answer the SDK reads."""
    if isinstance(error, SkillNotFound):
        return not_found(error.kind, error.object_id)
    if isinstance(error, SkillConflict):
        return ApiError(409, str(error), error_code="skill_version_in_use")
    return invalid(str(error))


def _cursor(after: int | None) -> str | None:
    return base64.urlsafe_b64encode(f"k{after}".encode()).decode() if after is not None else None


def _after(page: str | None) -> int | None:
    if page is None:
        return None
    try:
        text = base64.urlsafe_b64decode(page.encode()).decode()
        if text.startswith("k") and text[1:].isdigit():
            return int(text[1:])
    except (ValueError, UnicodeDecodeError):
        pass
    raise invalid("page: not a cursor this list gave")


async def upload(request: Request, fields: set[str]) -> tuple[list[tuple[str, bytes]], dict[str, str]]:
    """The `files[]` parts of a multipart request as (filename, bytes), and its other form `fields` (400 for any
    other); read with a bound on the whole body, so an oversized upload is refused as it arrives."""
    content_type = request.headers.get("content-type", "")
    if not content_type.startswith("multipart/form-data"):
        raise invalid("the skill's folder is sent as multipart/form-data, one files[] part per file "
                      "(the SDK: files=files_from_dir(path))")  # fmt: skip
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_UPLOAD_BYTES:
        raise invalid(_too_large())

    async def bounded() -> AsyncGenerator[bytes, None]:
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > MAX_UPLOAD_BYTES:
                raise invalid(_too_large())
            yield chunk

    parser = MultiPartParser(request.headers, bounded(), max_files=MAX_BUNDLE_FILES + 1, max_fields=16)
    try:
        form = await parser.parse()
    except MultiPartException as exc:
        raise invalid(f"the upload is not a multipart form this gateway reads: {exc.message}") from exc
    files: list[tuple[str, bytes]] = []
    values: dict[str, str] = {}
    try:
        for key, value in form.multi_items():
            if isinstance(value, UploadFile):
                if key not in FILES_FIELDS:
                    raise invalid(f"unknown file field {key!r}: each file of the skill is a files[] part")
                files.append((value.filename or "", await value.read()))
            elif key in fields and key not in values:
                values[key] = value
            elif key in FILES_FIELDS:
                raise invalid(f"{key} parts must be files with a filename (csv-summary/SKILL.md)")
            else:
                raise invalid(f"unknown or repeated field {key!r}")
    finally:
        await form.close()
    return files, values


def _too_large() -> str:
    return f"the upload is over {MAX_UPLOAD_BYTES} bytes: a skill's files are at most {MAX_BUNDLE_BYTES} bytes in all"


class SkillsApi:
    """The `/v1/skills` endpoints of one gateway."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway
        self.skills = Skills(gateway.knowledge, gateway.blobs)

    async def _call(self, function: Any, *args: object) -> Any:
        try:
            return await self.gateway.knowledge.run(function, *args)
        except (InvalidSkillBundle, SkillNotFound, SkillConflict) as exc:
            raise refused(exc) from exc

    async def create(self, request: Request, workspace: str) -> Response:
        files, values = await upload(request, {"display_name"})
        skill, _ = await self._call(self.skills.create, workspace, files, values.get("display_name"))
        return JSONResponse(skill_view(skill))

    async def listing(self, request: Request, workspace: str) -> Response:
        params = request.query_params
        unknown = sorted(set(params) - {"limit", "page", "source"})
        if unknown:
            raise invalid(f"unknown query parameter(s): {', '.join(unknown)}")
        source = params.get("source")
        if source is not None and source not in SOURCES:
            raise invalid(f"source must be one of {', '.join(SOURCES)}")
        skills, after = await self._call(self.skills.list_skills, workspace, page_limit(params.get("limit")),
                                         _after(params.get("page")), source)  # fmt: skip
        return JSONResponse({"data": [skill_view(skill) for skill in skills], "next_page": _cursor(after)})

    async def retrieve(self, request: Request, workspace: str) -> Response:
        skill = await self._call(self.skills.get, workspace, skill_id_of(request.path_params["id"]))
        return JSONResponse(skill_view(skill))

    async def delete(self, request: Request, workspace: str) -> Response:
        skill_id = skill_id_of(request.path_params["id"])
        await self._call(self.skills.delete, workspace, skill_id)
        return JSONResponse({"id": skill_id, "type": "skill_deleted"})

    async def add_version(self, request: Request, workspace: str) -> Response:
        skill_id = skill_id_of(request.path_params["id"])
        await self._call(self.skills.get, workspace, skill_id)  # a missing skill is a 404 before any upload is read
        files, _ = await upload(request, set())
        return JSONResponse(version_view(await self._call(self.skills.add_version, workspace, skill_id, files)))

    async def versions(self, request: Request, workspace: str) -> Response:
        skill_id = skill_id_of(request.path_params["id"])
        params = request.query_params
        unknown = sorted(set(params) - {"limit", "page"})
        if unknown:
            raise invalid(f"unknown query parameter(s): {', '.join(unknown)}")
        versions, after = await self._call(self.skills.versions, workspace, skill_id,
                                           page_limit(params.get("limit")), _after(params.get("page")))  # fmt: skip
        return JSONResponse({"data": [version_view(v) for v in versions], "next_page": _cursor(after)})

    async def version(self, request: Request, workspace: str) -> Response:
        skill_id, version = skill_id_of(request.path_params["id"]), version_of(request.path_params["version"])
        return JSONResponse(version_view(await self._call(self.skills.version, workspace, skill_id, version)))

    async def delete_version(self, request: Request, workspace: str) -> Response:
        skill_id = skill_id_of(request.path_params["id"])
        version = version_of(request.path_params["version"], latest=False)
        deleted = await self._call(self.skills.delete_version, workspace, skill_id, version)
        return JSONResponse({"id": deleted.id, "type": "skill_version_deleted"})

    async def content(self, request: Request, workspace: str) -> Response:
        skill_id, version = skill_id_of(request.path_params["id"]), version_of(request.path_params["version"])
        found, files = await self._call(self.skills.content, workspace, skill_id, version)
        archive = bundle_zip(found.name, files)
        headers = {"content-disposition": f'attachment; filename="{found.name}.zip"'}
        return Response(archive, media_type="application/zip", headers=headers)

    def routes(self, authed: Authed, synced: Authed) -> list[Route]:
        """`synced` also takes the session token of a self-hosted worker whose session's agent uses the skill."""
        base, one = "/v1/skills", "/v1/skills/{id}/versions/{version}"
        return [
            Route(base, authed(self.create), methods=["POST"]),
            Route(base, authed(self.listing), methods=["GET"]),
            Route(base + "/{id}", authed(self.retrieve), methods=["GET"]),
            Route(base + "/{id}", authed(self.delete), methods=["DELETE"]),
            Route(base + "/{id}/versions", authed(self.add_version), methods=["POST"]),
            Route(base + "/{id}/versions", authed(self.versions), methods=["GET"]),
            Route(one, synced(self.version), methods=["GET"]),
            Route(one, authed(self.delete_version), methods=["DELETE"]),
            Route(one + "/content", synced(self.content), methods=["GET"]),
        ]


def skill_routes(gateway: Gateway, authed: Authed) -> list[Route]:
    return SkillsApi(gateway).routes(authed, lambda handler: gateway.credentials.for_attached(handler, "skill", "id"))
