"""An example hand: a tiny notes service, served by its own worker on its own task queue.

Any process that serves the `execute` activity on a task queue is a hand. This one keeps notes in a SQLite
file; a real one might drive a browser, a device or an internal service. Run it with

    python examples/hands/notes_hand.py --task-queue notes-hand --db notes.sqlite

and give an agent its tools (the harness routes calls by `task_queue`; nothing in corral changes):

    {"type": "hand", "name": "save_note", "task_queue": "notes-hand",
     "description": "Save a note", "input_schema": {"type": "object",
       "properties": {"title": {"type": "string"}, "text": {"type": "string"}}, "required": ["title", "text"]}}
    {"type": "hand", "name": "list_notes", "task_queue": "notes-hand",
     "description": "List saved notes", "input_schema": {"type": "object", "properties": {}}}
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
from pathlib import Path
from typing import Any

from temporalio.worker import Worker

from corral.hands import make_execute_activity
from corral.temporal import connect
from workers.run import run_until_stopped, setup_logging


class Notes:
    """The service behind the hand: plain Python, no Temporal in it."""

    def __init__(self, path: Path) -> None:
        self._db = sqlite3.connect(path, check_same_thread=False)
        self._db.execute("CREATE TABLE IF NOT EXISTS notes (title TEXT PRIMARY KEY, text TEXT NOT NULL)")

    def save_note(self, input: dict[str, Any]) -> str:
        title, text = str(input.get("title", "")).strip(), str(input.get("text", ""))
        if not title:
            raise ValueError("title must not be empty")
        with self._db:
            self._db.execute("INSERT OR REPLACE INTO notes (title, text) VALUES (?, ?)", (title, text))
        return f"saved note {title!r}"

    def list_notes(self, input: dict[str, Any]) -> str:
        rows = self._db.execute("SELECT title, text FROM notes ORDER BY title").fetchall()
        return "\n".join(f"{title}: {text}" for title, text in rows) or "no notes yet"


async def main(args: argparse.Namespace) -> None:
    notes = Notes(Path(args.db))
    client = await connect(args.address)
    execute = make_execute_activity({"save_note": notes.save_note, "list_notes": notes.list_notes})
    await run_until_stopped([Worker(client, task_queue=args.task_queue, activities=[execute])])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="An example corral hand: a notes service.")
    parser.add_argument("--task-queue", default="notes-hand")
    parser.add_argument("--db", default="notes.sqlite")
    parser.add_argument("--address", default=None, help="Temporal address (default: CORRAL_TEMPORAL_ADDRESS)")
    setup_logging()
    asyncio.run(main(parser.parse_args()))
