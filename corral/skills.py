"""Skills and their versions (`/v1/skills`): metadata in the knowledge database (corral.knowledge_db), each version's
folder as a tar archive in the blob store (corral.blobs), under `skills/<skill_id>/<version_id>/bundle.tar`.

A skill (`skill_…`) belongs to one workspace; another workspace's is not found, exactly like a missing one. It
holds at least one version (`skillver_…`): it is created with its first, `latest` is its newest, and its only
version cannot be deleted (`SkillConflict`: delete the skill, which deletes every version with it). Its `name` is
set by the first upload's `SKILL.md` and every later version must keep it: it is the skill's directory in the
sandbox, `/mnt/skills/<name>/`. A session pins each skill its agent lists at the version it resolves when the
session starts (`Skills.pin`); deleting that version later removes its bundle, so a session that has not placed
it yet fails to.

Every method is synchronous (SQLite and the blob store block): the gateway calls them through `KnowledgeDB.run`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from corral.blobs import BlobStore
from corral.contract.knowledge import SkillPin
from corral.errors import InvalidSkillBundle, SkillConflict, SkillNotFound
from corral.knowledge_db import KnowledgeDB
from corral.names import SKILL_ID_PREFIX, SKILL_VERSION_ID_PREFIX
from corral.record_ids import new_record_id
from corral.skill_bundles import MAX_DISPLAY_NAME_CHARS, bundle_tar, skill_bundle, tar_files

BundleFiles = list[tuple[str, bytes]]
"""A folder's files as (path, bytes)."""
LATEST = "latest"
SOURCE_CUSTOM = "custom"

