"""Skills over the API, driven by the official `anthropic` SDK (`client.beta.skills`, `files_from_dir`) against a
real gateway process on the real Temporal dev server: a skill made from a folder, versions added, read by id and as
`latest`, listed in pages, downloaded as a zip that holds the folder's files, deleted; every bad folder refused with
a 400 naming its problem and nothing written; agents that list skills (shown, pinned or `latest`, refused when the
skill is not the workspace's); and every route refusing another workspace's ids (404) and the wrong kind (400).
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anthropic
import httpx
import pytest
from anthropic.lib import files_from_dir

from corral.contract.agent import MAX_AGENT_SKILLS
from gateway.skills import MAX_UPLOAD_BYTES
from tests.conftest import Stack
from tests.test_gateway import Gateway, running_gateway

pytestmark = pytest.mark.timeout(300)

Client = anthropic.AsyncAnthropic


@pytest.fixture
async def gateway(stack: Stack, tmp_path: Path) -> AsyncIterator[Gateway]:
    async with running_gateway(stack, tmp_path) as running:
        yield running


def skill_folder(root: Path, name: str = "pdf-tools", description: str = "Fill PDF forms.") -> Path:
    """A skill's folder on disk, as a user has it: SKILL.md, a script in a subdirectory, a binary file."""
    folder = root / name
    (folder / "scripts").mkdir(parents=True, exist_ok=True)
    (folder / "SKILL.md").write_text(f"---\nname: {name}\ndescription: {description}\n---\n# {name}\nRun it.\n")
    (folder / "scripts" / "fill.py").write_text("print('filled')\n")
    (folder / "logo.bin").write_bytes(bytes(range(256)))
    return folder


