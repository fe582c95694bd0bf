"""The `corral` application: the typer app, its global options, and what every command module shares.

The commands live in `stack_commands.py` (up, down, status, demo, vault), `session_commands.py` (start, send,
interrupt, events, tail, ls), `log_commands.py` (context, fork, export, output), `thread_commands.py` (threads),
`outcome_commands.py` (outcomes), `run_commands.py` (runs), `api_keys.py` (api-key), `environment_commands.py`
(environment: self-hosted environments' keys), `skill_commands.py` (skills), `memory_commands.py` (memory: memory
stores), `dream_commands.py` (dreams), `hands.py` (hand) and `harness.py` (harness check); `main.py` puts them
together.
"""

from __future__ import annotations

import contextlib
import os
import sys
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, get_args

import typer

from cli.context import Settings
from cli.stack import StatePaths, follow_with_stream_token, read_stream_token
from corral.names import (
    ENV_BLOB_STORE,
    ENV_KNOWLEDGE_DB,
    ENV_STATE_DIR,
    ENV_TEMPORAL_ADDRESS,
    ENV_TEMPORAL_NAMESPACE,
    SessionStatus,
)

if TYPE_CHECKING:
    from temporalio.client import Client


class _CorralApp(typer.Typer):
    """The `corral` entry point; on a normal exit it skips interpreter teardown.

    The Temporal client's Rust threads can abort a finishing interpreter ("Fatal Python error: PyGILState_Release
    ... finalizing", temporalio/sdk-python#300), which turns a successful command into exit code 134. Everything is
    flushed first; nothing corral needs runs at teardown. Errors that are not a SystemExit still get typer's report.
    """

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            super().__call__(*args, **kwargs)
            code = 0
        except SystemExit as stop:
            if stop.code is None or isinstance(stop.code, int):
                code = stop.code or 0
            else:
                print(stop.code, file=sys.stderr)
                code = 1
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):  # A closed pipe (`corral events | head`) is fine.
                stream.flush()
        os._exit(code)


app = _CorralApp(
    name="corral",
    help="Run long-lived AI agents on Temporal: start the local stack, start sessions, send, read and follow them.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_show_locals=False,  # Locals may hold environment values; never print them.
)


if TYPE_CHECKING:

    class SessionStatusFilter(StrEnum):
        """The values of the CorralStatus search attribute (`SessionStatus`): typer offers an enum's as choices."""

else:  # built from the Literal, so that the statuses are spelled once (corral/names.py)
    SessionStatusFilter = StrEnum("SessionStatusFilter", [(status, status) for status in get_args(SessionStatus)])


@app.callback()
def main(
    ctx: typer.Context,
    address: Annotated[
        str | None,
        typer.Option(
            envvar=ENV_TEMPORAL_ADDRESS,
            help="Temporal frontend host:port. Default: the stack `corral up` started in --state-dir, "
            "else 127.0.0.1:7233.",
            show_default=False,
        ),
    ] = None,
    namespace: Annotated[
        str | None,
        typer.Option(
            envvar=ENV_TEMPORAL_NAMESPACE,
            help="Temporal namespace. Default: the local stack's (see --address), else default.",
            show_default=False,
        ),
    ] = None,
    state_dir: Annotated[
        Path,
        typer.Option(
            envvar=ENV_STATE_DIR, help="Where the local stack keeps pid files, logs, its database and stack.json."
        ),
    ] = Path(".corral"),
) -> None:
    """Run long-lived AI agents on Temporal."""
    # Absolute from here on: every subprocess (git, dockerd, the workers) may run in another directory.
    ctx.obj = Settings(address_option=address, namespace_option=namespace, state_dir=state_dir.expanduser().absolute())
    # The archive of sessions' earlier runs: this CLI and the workers it starts read and write the same one.
    os.environ.setdefault(ENV_BLOB_STORE, str(ctx.obj.state_dir / "blobs"))
    # Files' metadata, skills and memory stores (corral.knowledge_db): one database for this CLI and its workers.
    os.environ.setdefault(ENV_KNOWLEDGE_DB, str(ctx.obj.state_dir / "knowledge.db"))  # corral.knowledge_db's default
    # The stream relay's token (`corral up` made it): `corral tail` subscribes with it.
    follow_with_stream_token(read_stream_token(StatePaths(ctx.obj.state_dir)))


async def client_of(settings: Settings) -> Client:
    from corral.temporal import connect

    return await connect(settings.address, settings.namespace)


def check_session_id(value: str) -> str:
    """A session id is a workflow id: UTF-8 text, not empty, no whitespace (Temporal itself only says "WorkflowId is
    not set")."""
    if not value.strip():
        raise typer.BadParameter("the session id is empty; `corral ls` lists the sessions")
    if value != value.strip() or any(char.isspace() for char in value):
        raise typer.BadParameter(f"{value!r} is not a session id: it contains whitespace")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # an argument that is not UTF-8 reaches Python as lone surrogates
        raise typer.BadParameter(f"{value!r} is not a session id: it is not UTF-8 text") from None
    return value


SessionId = Annotated[
    str, typer.Argument(metavar="SESSION", help="Session id.", show_default=False, callback=check_session_id)
]
