"""`corral files`: a workspace's files from the operator's side (corral.files), on this machine's knowledge database
and blob store (those `corral up` gives its gateway and workers), so they are the files the API serves.

`upload` with stdout captured prints the new file's id alone, so `FILE=$(corral files upload notes.txt)` works. An
upload with `--expires-in` starts the file's expiry timer on Temporal, as the API does.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from cli.app import app, client_of
from cli.context import CliError, Settings, fail, run, settings_of

if TYPE_CHECKING:
    from corral.files import FileRecord, FileStore

files_app = typer.Typer(name="files", help="Files of a workspace: upload, list, read, download, remove.",
                        no_args_is_help=True)  # fmt: skip
app.add_typer(files_app, rich_help_panel="The gateway")

DEFAULT_WORKSPACE = "default"
FileId = Annotated[str, typer.Argument(metavar="ID", help="The file's id (file_…).", show_default=False)]
WorkspaceOption = Annotated[str, typer.Option(help="The workspace whose files these are.")]


@contextmanager
def _reported(settings: Settings) -> Iterator[None]:
    """A refusal inside the block as the CLI's one-line error and exit code, never a traceback."""
    try:
        yield
    except CliError as error:
        fail(settings, error)


def _store(settings: Settings) -> FileStore:
    """The file store of this machine's stack: its knowledge database and blob store."""
    from corral.blobs import open_blob_store
    from corral.files import FileStore
    from corral.knowledge_db import open_knowledge_db
    from corral.names import ENV_KNOWLEDGE_DB

    named = os.environ.get(ENV_KNOWLEDGE_DB)
    db = open_knowledge_db(Path(named) if named else settings.state_dir / "knowledge.db")
    try:
        return FileStore(db, open_blob_store())
    except ValueError as exc:  # a quota or size limit that does not parse
        raise CliError(str(exc), exit_code=2) from exc


def _own(store: FileStore, workspace: str, file_id: str) -> FileRecord:
    from corral.files import FileExpired, FileNotFound

    try:
        return store.get(workspace, file_id)
    except FileNotFound:
        raise CliError(f"no file {file_id} in workspace {workspace}", hint="`corral files ls` lists them") from None
    except FileExpired as exc:
        raise CliError(str(exc)) from None


@files_app.command("upload")
def upload(
    ctx: typer.Context,
    path: Annotated[Path, typer.Argument(help="The file to upload.", show_default=False)],
    expires_in: Annotated[
        int | None,
        typer.Option(
            "--expires-in", metavar="SECONDS", help="Remove the file this long after the upload (3600 to 7776000)."
        ),
    ] = None,
    workspace: WorkspaceOption = DEFAULT_WORKSPACE,
) -> None:
    """Upload a file and print its id."""
    from datetime import UTC, datetime, timedelta

    from corral.files import MAX_EXPIRES_IN_SECONDS, MIN_EXPIRES_IN_SECONDS, FileError

    settings = settings_of(ctx)
    with _reported(settings):
        if expires_in is not None and not MIN_EXPIRES_IN_SECONDS <= expires_in <= MAX_EXPIRES_IN_SECONDS:
            raise CliError(f"--expires-in must be from {MIN_EXPIRES_IN_SECONDS} to {MAX_EXPIRES_IN_SECONDS} seconds",
                           exit_code=2)  # fmt: skip
        try:
            data = path.read_bytes()
        except OSError as exc:
            raise CliError(f"cannot read {path}: {exc.strerror}", exit_code=2) from exc
        store = _store(settings)
        expires_at = datetime.now(UTC) + timedelta(seconds=expires_in) if expires_in is not None else None
        try:
            record = store.create(workspace, path.name, data, expires_at=expires_at)
        except FileError as exc:
            raise CliError(str(exc)) from exc
        if record.expires_at is not None:
            from corral.file_expiry import schedule_file_expiry

            async def timer() -> None:
                await schedule_file_expiry(await client_of(settings), record)

            run(settings, timer())
        if settings.stdout_is_terminal:
            settings.out.print(f"{record.id}  {record.filename}  {record.size_bytes} bytes  {record.mime_type}")
        else:
            print(record.id, flush=True)


@files_app.command("ls")
def ls(
    ctx: typer.Context,
    workspace: WorkspaceOption = DEFAULT_WORKSPACE,
    session: Annotated[
        str | None, typer.Option(help="Only the files of this session's scope: what its agent left in its outputs.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines, one file per line (the API's view).")] = False,
) -> None:
    """List the workspace's files, newest first (expired ones are not shown)."""
    import json

    from rich.table import Table
    from rich.text import Text

    from cli.render import local_time, safe, safe_json_line

    settings = settings_of(ctx)
    with _reported(settings):
        store = _store(settings)
        records: list[FileRecord] = []
        before: int | None = None
        while True:
            page, before = store.list(workspace, limit=1000, before=before, scope_session_id=session)
            records += page
            if before is None:
                break
        if as_json:
            for record in records:
                print(safe_json_line(json.dumps(record.view())), flush=False)
            return
        if not records:
            settings.out.print(f"no files in workspace {workspace}" + (f" of session {session}" if session else ""))
            return
        table = Table()
        for column in ("id", "filename", "bytes", "type", "created", "expires"):
            table.add_column(column, no_wrap=column == "id")
        for record in records:
            name, kind = Text(safe(record.filename)), Text(safe(record.mime_type))
            table.add_row(Text(record.id), name, str(record.size_bytes), kind, local_time(record.created_at),
                          local_time(record.expires_at))  # fmt: skip
        settings.out.print(table)


@files_app.command("info")
def info(ctx: typer.Context, file_id: FileId, workspace: WorkspaceOption = DEFAULT_WORKSPACE) -> None:
    """Show a file's metadata (the API's `file` object) as JSON."""
    import json

    from cli.render import safe_json_line

    settings = settings_of(ctx)
    with _reported(settings):
        record = _own(_store(settings), workspace, file_id)
        print(safe_json_line(json.dumps(record.view(), indent=2)), flush=True)


@files_app.command("download")
def download(
    ctx: typer.Context,
    file_id: FileId,
    output: Annotated[
        Path | None,
        typer.Option("-o", "--output", help="Where to write it (`-` for stdout; default: its filename here)."),
    ] = None,
    workspace: WorkspaceOption = DEFAULT_WORKSPACE,
) -> None:
    """Write a file's bytes to a path (or stdout)."""
    settings = settings_of(ctx)
    with _reported(settings):
        store = _store(settings)
        record = _own(store, workspace, file_id)
        data = store.read(record)
        if output is not None and str(output) == "-":
            sys.stdout.buffer.write(data)
            sys.stdout.buffer.flush()
            return
        name = Path(record.filename).name
        target = output or Path(name if name not in ("", ".", "..") else record.id)
        try:
            target.write_bytes(data)
        except OSError as exc:
            raise CliError(f"cannot write {target}: {exc.strerror}", exit_code=2) from exc
        settings.human.print(f"wrote {record.size_bytes} bytes to {target}")


@files_app.command("rm")
def rm(ctx: typer.Context, file_id: FileId, workspace: WorkspaceOption = DEFAULT_WORKSPACE) -> None:
    """Remove a file (its bytes go too, unless another file has the same bytes)."""
    from corral.files import FileNotFound

    settings = settings_of(ctx)
    with _reported(settings):
        try:
            _store(settings).delete(workspace, file_id)
        except FileNotFound:
            raise CliError(f"no file {file_id} in workspace {workspace}") from None
        settings.human.print(f"removed {file_id}")