def folder_files(folder: Path) -> dict[str, bytes]:
    return {path.relative_to(folder).as_posix(): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


async def downloaded(client: Client, skill_id: str, version: str) -> dict[str, bytes]:
    response = await client.beta.skills.versions.download(version, skill_id=skill_id)
    with zipfile.ZipFile(io.BytesIO(await response.read())) as archive:
        return {name: archive.read(name) for name in archive.namelist()}


async def error_of(call: Any) -> tuple[int, str]:
    try:
        await call
    except anthropic.APIStatusError as exc:
        body = exc.body if isinstance(exc.body, dict) else {}
        return exc.status_code, f"{body['error']['type']}: {body['error']['message']}"
    return 200, ""


async def test_a_skill_is_made_versioned_downloaded_and_deleted(gateway: Gateway, tmp_path: Path) -> None:
    client = await gateway.client("skills")
    folder = skill_folder(tmp_path)
    skill = await client.beta.skills.create(files=files_from_dir(folder))
    assert (skill.type, skill.display_name, skill.source.type) == ("skill", "pdf-tools", "custom")
    assert skill.id.startswith("skill_") and skill.created_at == skill.updated_at
    first = await client.beta.skills.versions.retrieve("latest", skill_id=skill.id)
    assert (first.id, first.skill_id, first.name, first.description) == (
        skill.latest_version_id, skill.id, "pdf-tools", "Fill PDF forms.")  # fmt: skip
    assert await downloaded(client, skill.id, first.id) == {
        f"pdf-tools/{path}": data for path, data in folder_files(folder).items()
    }

    skill_folder(tmp_path, description="Fill and sign PDF forms.")
    (folder / "scripts" / "fill.py").write_text("print('filled and signed')\n")
    second = await client.beta.skills.versions.create(skill.id, files=files_from_dir(folder))
    assert (second.name, second.description) == ("pdf-tools", "Fill and sign PDF forms.")
    assert (await client.beta.skills.retrieve(skill.id)).latest_version_id == second.id
    assert (await client.beta.skills.versions.retrieve("latest", skill_id=skill.id)).id == second.id
    assert [v.id async for v in client.beta.skills.versions.list(skill.id, limit=1)] == [second.id, first.id]
    latest = await downloaded(client, skill.id, "latest")
    assert latest["pdf-tools/scripts/fill.py"] == b"print('filled and signed')\n"
    assert (await downloaded(client, skill.id, first.id))["pdf-tools/scripts/fill.py"] == b"print('filled')\n"

    other = await client.beta.skills.create(files=files_from_dir(skill_folder(tmp_path, "csv-tools")),
                                            display_name="CSV helpers")  # fmt: skip
    assert other.display_name == "CSV helpers"
    assert [s.id async for s in client.beta.skills.list(limit=1)] == [other.id, skill.id]
    assert [s.id async for s in client.beta.skills.list(source="anthropic")] == []

    renamed = skill_folder(tmp_path / "renamed", "pdf-tools-2")
    status, message = await error_of(client.beta.skills.versions.create(skill.id, files=files_from_dir(renamed)))
    assert status == 400 and "name never changes" in message

    deleted = await client.beta.skills.versions.delete(second.id, skill_id=skill.id)
    assert (deleted.id, deleted.type) == (second.id, "skill_version_deleted")
    assert (await client.beta.skills.retrieve(skill.id)).latest_version_id == first.id
    with pytest.raises(anthropic.NotFoundError, match="version"):
        await client.beta.skills.versions.retrieve(second.id, skill_id=skill.id)
    with pytest.raises(anthropic.ConflictError, match="only version") as only:
        await client.beta.skills.versions.delete(first.id, skill_id=skill.id)
    assert only.value.response.headers["x-should-retry"] == "false"
    gone = await client.beta.skills.delete(skill.id)
    assert (gone.id, gone.type) == (skill.id, "skill_deleted")
    with pytest.raises(anthropic.NotFoundError, match=skill.id):
        await client.beta.skills.retrieve(skill.id)
    with pytest.raises(anthropic.NotFoundError):
        await client.beta.skills.versions.download(first.id, skill_id=skill.id)
    assert [s.id async for s in client.beta.skills.list()] == [other.id]


MD = b"---\nname: tools\ndescription: Useful tools.\n---\n"
BAD_FOLDERS: list[tuple[list[tuple[str, bytes]], str]] = [
    ([("tools/README.md", b"x")], "no SKILL.md at the root"),
    ([("SKILL.md", MD)], "one top directory"),
    ([("a/SKILL.md", MD), ("b/x.py", b"")], "one top directory"),
    ([("tools/SKILL.md", MD), ("tools/../../etc/passwd", b"")], "'..'"),
    ([("/tools/SKILL.md", MD)], "absolute"),
    ([("tools\\SKILL.md", MD)], "backslash"),
    ([("tools/SKILL.md", b"# no frontmatter\n")], "frontmatter"),
    ([("tools/SKILL.md", b"---\ndescription: d\n---\n")], "has no name"),
    ([("tools/SKILL.md", b"---\nname: Tools Here\ndescription: d\n---\n")], "kebab-case"),
    ([("tools/SKILL.md", b"---\nname: tools\n---\n")], "has no description"),
    ([("tools/SKILL.md", b"---\nname: [x\n---\n")], "not valid YAML"),
]


async def test_bad_folders_are_refused_naming_the_problem(gateway: Gateway) -> None:
    client = await gateway.client("skills-bad")
    wrong = []
    for files, named in BAD_FOLDERS:
        status, message = await error_of(client.beta.skills.create(files=files))
        if status != 400 or named not in message or not message.startswith("invalid_request_error"):
            wrong.append(f"{files[0][0]}: {status} {message} (expected a 400 naming {named!r})")
    assert wrong == [], "\n".join(wrong)
    for call, named in (
        (lambda: client.beta.skills.create(files=[]), "no files"),
        (lambda: client.beta.skills.create(files=[("tools/SKILL.md", MD)], display_name="x" * 256), "display_name"),
        (lambda: client.post("/v1/skills", cast_to=object, body={"files": []}), "multipart"),
        (lambda: client.beta.skills.list(limit=0), "limit"),
        (lambda: client.beta.skills.list(source="plugin"), "source"),
        (lambda: client.beta.skills.list(page="bm90IGEgY3Vyc29y"), "page"),
    ):
        status, message = await error_of(call())
        assert status == 400 and named in message, (status, message)
    assert [s async for s in client.beta.skills.list()] == [], "no refused upload made a skill"


async def test_agents_list_the_workspaces_skills(gateway: Gateway, tmp_path: Path) -> None:
    client = await gateway.client("skills-agents")
    skill = await client.beta.skills.create(files=files_from_dir(skill_folder(tmp_path)))
    agent = await client.beta.agents.create(name="filler", model="claude-sonnet-4-6",
                                            skills=[{"type": "custom", "skill_id": skill.id}])  # fmt: skip
    assert [s.model_dump() for s in agent.skills] == [{"type": "custom", "skill_id": skill.id, "version": "latest"}]
    pinned: list[Any] = [{"type": "custom", "skill_id": skill.id, "version": skill.latest_version_id}]
    updated = await client.beta.agents.update(agent.id, version=1, skills=pinned)
    assert [s.model_dump() for s in updated.skills] == pinned
    assert [s.model_dump() for s in (await client.beta.agents.retrieve(agent.id)).skills] == pinned
    assert (await client.beta.agents.update(agent.id, version=2, system="be brief")).skills == updated.skills
    assert (await client.beta.agents.update(agent.id, version=3, skills=[])).skills == []

    missing_skill = "skill_" + "0" * 26
    cases: list[tuple[list[Any], int, str]] = [
        ([{"type": "custom", "skill_id": missing_skill}], 404, f"skills[0]: skill {missing_skill!r} was not found"),
        ([{"type": "custom", "skill_id": skill.id, "version": "skillver_" + "0" * 26}], 404, "skills[0]: version"),
        ([{"type": "custom", "skill_id": agent.id}], 400, "skills[0].skill_id"),
        ([{"type": "custom", "skill_id": skill.id, "version": "1759178010641129"}], 400, "skills[0].version"),
        ([{"type": "anthropic", "skill_id": "xlsx"}], 400, "no Anthropic skills"),
        ([{"type": "custom", "skill_id": skill.id}] * 2, 400, "listed once"),
        ([{"type": "custom", "skill_id": skill.id, "extra": 1}], 400, "skills[0]"),
        ([{"type": "custom", "skill_id": skill.id}] * (MAX_AGENT_SKILLS + 1), 400, f"at most {MAX_AGENT_SKILLS}"),
    ]
    for skills, expected, named in cases:
        status, message = await error_of(client.beta.agents.create(name="x", model="m", skills=skills))
        assert status == expected and named in message, (skills[0], status, message)
    assert [a.id async for a in client.beta.agents.list()] == [agent.id], "no refused agent was made"


async def test_another_workspaces_skills_are_404_and_the_wrong_kind_is_400(gateway: Gateway, tmp_path: Path) -> None:
    mine, theirs = await gateway.client("skills-mine"), await gateway.client("skills-theirs")
    skill = await mine.beta.skills.create(files=files_from_dir(skill_folder(tmp_path)))
    second = await mine.beta.skills.versions.create(skill.id, files=files_from_dir(skill_folder(tmp_path)))
    version, files = second.id, files_from_dir(skill_folder(tmp_path))
    their_skill = await theirs.beta.skills.create(files=files_from_dir(skill_folder(tmp_path / "t")))
    agent = await mine.beta.agents.create(name="a", model="claude-sonnet-4-6")
    skills, versions = theirs.beta.skills, theirs.beta.skills.versions
    cross = {
        "GET skill": skills.retrieve(skill.id),
        "DELETE skill": skills.delete(skill.id),
        "POST versions": versions.create(skill.id, files=files),
        "GET versions": versions.list(skill.id),
        "GET version": versions.retrieve(version, skill_id=skill.id),
        "GET latest": versions.retrieve("latest", skill_id=skill.id),
        "DELETE version": versions.delete(version, skill_id=skill.id),
        "GET content": versions.download(version, skill_id=skill.id),
        "GET their skill, my version": versions.retrieve(version, skill_id=their_skill.id),
        "DELETE their skill, my version": versions.delete(version, skill_id=their_skill.id),
        "GET content, their skill, my version": versions.download(version, skill_id=their_skill.id),
        "agent with my skill": theirs.beta.agents.create(name="x", model="m",
                                                         skills=[{"type": "custom", "skill_id": skill.id}]),
    }  # fmt: skip
    wrong_kind = {
        "GET skill": (mine.beta.skills.retrieve(agent.id), "skill_id"),
        "DELETE skill": (mine.beta.skills.delete(version), "skill_id"),
        "POST versions": (mine.beta.skills.versions.create(agent.id, files=files), "skill_id"),
        "GET versions": (mine.beta.skills.versions.list(version), "skill_id"),
        "GET version": (mine.beta.skills.versions.retrieve(skill.id, skill_id=skill.id), "version"),
        "GET version, wrong skill": (mine.beta.skills.versions.retrieve(version, skill_id=version), "skill_id"),
        "DELETE version": (mine.beta.skills.versions.delete(agent.id, skill_id=skill.id), "version"),
        "DELETE latest": (mine.beta.skills.versions.delete("latest", skill_id=skill.id), "version"),
        "GET content": (mine.beta.skills.versions.download("1759178010641129", skill_id=skill.id), "version"),
    }
    wrong = []
    for name, call in cross.items():
        status, message = await error_of(call)
        if status != 404 or not message.startswith("not_found_error"):
            wrong.append(f"{name} from another workspace: {status} {message}")
    for name, (call, field) in wrong_kind.items():
        status, message = await error_of(call)
        if status != 400 or not message.startswith(f"invalid_request_error: {field}"):
            wrong.append(f"{name} with the wrong kind of id: {status} {message}")
    assert wrong == [], "\n".join(wrong)
    assert [s.id async for s in theirs.beta.skills.list()] == [their_skill.id]
    assert [v.id async for v in mine.beta.skills.versions.list(skill.id)] == [version, skill.latest_version_id]
    assert (await mine.beta.skills.retrieve(skill.id)).latest_version_id == version


def test_the_routes_are_the_sdks(stack: Stack) -> None:
    """Every skills route the gateway serves is one the SDK calls (and no other)."""
    from tests.test_gateway_isolation import served_routes

    ours = {(method, path) for method, path, _ in served_routes(stack) if path.startswith("/v1/skills")}
    base, one = "/v1/skills", "/v1/skills/{id}/versions/{version}"
    assert ours == {("POST", base), ("GET", base), ("GET", base + "/{id}"), ("DELETE", base + "/{id}"),
                    ("POST", base + "/{id}/versions"), ("GET", base + "/{id}/versions"), ("GET", one),
                    ("DELETE", one), ("GET", one + "/content")}  # fmt: skip


async def test_hostile_uploads_are_a_clear_400(gateway: Gateway) -> None:
    """Malformed multipart, a declared size past the bound, control characters and traversal in filenames and in
    the version path: each a 400 in the API's error shape, never a 500; a non-ASCII path round-trips."""
    client = await gateway.client("skills-hostile")
    headers = {"x-api-key": str(client.api_key), "anthropic-version": "2023-06-01"}
    async with httpx.AsyncClient(base_url=gateway.url, headers=headers) as http:

        async def post(content: bytes, content_type: str) -> tuple[int, str]:
            answer = await http.post("/v1/skills", content=content, headers={"content-type": content_type})
            if answer.status_code == 200:
                return 200, answer.json()["id"]
            return answer.status_code, answer.json()["error"]["message"]

        def multipart(*parts: tuple[str, bytes]) -> bytes:
            head = b'--b0und\r\nContent-Disposition: form-data; name="files[]"; filename="'
            body = [head + name.encode() + b'"\r\nContent-Type: text/plain\r\n\r\n' + data + b"\r\n"
                    for name, data in parts]  # fmt: skip
            return b"".join(body) + b"--b0und--\r\n"

        form = "multipart/form-data; boundary=b0und"
        for content, content_type, named in (
            (b"garbage", "multipart/form-data", "boundary"),
            (b"--b0und\r\nnot headers\r\n\r\nx", form, "multipart"),
            (b"{}", "application/json", "multipart/form-data"),
            (b"--b0und--\r\n", form, "no files"),
            (multipart(("tools/SKILL\x01.md", MD)), form, "control character"),
            (multipart(("tools/SKILL.md", MD), ("tools/a\tb", b"")), form, "control character"),
            (multipart(("../tools/SKILL.md", MD)), form, "'..'"),
            (multipart(("tools/SKILL.md", MD), ("tools/sub//x", b"")), form, "empty"),
        ):
            status, message = await post(content, content_type)
            assert status == 400 and named in message, (content[:60], status, message)
        status, skill_id = await post(multipart(("outils-été/SKILL.md", MD), ("outils-été/données.txt", b"1")), form)
        assert status == 200, skill_id
        files = await downloaded(client, skill_id, "latest")
        assert files == {"tools/SKILL.md": MD, "tools/données.txt": b"1"}

        async def oversized() -> AsyncIterator[bytes]:  # chunked, with no length declared: bounded as it arrives
            yield multipart(("tools/SKILL.md", MD))[:-10]
            for _ in range(MAX_UPLOAD_BYTES // 2**20 + 1):
                yield b"x" * 2**20

        too_big = await http.post("/v1/skills", content=oversized(), headers={"content-type": form})
        assert too_big.status_code == 400 and "the upload is over" in too_big.json()["error"]["message"]
        for path in ("/versions/..%2F..%2Fetc", "/versions/%00", "/versions/skillver_%0d%0aX/content"):
            answer = await http.get(f"/v1/skills/{skill_id}{path}")
            assert answer.status_code in (400, 404) and answer.json()["type"] == "error", (path, answer.text)
