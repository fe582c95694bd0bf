"""A skill's folder as it is uploaded, stored and downloaded: pure functions, no I/O.

An upload is a list of `(relative path, bytes)` pairs, as the SDK's `files_from_dir` makes them: every path is
under one top directory (`csv-summary/SKILL.md`, `csv-summary/scripts/summarize.py`), with `SKILL.md` at that
directory's root (examples/skills/csv-summary is one).
`SKILL.md` starts with YAML frontmatter between two `---` lines naming the skill (`name`, kebab-case) and saying
when to use it (`description`); the agent sees both in its system prompt and reads the rest when it needs it.

Limits (each refused with an `InvalidSkillBundle` naming it):
1. at most `MAX_BUNDLE_FILES` files and `MAX_BUNDLE_BYTES` bytes in all, at least one file;
2. paths relative, in `/`-separated segments, none empty, `.` or `..`, no backslash, NUL or control character,
   at most `MAX_PATH_CHARS` characters, no two alike;
3. `name`: lowercase letters, digits and single hyphens, at most `MAX_NAME_CHARS`; `description`: non-empty, at
   most `MAX_DESCRIPTION_CHARS`; neither holds `<` or `>` (they go into the system prompt as text, not markup).

A version is stored as a tar archive with the wrapper directory stripped (`SKILL.md` at its root), which the
sandbox unpacks into `/mnt/skills/<name>/`; it is downloaded as a zip archive of `<name>/…`.
"""

from __future__ import annotations

import io
import re
import tarfile
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass

import yaml

from corral.errors import InvalidSkillBundle

SKILL_FILE = "SKILL.md"
MAX_BUNDLE_FILES = 500
MAX_BUNDLE_BYTES = 30 * 1024 * 1024
"""What a skill's files may weigh in all, uncompressed (upstream's upload limit is of the same order)."""
MAX_PATH_CHARS = 1024
MAX_NAME_CHARS = 64
MAX_DESCRIPTION_CHARS = 1024
MAX_DISPLAY_NAME_CHARS = 255
NAME_PATTERN = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


@dataclass(frozen=True)
class SkillBundle:
    """One skill's folder, checked: its frontmatter and its files by path relative to the folder."""

    name: str
    description: str
    folder: str
    """The uploaded top directory's name (it is dropped: the skill's directory is named by `name`)."""
    files: tuple[tuple[str, bytes], ...]
    """Each file's path under the folder (`SKILL.md`, `scripts/summarize.py`) and bytes, sorted by path."""

    @property
    def size_bytes(self) -> int:
        return sum(len(data) for _, data in self.files)


def path_problem(path: object) -> str | None:
    """Why `path` is not a relative path that stays inside its folder, or None."""
    if not isinstance(path, str) or not path:
        return "a file has no name (each part needs a relative filename such as csv-summary/SKILL.md)"
    shown = repr(path[:120])
    if "\x00" in path:
        return f"path {shown} holds a NUL character"
    if "\\" in path:
        return f"path {shown} holds a backslash: use '/' between directories"
    if _CONTROL.search(path):
        return f"path {shown} holds a control character"
    if path.startswith("/") or re.match(r"^[A-Za-z]:", path):
        return f"path {shown} is absolute: paths are relative to the upload (csv-summary/SKILL.md)"
    if len(path) > MAX_PATH_CHARS:
        return f"path {shown} is longer than {MAX_PATH_CHARS} characters"
    if any(segment in ("", ".", "..") for segment in path.split("/")):
        return f"path {shown} has an empty, '.' or '..' segment: every file must stay inside the skill's folder"
    return None


def skill_bundle(files: Sequence[tuple[str, bytes]]) -> SkillBundle:
    """The skill the uploaded `files` make, or `InvalidSkillBundle` naming the first problem found."""
    if not files:
        raise InvalidSkillBundle("the upload has no files: send the skill's folder (SKILL.md at its root) as files[]")
    if len(files) > MAX_BUNDLE_FILES:
        raise InvalidSkillBundle(f"the upload has {len(files)} files; a skill has at most {MAX_BUNDLE_FILES}")
    total = sum(len(data) for _, data in files)
    if total > MAX_BUNDLE_BYTES:
        raise InvalidSkillBundle(f"the upload's files weigh {total} bytes; a skill's are at most {MAX_BUNDLE_BYTES}")
    for path, _ in files:
        problem = path_problem(path)
        if problem is not None:
            raise InvalidSkillBundle(problem)
    tops = sorted({path.split("/", 1)[0] for path, _ in files})
    loose = [path for path, _ in files if "/" not in path]
    if len(tops) > 1 or loose:
        found = ", ".join(repr(top) for top in tops[:5])
        raise InvalidSkillBundle(f"all files must be under one top directory (csv-summary/SKILL.md, csv-summary/...); "
                                 f"found {found}")  # fmt: skip
    folder = tops[0]
    inside: dict[str, bytes] = {}
    for path, data in files:
        relative = path.split("/", 1)[1]
        if relative in inside:
            raise InvalidSkillBundle(f"path {path!r} is uploaded twice")
        inside[relative] = data
    for relative in inside:  # `a` as a file and `a/b` as another cannot both be unpacked
        parent = relative.rsplit("/", 1)[0] if "/" in relative else None
        while parent is not None:
            if parent in inside:
                raise InvalidSkillBundle(f"path {folder}/{parent!r} is both a file and a directory")
            parent = parent.rsplit("/", 1)[0] if "/" in parent else None
    if SKILL_FILE not in inside:
        raise InvalidSkillBundle(f"no {SKILL_FILE} at the root of the folder: expected {folder}/{SKILL_FILE}")
    name, description = frontmatter(inside[SKILL_FILE])
    return SkillBundle(name, description, folder, tuple(sorted(inside.items())))


