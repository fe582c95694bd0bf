"""`corral memory`: memory stores from the operator's side, read and written through the library
(corral.memory_stores) on the local knowledge database (`knowledge.db` in the state dir, or `CORRAL_KNOWLEDGE_DB`),
the one the gateway and the workers of `corral up` use. A store is named by its id (`memstore_…`), which is unique
across workspaces; `--workspace` checks it is that workspace's.

What this CLI writes (`put`, `rm`) is attributed to a `user_actor` whose `user_id` is the operating system's
login name of whoever ran it (`getpass.getuser()`), so the history tells a person's edits from the API's and the
sessions'.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, TypeVar

import typer

from cli.app import app
from cli.context import CliError, Settings, fail, settings_of
from corral.memory_records import MemoryNotFound, Page, actor_id

if TYPE_CHECKING:
    from corral.memory_records import MemoryPrefix, MemoryRecord, MemoryStoreRecord, MemoryVersionRecord
    from corral.memory_stores import MemoryStores

T = TypeVar("T")

memory_app = typer.Typer(name="memory", help="Memory stores: list, read, write and audit memories.",
                         no_args_is_help=True)  # fmt: skip
app.add_typer(memory_app, rich_help_panel="The gateway")

StoreId = Annotated[str, typer.Argument(metavar="STORE", help="The store's id (memstore_…).", show_default=False)]
MemoryPath = Annotated[str, typer.Argument(metavar="PATH", help="The memory's path, like /notes/todo.md.")]
WorkspaceOption = Annotated[
    str | None, typer.Option(help="The store's workspace (checked when given).", show_default=False)
]


def _library(settings: Settings) -> MemoryStores:
    import os

    from corral.knowledge_db import knowledge_db_path, open_knowledge_db
    from corral.memory_stores import MemoryStores
    from corral.names import ENV_STATE_DIR

    path = knowledge_db_path({**os.environ, ENV_STATE_DIR: str(settings.state_dir)})
    return MemoryStores(open_knowledge_db(path))


def _store(stores: MemoryStores, store_id: str, workspace: str | None) -> MemoryStoreRecord:
    from corral.memory_records import MemoryStoreNotFound

    try:
        store = stores.locate_store(store_id)
    except MemoryStoreNotFound:
        store = None
    if store is None or workspace not in (None, store.workspace):
        where = f" in workspace {workspace}" if workspace else ""
        raise CliError(f"no memory store {store_id}{where}", hint="`corral memory stores` lists them")
    return store


def _me() -> dict[str, str]:
    import getpass

    from corral.memory_records import user_actor

    return user_actor(getpass.getuser())


def _refused(error: Exception) -> CliError:
    """The library's refusals as the CLI's errors: a conflict or a bad value is the user's to fix (exit 2)."""
    from corral.memory_records import MemoryObjectNotFound

    return CliError(str(error), exit_code=1 if isinstance(error, MemoryObjectNotFound) else 2)


def _guarded(settings: Settings, action: Callable[[], T]) -> T:
    """`action()`, with a `CliError` or a refusal of the library printed as a message and an exit code."""
    from corral.memory_records import MemoryStoreError

    try:
        return action()
    except CliError as error:
        fail(settings, error)
    except MemoryStoreError as error:
        fail(settings, _refused(error))


@memory_app.command("stores")
def stores_command(
    ctx: typer.Context,
    workspace: Annotated[str | None, typer.Option(help="Only this workspace's stores.")] = None,
    archived: Annotated[bool, typer.Option("--archived", help="Include archived stores.")] = False,
) -> None:
    """List memory stores, newest first (every workspace's unless --workspace)."""
    settings = settings_of(ctx)
    stores = _library(settings)
    listed = _all_pages(lambda page: stores.list_stores(workspace, include_archived=archived, limit=100, page=page))
    if not listed:
        settings.human.print("no memory stores")
        return
    from rich.table import Table
    from rich.text import Text

    from cli.render import safe

    table = Table()
    for column in ("id", "name", "workspace", "created", "archived"):
        table.add_column(column, no_wrap=column == "id")
    for store in listed:
        table.add_row(Text(store.id), Text(safe(store.name)), Text(store.workspace), store.created_at,
                      store.archived_at or "—")  # fmt: skip
    settings.out.print(table)


@memory_app.command("create-store")
def create_store(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="The store's name (1 to 255 characters).")],
    workspace: Annotated[str, typer.Option(help="The workspace the store belongs to.")],
    description: Annotated[str, typer.Option(help="What the store holds (agents read it).")] = "",
) -> None:
    """Make a memory store and print its id."""
    settings = settings_of(ctx)
    store = _guarded(settings, lambda: _library(settings).create_store(workspace, name, description))
    print(store.id, flush=True)