_TABLES = (
    """CREATE TABLE IF NOT EXISTS skills (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        workspace TEXT NOT NULL,
        display_name TEXT NOT NULL,
        name TEXT NOT NULL,
        latest_version TEXT NOT NULL,
        source TEXT NOT NULL DEFAULT 'custom',
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS skills_by_workspace ON skills (workspace, seq)",
    """CREATE TABLE IF NOT EXISTS skill_versions (
        seq INTEGER PRIMARY KEY AUTOINCREMENT,
        id TEXT NOT NULL UNIQUE,
        skill_id TEXT NOT NULL REFERENCES skills (id) ON DELETE CASCADE,
        name TEXT NOT NULL,
        description TEXT NOT NULL,
        blob_key TEXT NOT NULL,
        size_bytes INTEGER NOT NULL,
        file_count INTEGER NOT NULL,
        created_at TEXT NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS skill_versions_by_skill ON skill_versions (skill_id, seq)",
)


@dataclass(frozen=True)
class Skill:
    id: str
    workspace: str
    display_name: str
    name: str
    latest_version: str
    source: str
    created_at: datetime
    updated_at: datetime
    seq: int


@dataclass(frozen=True)
class SkillVersion:
    id: str
    skill_id: str
    name: str
    description: str
    blob_key: str
    size_bytes: int
    file_count: int
    created_at: datetime
    seq: int


def _now() -> str:
    return datetime.now(UTC).isoformat()


def _skill(row: sqlite3.Row) -> Skill:
    return Skill(row["id"], row["workspace"], row["display_name"], row["name"], row["latest_version"],
                 row["source"], datetime.fromisoformat(row["created_at"]), datetime.fromisoformat(row["updated_at"]),
                 row["seq"])  # fmt: skip


def _version(row: sqlite3.Row) -> SkillVersion:
    return SkillVersion(row["id"], row["skill_id"], row["name"], row["description"], row["blob_key"],
                        row["size_bytes"], row["file_count"], datetime.fromisoformat(row["created_at"]),
                        row["seq"])  # fmt: skip


def display_name_problem(display_name: object) -> str | None:
    if not isinstance(display_name, str) or not display_name.strip() or len(display_name) > MAX_DISPLAY_NAME_CHARS:
        return f"display_name must be text of 1 to {MAX_DISPLAY_NAME_CHARS} characters"
    if "\n" in display_name or "\r" in display_name:
        return "display_name must be a single line"
    return None


class Skills:
    """The skills of every workspace, over one knowledge database and one blob store."""

    def __init__(self, db: KnowledgeDB, blobs: BlobStore) -> None:
        self.db, self.blobs = db, blobs
        db.migrate("skills", _TABLES)

    # ---- skills -------------------------------------------------------------------------------------------------

    def create(self, workspace: str, files: Sequence[tuple[str, bytes]],
               display_name: str | None = None) -> tuple[Skill, SkillVersion]:  # fmt: skip
        """A new skill of `workspace` with the uploaded folder as its first version."""
        if display_name is not None and (problem := display_name_problem(display_name)) is not None:
            raise InvalidSkillBundle(problem)
        bundle = skill_bundle(files)
        skill_id = new_record_id(SKILL_ID_PREFIX.removesuffix("_"))
        version_id, blob_key = self._store(skill_id, bundle_tar(bundle))
        now = _now()
        with self.db.write() as db:
            db.execute(
                "INSERT INTO skills (id, workspace, display_name, name, latest_version, source, created_at, "
                "updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (skill_id, workspace, display_name or bundle.name, bundle.name, version_id, SOURCE_CUSTOM, now, now),
            )
            self._insert_version(db, version_id, skill_id, bundle.name, bundle.description, blob_key,
                                 bundle.size_bytes, len(bundle.files), now)  # fmt: skip
        return self.get(workspace, skill_id), self.version(workspace, skill_id, version_id)

    def get(self, workspace: str, skill_id: str) -> Skill:
        with self.db.read() as db:
            return self._get(db, workspace, skill_id)

    def list_skills(self, workspace: str, limit: int, after: int | None = None,
                    source: str | None = None) -> tuple[list[Skill], int | None]:  # fmt: skip
        """A page of `workspace`'s skills, newest first, and the `after` of the next page (None: the last)."""
        query = "SELECT * FROM skills WHERE workspace = ? AND seq < ?"
        args: list[object] = [workspace, after if after is not None else 2**63 - 1]
        if source is not None:
            query, args = query + " AND source = ?", [*args, source]
        with self.db.read() as db:
            rows = db.execute(query + " ORDER BY seq DESC LIMIT ?", (*args, limit + 1)).fetchall()
        skills = [_skill(row) for row in rows[:limit]]
        return skills, (skills[-1].seq if len(rows) > limit else None)

    def delete(self, workspace: str, skill_id: str) -> None:
        """The skill and every version of it, metadata and bundles."""
        with self.db.write() as db:
            self._get(db, workspace, skill_id)
            db.execute("DELETE FROM skill_versions WHERE skill_id = ?", (skill_id,))
            db.execute("DELETE FROM skills WHERE id = ?", (skill_id,))
        self.blobs.delete_prefix(f"skills/{skill_id}/")

    # ---- versions -----------------------------------------------------------------------------------------------

    def add_version(self, workspace: str, skill_id: str, files: Sequence[tuple[str, bytes]]) -> SkillVersion:
        """A new version of the skill from the uploaded folder, which becomes `latest`; its name must be the
        skill's."""
        skill = self.get(workspace, skill_id)
        bundle = skill_bundle(files)
        if bundle.name != skill.name:
            raise InvalidSkillBundle(f"SKILL.md's name is {bundle.name!r}, but skill {skill_id} is {skill.name!r}: "
                                     "a skill's name never changes")  # fmt: skip
        version_id, blob_key = self._store(skill_id, bundle_tar(bundle))
        now = _now()
        try:
            with self.db.write() as db:
                self._get(db, workspace, skill_id)  # deleted meanwhile: nothing is written
                self._insert_version(db, version_id, skill_id, bundle.name, bundle.description, blob_key,
                                     bundle.size_bytes, len(bundle.files), now)  # fmt: skip
                db.execute("UPDATE skills SET latest_version = ?, updated_at = ? WHERE id = ?",
                           (version_id, now, skill_id))  # fmt: skip
        except SkillNotFound:
            self.blobs.delete_prefix(f"skills/{skill_id}/{version_id}/")
            raise
        return self.version(workspace, skill_id, version_id)

    def version(self, workspace: str, skill_id: str, version: str | None = None) -> SkillVersion:
        """One version of the skill: its id, or `latest` (or None) for the newest."""
        with self.db.read() as db:
            return self._version(db, workspace, skill_id, version)

    def versions(self, workspace: str, skill_id: str, limit: int,
                 after: int | None = None) -> tuple[list[SkillVersion], int | None]:  # fmt: skip
        """A page of the skill's versions, newest first, and the `after` of the next page (None: the last)."""
        with self.db.read() as db:
            self._get(db, workspace, skill_id)
            rows = db.execute(
                "SELECT * FROM skill_versions WHERE skill_id = ? AND seq < ? ORDER BY seq DESC LIMIT ?",
                (skill_id, after if after is not None else 2**63 - 1, limit + 1),
            ).fetchall()
        versions = [_version(row) for row in rows[:limit]]
        return versions, (versions[-1].seq if len(rows) > limit else None)

    def delete_version(self, workspace: str, skill_id: str, version: str) -> SkillVersion:
        """One version and its bundle; the newest that stays becomes `latest`. The only version stays: a skill
        always has one (`SkillConflict`)."""
        with self.db.write() as db:
            found = self._version(db, workspace, skill_id, version)
            others = db.execute("SELECT id FROM skill_versions WHERE skill_id = ? AND id != ? ORDER BY seq DESC",
                                (skill_id, found.id)).fetchall()  # fmt: skip
            if not others:
                raise SkillConflict(f"version {found.id} is the only version of skill {skill_id}: a skill always "
                                    "has one; delete the skill instead")  # fmt: skip
            db.execute("DELETE FROM skill_versions WHERE id = ?", (found.id,))
            db.execute("UPDATE skills SET latest_version = ?, updated_at = ? WHERE id = ?",
                       (others[0]["id"], _now(), skill_id))  # fmt: skip
        self.blobs.delete_prefix(f"skills/{skill_id}/{found.id}/")
        return found

    def content(self, workspace: str, skill_id: str, version: str | None = None) -> tuple[SkillVersion, BundleFiles]:
        """The version and its files, by path under the skill's folder (`SKILL.md` first among them)."""
        found = self.version(workspace, skill_id, version)
        return found, tar_files(self.blobs.get(found.blob_key))

    def pin(self, workspace: str, skill_id: str, version: str | None) -> SkillPin:
        """What a session carries of one skill its agent lists: the version resolved (never `latest`), the name and
        description its system prompt shows, and where its bundle is. `SkillNotFound` names what is missing."""
        found = self.version(workspace, skill_id, version)
        return SkillPin(type="custom", skill_id=skill_id, version=found.id, name=found.name,
                        description=found.description, blob_key=found.blob_key)  # fmt: skip

    # ---- inside -------------------------------------------------------------------------------------------------

    def _store(self, skill_id: str, archive: bytes) -> tuple[str, str]:
        """A new version id and the blob key its archive is written to, before any row names it."""
        version_id = new_record_id(SKILL_VERSION_ID_PREFIX.removesuffix("_"))
        blob_key = f"skills/{skill_id}/{version_id}/bundle.tar"
        self.blobs.put(blob_key, archive)
        return version_id, blob_key

    @staticmethod
    def _insert_version(db: sqlite3.Connection, version_id: str, skill_id: str, name: str, description: str,
                        blob_key: str, size_bytes: int, file_count: int, now: str) -> None:  # fmt: skip
        db.execute(
            "INSERT INTO skill_versions (id, skill_id, name, description, blob_key, size_bytes, file_count, "
            "created_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (version_id, skill_id, name, description, blob_key, size_bytes, file_count, now),
        )

    @staticmethod
    def _get(db: sqlite3.Connection, workspace: str, skill_id: str) -> Skill:
        row = db.execute("SELECT * FROM skills WHERE id = ? AND workspace = ?", (skill_id, workspace)).fetchone()
        if row is None:
            raise SkillNotFound("skill", skill_id, f"skill {skill_id!r} was not found")
        return _skill(row)

    def _version(self, db: sqlite3.Connection, workspace: str, skill_id: str, version: str | None) -> SkillVersion:
        skill = self._get(db, workspace, skill_id)
        wanted = skill.latest_version if version in (None, LATEST) else version
        row = db.execute("SELECT * FROM skill_versions WHERE id = ? AND skill_id = ?", (wanted, skill_id)).fetchone()
        if row is None:
            raise SkillNotFound("skill version", str(wanted), f"version {wanted!r} of skill {skill_id} was not found")
        return _version(row)