def frontmatter(skill_md: bytes) -> tuple[str, str]:
    """The `name` and `description` of a `SKILL.md`'s YAML frontmatter, checked."""
    try:
        text = skill_md.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        raise InvalidSkillBundle(f"{SKILL_FILE} is not UTF-8 text") from exc
    lines = text.splitlines()
    if not lines or lines[0].strip() != "---":
        raise InvalidSkillBundle(f"{SKILL_FILE} must start with YAML frontmatter between '---' lines "
                                 "(name and description)")  # fmt: skip
    end = next((index for index, line in enumerate(lines[1:], 1) if line.strip() == "---"), None)
    if end is None:
        raise InvalidSkillBundle(f"{SKILL_FILE}'s frontmatter has no closing '---' line")
    try:
        fields = yaml.safe_load("\n".join(lines[1:end]))
    except yaml.YAMLError as exc:
        raise InvalidSkillBundle(f"{SKILL_FILE}'s frontmatter is not valid YAML: {_first_line(exc)}") from exc
    if not isinstance(fields, dict):
        raise InvalidSkillBundle(f"{SKILL_FILE}'s frontmatter must be a YAML mapping with name and description")
    name, description = fields.get("name"), fields.get("description")
    if name is None:
        raise InvalidSkillBundle(f"{SKILL_FILE}'s frontmatter has no name")
    if not isinstance(name, str) or len(name) > MAX_NAME_CHARS or not NAME_PATTERN.match(name):
        raise InvalidSkillBundle(f"{SKILL_FILE}'s frontmatter name {str(name)[:80]!r} must be lowercase kebab-case "
                                 f"(a-z, 0-9, single '-') of at most {MAX_NAME_CHARS} characters")  # fmt: skip
    if description is None:
        raise InvalidSkillBundle(f"{SKILL_FILE}'s frontmatter has no description")
    if not isinstance(description, str) or not description.strip():
        raise InvalidSkillBundle(f"{SKILL_FILE}'s frontmatter description must be non-empty text")
    if len(description) > MAX_DESCRIPTION_CHARS:
        raise InvalidSkillBundle(f"{SKILL_FILE}'s frontmatter description is {len(description)} characters; "
                                 f"at most {MAX_DESCRIPTION_CHARS}")  # fmt: skip
    if "<" in description or ">" in description:
        raise InvalidSkillBundle(f"{SKILL_FILE}'s frontmatter description must not hold '<' or '>' (it is put in "
                                 "the system prompt as plain text)")  # fmt: skip
    return name, description.strip()


def _first_line(error: yaml.YAMLError) -> str:
    return str(error).splitlines()[0][:200] if str(error) else type(error).__name__


def bundle_tar(bundle: SkillBundle) -> bytes:
    """The folder as an uncompressed tar archive, `SKILL.md` at its root; the same files make the same bytes."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for path, data in bundle.files:
            info = tarfile.TarInfo(path)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def tar_files(data: bytes) -> list[tuple[str, bytes]]:
    """The regular files of a tar archive `bundle_tar` made, by path."""
    files = []
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as archive:
        for member in archive.getmembers():
            extracted = archive.extractfile(member) if member.isfile() else None
            if extracted is not None:
                files.append((member.name, extracted.read()))
    return files


def bundle_zip(name: str, files: Sequence[tuple[str, bytes]]) -> bytes:
    """A zip archive of the folder as `<name>/…` (upstream's download: the skill's name is its base name)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for path, data in files:
            info = zipfile.ZipInfo(f"{name}/{path}", date_time=(1980, 1, 1, 0, 0, 0))
            info.external_attr = 0o644 << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            archive.writestr(info, data)
    return buffer.getvalue()
