"""Skills as a library: an uploaded folder's checks (pure functions of corral.skill_bundles, each refusal naming its
problem), the archives a version is kept and downloaded as, and corral.skills on a database and blob store of the
test's own: versions, `latest`, deletes, workspaces, and the pin a session carries."""

from __future__ import annotations

import io
import tarfile
import zipfile
from pathlib import Path

import pytest

from corral.blobs import LocalBlobStore
from corral.errors import BlobNotFound, InvalidSkillBundle, SkillConflict, SkillNotFound
from corral.knowledge_db import KnowledgeDB
from corral.skill_bundles import (
    MAX_BUNDLE_BYTES,
    MAX_BUNDLE_FILES,
    MAX_DESCRIPTION_CHARS,
    bundle_tar,
    bundle_zip,
    frontmatter,
    skill_bundle,
    tar_files,
)
from corral.skills import Skills


def skill_md(name: str = "pdf-tools", description: str = "Fill PDF forms.", body: str = "Use it.\n") -> bytes:
    return f"---\nname: {name}\ndescription: {description}\n---\n{body}".encode()


def folder(top: str = "pdf-tools", **md: str) -> list[tuple[str, bytes]]:
    return [(f"{top}/SKILL.md", skill_md(**md)), (f"{top}/scripts/fill.py", b"print('filled')\n")]


def refusal(files: list[tuple[str, bytes]]) -> str:
    with pytest.raises(InvalidSkillBundle) as caught:
        skill_bundle(files)
    return str(caught.value)


def test_a_folder_is_read_with_its_wrapper_stripped() -> None:
    bundle = skill_bundle(folder())
    assert (bundle.name, bundle.description, bundle.folder) == ("pdf-tools", "Fill PDF forms.", "pdf-tools")
    assert [path for path, _ in bundle.files] == ["SKILL.md", "scripts/fill.py"]
    assert bundle.size_bytes == sum(len(data) for _, data in folder())


@pytest.mark.parametrize(
    ("files", "named"),
    [
        ([], "no files"),
        ([("pdf-tools/README.md", b"x")], "no SKILL.md at the root"),
        ([("pdf-tools/sub/SKILL.md", skill_md())], "no SKILL.md at the root"),
        ([("SKILL.md", skill_md())], "one top directory"),
        ([("a/SKILL.md", skill_md()), ("b/x.py", b"")], "one top directory"),
        ([("/etc/SKILL.md", skill_md())], "absolute"),
        ([("C:/x/SKILL.md", skill_md())], "absolute"),
        ([("pdf-tools/../SKILL.md", skill_md())], "'..'"),
        ([("pdf-tools/./SKILL.md", skill_md())], "'.'"),
        ([("pdf-tools//SKILL.md", skill_md())], "empty"),
        ([("pdf-tools\\SKILL.md", skill_md())], "backslash"),
        ([("pdf-tools/SKILL.md\x00", skill_md())], "NUL"),
        ([("pdf-tools/a\nb", b""), ("pdf-tools/SKILL.md", skill_md())], "control character"),
        ([("", skill_md())], "no name"),
        ([("p/SKILL.md", skill_md()), ("p/SKILL.md", skill_md())], "uploaded twice"),
        ([("p/SKILL.md", skill_md()), ("p/a", b""), ("p/a/b", b"")], "both a file and a directory"),
        ([("p/SKILL.md", b"no frontmatter")], "must start with YAML frontmatter"),
        ([("p/SKILL.md", b"---\nname: x\n")], "no closing '---'"),
        ([("p/SKILL.md", b"---\nname: [unclosed\n---\n")], "not valid YAML"),
        ([("p/SKILL.md", b"---\n- a list\n---\n")], "YAML mapping"),
        ([("p/SKILL.md", b"---\ndescription: d\n---\n")], "has no name"),
        ([("p/SKILL.md", skill_md(name="PDF_Tools"))], "kebab-case"),
        ([("p/SKILL.md", skill_md(name="a" * 65))], "kebab-case"),
        ([("p/SKILL.md", skill_md(name="-x"))], "kebab-case"),
        ([("p/SKILL.md", b"---\nname: x\n---\n")], "has no description"),
        ([("p/SKILL.md", skill_md(description="''"))], "non-empty"),
        ([("p/SKILL.md", skill_md(description="d" * (MAX_DESCRIPTION_CHARS + 1)))], "at most"),
        ([("p/SKILL.md", skill_md(description="use <b>this</b>"))], "'<' or '>'"),
        ([("p/SKILL.md", b"---\nname: x\ndescription: \xff\n---\n")], "not UTF-8"),
    ],
)
def test_each_bad_folder_is_refused_naming_its_problem(files: list[tuple[str, bytes]], named: str) -> None:
    assert named in refusal(files)


