"""A `user.define_outcome` whose rubric is a file (`{"type": "file", "file_id"}`), resolved to the file's text
before the event reaches the session, as upstream stores it: the session and its grader only ever see text
rubrics. Done for `events.send` and for a session's `initial_events`.

The file must be the caller's workspace's (404 otherwise, as for a missing one), not expired, UTF-8 text, and at most
`MAX_RUBRIC_CHARS` bytes, the bound of a text rubric (a 400 names the problem).
"""

from __future__ import annotations

from typing import Any

from corral.contract.user_events import MAX_RUBRIC_CHARS
from corral.files import FileStore
from gateway.errors import invalid
from gateway.files import own_file


async def resolve_file_rubrics(files: FileStore, workspace: str, events: Any, field: str) -> Any:
    """`events` with each file rubric replaced by a text rubric of the file's content (`events` itself when it is
    not a list: the usual checks refuse it)."""
    if not isinstance(events, list):
        return events
    return [await _resolved(files, workspace, event, f"{field}[{index}]") for index, event in enumerate(events)]


async def _resolved(files: FileStore, workspace: str, event: Any, where: str) -> Any:
    if not isinstance(event, dict) or event.get("type") != "user.define_outcome":
        return event
    rubric = event.get("rubric")
    if not isinstance(rubric, dict) or rubric.get("type") != "file":
        return event
    unknown = sorted(set(rubric) - {"type", "file_id"})
    if unknown:
        raise invalid(f"{where}.rubric: unknown field(s) of a file rubric: {', '.join(unknown)}")
    record = await own_file(files, workspace, rubric.get("file_id"), f"{where}.rubric.file_id")
    if record.size_bytes > MAX_RUBRIC_CHARS:
        raise invalid(f"{where}.rubric.file_id: file {record.id} is {record.size_bytes} bytes; a rubric may be at "
                      f"most {MAX_RUBRIC_CHARS} bytes")  # fmt: skip
    data = await files.db.run(files.read, record)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise invalid(f"{where}.rubric.file_id: file {record.id} is not UTF-8 text (byte {exc.start} does not "
                      "decode), so it cannot be a rubric") from exc  # fmt: skip
    if not text.strip():
        raise invalid(f"{where}.rubric.file_id: file {record.id} is empty; a rubric needs text")
    return {**event, "rubric": {"type": "text", "content": text}}