@memory_app.command("ls")
def ls(
    ctx: typer.Context,
    store_id: StoreId,
    prefix: Annotated[str, typer.Option(help="Only memories under this directory (ends with /).")] = "/",
    depth: Annotated[int, typer.Option(help="0: every memory; N: N levels, deeper ones as a directory.")] = 0,
    workspace: WorkspaceOption = None,
) -> None:
    """List a store's memories in path order: size in bytes, the start of the SHA-256 and the path; a directory
    that `--depth` rolls up ends with /."""
    from corral.memory_records import MemoryPrefix

    settings = settings_of(ctx)
    stores = _library(settings)

    def listing() -> list[MemoryRecord | MemoryPrefix]:
        store = _store(stores, store_id, workspace)
        return _all_pages(lambda page: stores.list_memories(store.workspace, store.id, prefix, depth, 100, page))

    from cli.render import safe

    for item in _guarded(settings, listing):
        if isinstance(item, MemoryPrefix):
            line = f"{'-':>8}  {'':12}  {safe(item.path)}"
        else:
            line = f"{item.content_size_bytes:>8}  {item.content_sha256[:12]}  {safe(item.path)}"
        settings.out.print(line, markup=False, highlight=False, soft_wrap=True)


@memory_app.command("cat")
def cat(ctx: typer.Context, store_id: StoreId, path: MemoryPath, workspace: WorkspaceOption = None) -> None:
    """Print a memory's content as it is (control characters escaped when stdout is a terminal)."""
    settings = settings_of(ctx)
    stores = _library(settings)

    def read() -> MemoryRecord:
        store = _store(stores, store_id, workspace)
        return stores.get_memory(store.workspace, store.id, stores.find_memory_id(store.workspace, store.id, path))

    content = _guarded(settings, read).content or ""
    if settings.stdout_is_terminal:
        from cli.render import safe

        content = safe(content)
    sys.stdout.write(content)
    sys.stdout.flush()


@memory_app.command("put")
def put(
    ctx: typer.Context,
    store_id: StoreId,
    path: MemoryPath,
    source: Annotated[Path | None, typer.Option("--file", help="Read the content from this file, not stdin.")] = None,
    workspace: WorkspaceOption = None,
) -> None:
    """Write a memory's content (from stdin, or --file): a new memory at a free path, else a new version of the one
    there. Attributed to you (your login name) in the history."""
    settings = settings_of(ctx)
    stores = _library(settings)
    content = source.read_text(encoding="utf-8") if source is not None else sys.stdin.read()

    def write() -> str:
        store = _store(stores, store_id, workspace)
        try:
            memory_id = stores.find_memory_id(store.workspace, store.id, path)
            memory = stores.get_memory(store.workspace, store.id, memory_id)
        except MemoryNotFound:
            made = stores.create_memory(store.workspace, store.id, path, content, _me())
            return f"created {made.path} ({made.id}, version {made.memory_version_id})"
        written = stores.update_memory(store.workspace, store.id, memory.id, _me(), content,
                                       expected_sha256=memory.content_sha256)  # fmt: skip
        return f"wrote {written.path} ({written.id}, version {written.memory_version_id})"

    settings.human.print(_guarded(settings, write), markup=False, highlight=False)


@memory_app.command("rm")
def rm(ctx: typer.Context, store_id: StoreId, path: MemoryPath, workspace: WorkspaceOption = None) -> None:
    """Delete a memory (its history stays, with a `deleted` version attributed to you)."""
    settings = settings_of(ctx)
    stores = _library(settings)

    def delete() -> str:
        store = _store(stores, store_id, workspace)
        memory = stores.get_memory(store.workspace, store.id, stores.find_memory_id(store.workspace, store.id, path))
        stores.delete_memory(store.workspace, store.id, memory.id, _me(), expected_sha256=memory.content_sha256)
        return f"deleted {memory.path} ({memory.id})"

    settings.human.print(_guarded(settings, delete), markup=False, highlight=False)


@memory_app.command("history")
def history(ctx: typer.Context, store_id: StoreId, path: MemoryPath, workspace: WorkspaceOption = None) -> None:
    """A memory's versions, newest first: when, what (created, modified, deleted), who, its path then and its
    size. A memory deleted since is found by the path it had."""
    settings = settings_of(ctx)
    stores = _library(settings)

    def versions() -> list[MemoryVersionRecord]:
        store = _store(stores, store_id, workspace)
        memory_id = stores.find_memory_id(store.workspace, store.id, path)
        return _all_pages(lambda page: stores.list_versions(store.workspace, store.id, memory_id=memory_id,
                                                            limit=100, page=page))  # fmt: skip

    from rich.table import Table
    from rich.text import Text

    from cli.render import safe

    table = Table()
    for column in ("version", "when", "operation", "by", "path", "bytes"):
        table.add_column(column, no_wrap=column in ("version", "when"))
    for version in _guarded(settings, versions):
        actor = version.created_by or {}
        who = f"{actor.get('type', '?').removesuffix('_actor')} {actor_id(actor) if actor else '—'}"
        path_then = "(redacted)" if version.redacted_at else version.path or ""
        size = "—" if version.content_size_bytes is None else str(version.content_size_bytes)
        table.add_row(Text(version.id), version.created_at, version.operation, Text(safe(who)),
                      Text(safe(path_then)), size)  # fmt: skip
    settings.out.print(table)


def _all_pages(read: Callable[[str | None], Page[T]]) -> list[T]:
    items: list[T] = []
    page: str | None = None
    while True:
        found = read(page)
        items += found.data
        if found.next_page is None:
            return items
        page = found.next_page