def test_limits_on_count_and_weight_are_named() -> None:
    many = [("p/SKILL.md", skill_md())] + [(f"p/f{index}", b"") for index in range(MAX_BUNDLE_FILES)]
    assert f"at most {MAX_BUNDLE_FILES}" in refusal(many)
    heavy = [("p/SKILL.md", skill_md()), ("p/big.bin", b"\0" * MAX_BUNDLE_BYTES)]
    assert f"at most {MAX_BUNDLE_BYTES}" in refusal(heavy)


def test_frontmatter_takes_a_bom_and_strips_the_description() -> None:
    assert frontmatter(b"\xef\xbb\xbf---\nname: a-b\ndescription: |\n  many\n  lines\n---\n") == ("a-b", "many\nlines")


def test_archives_round_trip_and_are_deterministic() -> None:
    bundle = skill_bundle(folder())
    archive = bundle_tar(bundle)
    assert archive == bundle_tar(skill_bundle(list(reversed(folder()))))
    assert tar_files(archive) == list(bundle.files)
    with tarfile.open(fileobj=io.BytesIO(archive)) as opened:
        assert opened.getnames() == ["SKILL.md", "scripts/fill.py"]
    with zipfile.ZipFile(io.BytesIO(bundle_zip("pdf-tools", bundle.files))) as zipped:
        assert zipped.namelist() == ["pdf-tools/SKILL.md", "pdf-tools/scripts/fill.py"]
        assert zipped.read("pdf-tools/scripts/fill.py") == b"print('filled')\n"


@pytest.fixture
def skills(tmp_path: Path) -> Skills:
    return Skills(KnowledgeDB(tmp_path / "knowledge.db"), LocalBlobStore(tmp_path / "blobs"))


def test_versions_latest_delete_and_pin(skills: Skills) -> None:
    skill, first = skills.create("team-a", folder())
    assert skill.display_name == "pdf-tools" and skill.latest_version == first.id
    second = skills.add_version("team-a", skill.id, folder(description="Fill and sign PDF forms."))
    assert skills.get("team-a", skill.id).latest_version == second.id
    assert skills.version("team-a", skill.id, "latest") == second
    pin = skills.pin("team-a", skill.id, None)
    assert (pin.version, pin.name, pin.description) == (second.id, "pdf-tools", "Fill and sign PDF forms.")
    assert skills.pin("team-a", skill.id, first.id).version == first.id
    stored = tar_files(skills.blobs.get(pin.blob_key))
    assert stored[0] == ("SKILL.md", skill_md(description="Fill and sign PDF forms."))
    versions, after = skills.versions("team-a", skill.id, limit=1)
    assert versions == [second] and after is not None
    assert skills.versions("team-a", skill.id, limit=1, after=after) == ([first], None)

    with pytest.raises(InvalidSkillBundle, match="name never changes"):
        skills.add_version("team-a", skill.id, folder(name="other-name"))
    skills.delete_version("team-a", skill.id, second.id)
    assert skills.get("team-a", skill.id).latest_version == first.id
    with pytest.raises(BlobNotFound):
        skills.blobs.get(second.blob_key)
    with pytest.raises(SkillConflict, match="only version"):
        skills.delete_version("team-a", skill.id, first.id)
    skills.delete("team-a", skill.id)
    with pytest.raises(SkillNotFound, match=skill.id):
        skills.pin("team-a", skill.id, None)
    with pytest.raises(BlobNotFound):
        skills.blobs.get(first.blob_key)


def test_another_workspaces_skill_is_not_found(skills: Skills) -> None:
    skill, version = skills.create("team-a", folder(), display_name="PDF tools")
    assert skill.display_name == "PDF tools"
    for call in (
        lambda: skills.get("team-b", skill.id),
        lambda: skills.pin("team-b", skill.id, None),
        lambda: skills.version("team-b", skill.id, version.id),
        lambda: skills.add_version("team-b", skill.id, folder()),
        lambda: skills.delete_version("team-b", skill.id, version.id),
        lambda: skills.delete("team-b", skill.id),
    ):
        with pytest.raises(SkillNotFound, match=f"skill {skill.id!r} was not found"):
            call()
    assert skills.list_skills("team-b", 20) == ([], None)
    with pytest.raises(SkillNotFound, match="version 'skillver_nope' of skill"):
        skills.pin("team-a", skill.id, "skillver_nope")
    assert skills.get("team-a", skill.id).id == skill.id


def test_listing_pages_newest_first(skills: Skills) -> None:
    made = [skills.create("team-c", folder(top=f"s{index}"))[0].id for index in range(3)]
    page, after = skills.list_skills("team-c", 2)
    assert [s.id for s in page] == made[:0:-1] and after is not None
    rest, end = skills.list_skills("team-c", 2, after)
    assert [s.id for s in rest] == made[:1] and end is None
    assert skills.list_skills("team-c", 5, source="anthropic") == ([], None)
