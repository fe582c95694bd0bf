"""A dream's write (workflows/dreams.py): the store it dreamed, written whole in one transaction, so a store is never
half-written. Into a new store (`create_new`), or over the input store (`update_existing`: what the dream left out
is deleted); every memory written is a version attributed to the dream's session. Both are idempotent, since the
activity that calls them may be retried: the new store is found again by the dream's id in its metadata, and an
existing store already as dreamed gets no version."""

from __future__ import annotations

import json
import sqlite3
from typing import Any

from corral.memory_paths import check_content, check_path
from corral.memory_records import Actor, now
from corral.memory_stores import MemoryStores
from corral.memory_writes import read_memory, refuse_archived, write
from corral.names import MEMORY_STORE_ID_PREFIX
from corral.record_ids import new_record_id

MAX_STORE_NAME = 255


def _checked(contents: dict[str, str]) -> dict[str, str]:
    return {check_path(path): check_content(content) for path, content in contents.items()}


def _write_all(connection: sqlite3.Connection, store_id: str, contents: dict[str, str], actor: Actor) -> int:
    """Make the store hold exactly `contents` (path -> text); how many memories were written."""
    current = {row["path"]: row["id"] for row in
               connection.execute("SELECT id, path FROM memories WHERE store_id = ?", (store_id,))}  # fmt: skip
    written = 0
    for path, content in sorted(contents.items()):
        memory = read_memory(connection, store_id, current[path], full=True) if path in current else None
        if memory is not None and memory.content == content:
            continue
        write(connection, store_id, memory, path, content, actor)
        written += 1
    for path in sorted(set(current) - set(contents)):
        write(connection, store_id, read_memory(connection, store_id, current[path], full=True), path, None, actor)
        written += 1
    return written


def replace_contents(
    stores: MemoryStores, workspace: str, store_id: str, contents: dict[str, str], actor: Actor
) -> int:
    """`update_existing`: the store holds exactly `contents` afterwards; how many memories changed."""
    checked = _checked(contents)
    with stores.db.write() as connection:
        store = MemoryStores.store_in(connection, workspace, store_id)
        refuse_archived(store, "dream over")
        return _write_all(connection, store.id, checked, actor)


def create_with_contents(
    stores: MemoryStores, workspace: str, name: str, contents: dict[str, str], actor: Actor, dream_id: str
) -> tuple[str, int]:
    """`create_new`: a new store named `name` holding `contents` (the one this dream made already, on a retry);
    its id and how many memories it was given."""
    checked = _checked(contents)
    metadata: dict[str, Any] = {"dream_id": dream_id}
    with stores.db.write() as connection:
        found = connection.execute(
            "SELECT id FROM memory_stores WHERE workspace = ? AND json_extract(metadata, '$.dream_id') = ?",
            (workspace, dream_id),
        ).fetchone()
        if found is not None:
            return str(found["id"]), len(checked)
        store_id, moment = new_record_id(MEMORY_STORE_ID_PREFIX.removesuffix("_")), now()
        connection.execute(
            "INSERT INTO memory_stores VALUES (?, ?, ?, ?, ?, ?, ?, NULL)",
            (store_id, workspace, name[:MAX_STORE_NAME], "", json.dumps(metadata), moment, moment),
        )
        return store_id, _write_all(connection, store_id, checked, actor)
