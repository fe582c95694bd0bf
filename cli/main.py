"""`corral`: run the local stack and talk to sessions from a terminal.

Commands are thin: they parse options, then call `up.py` (the stack) or `session_ops.py` (sessions), and every
failure a user can meet goes through `context.run`, which turns it into a message and an exit code.

Start-up time matters in a command people type: this module imports only typer at the top, and each command
imports what it needs (the Temporal client, rich, the pydantic contract) when it runs. `bench/cli_startup.py`
measures it.
"""

from __future__ import annotations

import contextlib
import os
import sys
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.context import CliError, Settings, fail, run, settings_of
from cli.vault import vault_app
from corral.names import DEFAULT_GIT_PROXY_PORT, ENV_TEMPORAL_ADDRESS, ENV_TEMPORAL_NAMESPACE

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


class SessionStatusFilter(StrEnum):
    """The values of the CorralStatus search attribute."""

    idle = "idle"
    running = "running"
    rescheduling = "rescheduling"
    terminated = "terminated"


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
            envvar="CORRAL_STATE_DIR", help="Where the local stack keeps pid files, logs, its database and stack.json."
        ),
    ] = Path(".corral"),
) -> None:
    """Run long-lived AI agents on Temporal."""
    # Absolute from here on: every subprocess (git, dockerd, the workers) may run in another directory.
    ctx.obj = Settings(address_option=address, namespace_option=namespace, state_dir=state_dir.expanduser().absolute())


async def _client(settings: Settings) -> Client:
    from corral.temporal import connect

    return await connect(settings.address, settings.namespace)


def _check_session_id(value: str) -> str:
    """A session id is a workflow id: not empty, no whitespace (Temporal itself only says "WorkflowId is not set")."""
    if not value.strip():
        raise typer.BadParameter("the session id is empty; `corral ls` lists the sessions")
    if value != value.strip() or any(char.isspace() for char in value):
        raise typer.BadParameter(f"{value!r} is not a session id: it contains whitespace")
    return value


SessionId = Annotated[
    str, typer.Argument(metavar="SESSION", help="Session id.", show_default=False, callback=_check_session_id)
]


# ---- the local stack ------------------------------------------------------------------------------------------


app.add_typer(vault_app)

# The stack's options, shared by `up` and `demo`.
TemporalPort = Annotated[int, typer.Option(help="gRPC port of the Temporal dev server.")]
UiPort = Annotated[int, typer.Option(help="Port of the Temporal Web UI.")]
ModelPort = Annotated[int, typer.Option(help="Port of the offline model server (no ANTHROPIC_API_KEY).")]
StreamPort = Annotated[int, typer.Option(help="Port of the stream relay (live text deltas).")]
GitProxyPort = Annotated[int, typer.Option(help="Port of the git proxy (in the proxy worker).")]
Split = Annotated[bool, typer.Option("--split/--all-in-one", help="One worker process per role, or all in one.")]


@app.command("up")
def up_command(
    ctx: typer.Context,
    temporal_port: TemporalPort = 7233,
    ui_port: UiPort = 8233,
    model_port: ModelPort = 8765,
    stream_port: StreamPort = 8766,
    git_proxy_port: GitProxyPort = DEFAULT_GIT_PROXY_PORT,
    split: Split = False,
) -> None:
    """Start the local stack in the background: Temporal dev server, offline model (without an API key), workers.

    Idempotent: parts already running are left alone. State lives in --state-dir.
    """
    from cli import up

    settings = settings_of(ctx)
    options = up.UpOptions(temporal_port, ui_port, model_port, stream_port, git_proxy_port, split)
    report = run(settings, up.bring_up(settings.out, settings.paths, options, settings.namespace))
    settings.out.print(up.stack_panel(report, settings.paths))


@app.command("down")
def down_command(
    ctx: typer.Context,
    sandboxes: Annotated[
        bool,
        typer.Option(
            "--sandboxes",
            help="Also remove every sandbox: session containers, their workspace volumes (files in /workspace are "
            "lost), the corral-egress container and its networks. The sandbox images stay (a cache).",
        ),
    ] = False,
) -> None:
    """Stop the local stack: SIGTERM each process (workers first), SIGKILL after 10 s.

    Says what it stopped and what it keeps: the Temporal database (sessions and their logs), the logs, and, unless
    --sandboxes, the sandboxes on the Docker engine.
    """
    from cli import up

    settings = settings_of(ctx)
    run(settings, up.bring_down(settings.out, settings.paths, remove_sandboxes=sandboxes))


@app.command("status")
def status_command(ctx: typer.Context) -> None:
    """Show the stack's processes (pid, alive) and addresses."""
    from rich.table import Table

    from cli.render import processes_table
    from cli.stack import known_processes, process_state

    settings = settings_of(ctx)
    names = known_processes(settings.paths)
    if names:
        settings.out.print(processes_table(process_state(settings.paths, name) for name in names))
    else:
        settings.out.print(f"no corral processes recorded in {settings.state_dir}")
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("Temporal", f"{settings.address}  (namespace {settings.namespace})")
    stack = settings.stack()
    if stack is not None:
        grid.add_row("Web UI", f"{stack.ui_url}/namespaces/{settings.namespace}/workflows")
        grid.add_row("Model", f"offline stand-in at {stack.model_url}" if stack.offline else "Anthropic API")
        grid.add_row("Workers", stack.mode)
    grid.add_row("Logs", str(settings.paths.logs))
    settings.out.print(grid)


@app.command("demo")
def demo_command(
    ctx: typer.Context,
    temporal_port: TemporalPort = 7233,
    ui_port: UiPort = 8233,
    model_port: ModelPort = 8765,
    stream_port: StreamPort = 8766,
    git_proxy_port: GitProxyPort = DEFAULT_GIT_PROXY_PORT,
    split: Split = False,
) -> None:
    """Bring the stack up, run a session that uses tools, follow it live, and show where to look next."""
    from cli import up
    from cli.demo import run_demo

    settings = settings_of(ctx)
    options = up.UpOptions(temporal_port, ui_port, model_port, stream_port, git_proxy_port, split)
    run(settings, run_demo(settings, options))


# ---- sessions -------------------------------------------------------------------------------------------------


@app.command("start")
def start_command(
    ctx: typer.Context,
    message: Annotated[
        str | None, typer.Argument(metavar="MESSAGE", help="First user message (optional).", show_default=False)
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(help="Model name. Default: claude-sonnet-4-5, or corral-offline-stand-in when offline."),
    ] = None,
    system: Annotated[str | None, typer.Option(help="System prompt.")] = None,
    title: Annotated[str | None, typer.Option(help="Session title.")] = None,
    tool_utility: Annotated[
        bool | None,
        typer.Option(
            "--tool-utility/--no-tool-utility",
            help="Offer the utility tools (get_time, calculate). Default: on, or as the --input file says.",
            show_default=False,
        ),
    ] = None,
    toolset: Annotated[
        bool | None,
        typer.Option(
            "--toolset/--no-toolset",
            help="Offer the sandbox tools (bash, read, write, edit, glob, grep); the container starts only when "
            "a tool call needs it. Default: on, or as the --input file says.",
            show_default=False,
        ),
    ] = None,
    input_file: Annotated[
        Path | None,
        typer.Option(
            "--input", help="A SessionInput JSON file; the options above override its fields.", dir_okay=False
        ),
    ] = None,
    follow: Annotated[bool, typer.Option("--follow", help="Then follow the session until it is idle.")] = False,
    repo: Annotated[
        str | None, typer.Option(help="A git repository (https URL) to clone into the sandbox.", show_default=False)
    ] = None,
    repo_token_file: Annotated[
        Path | None,
        typer.Option(help="File with the repository's token ('-' for stdin); it goes straight to Vault."),
    ] = None,
    repo_branch: Annotated[str | None, typer.Option(help="Branch to check out.")] = None,
    vault: Annotated[
        list[str] | None, typer.Option("--vault", help="Vault id for MCP credentials (repeatable).")
    ] = None,
) -> None:
    """Start a session. Prints its id (only the id on stdout when stdout is not a terminal) and Web UI link."""
    from rich.text import Text

    from cli import session_ops
    from cli.render import EventRenderer
    from cli.vault import store_repository
    from corral.client import new_session_id, start_session

    settings = settings_of(ctx)
    session_id = new_session_id()
    try:
        base = session_ops.load_input_file(input_file) if input_file is not None else None
        if repo is not None or vault:
            base = dict(base or {})
            if vault:
                base["vault_ids"] = [*base.get("vault_ids", []), *vault]
            if repo is not None:
                resource = store_repository(settings, session_id, repo, repo_token_file, repo_branch)
                base["resources"] = [*base.get("resources", []), resource]
        session_input = session_ops.build_session_input(
            base,
            default_model=settings.default_model(),
            message=message,
            model=model,
            system=system,
            title=title,
            tool_utility=tool_utility,
            toolset=toolset,
            from_file=input_file is not None,
        )
    except CliError as error:
        fail(settings, error)

    async def go() -> None:
        client = await _client(settings)
        handle = await start_session(client, session_input, session_id=session_id)
        if settings.stdout_is_terminal:
            settings.out.print(Text("started ", style="green") + Text(session_id, style="bold"))
        else:
            print(session_id, flush=True)
        settings.human.print(Text(settings.workflow_url(session_id), style="blue"))
        if follow:
            await session_ops.tail(handle, EventRenderer(settings.human), stream_url=settings.stream_url())

    run(settings, go(), interrupted="stopped following")


@app.command("send")
def send_command(
    ctx: typer.Context,
    session: SessionId,
    text: Annotated[str, typer.Argument(metavar="TEXT", help="The message.", show_default=False)],
    follow: Annotated[bool, typer.Option("--follow", help="Then follow the session until it is idle.")] = False,
) -> None:
    """Send a user message (the `send_events` update); prints the accepted event id."""
    from cli import session_ops
    from cli.render import EventRenderer
    from corral.client import send_text, session_info

    settings = settings_of(ctx)

    async def go() -> None:
        handle = (await _client(settings)).get_workflow_handle(session)
        last = (await session_info(handle)).last_position if follow else 0
        event_id = await send_text(handle, text)
        settings.out.print(event_id, highlight=False)
        if follow:
            await session_ops.tail(handle, EventRenderer(settings.human), after=last, stream_url=settings.stream_url())

    run(settings, go(), session_id=session, interrupted="stopped following")


@app.command("interrupt")
def interrupt_command(
    ctx: typer.Context,
    session: SessionId,
) -> None:
    """Stop the session's current work (sends a `user.interrupt` event); the session goes idle and stays usable."""
    from corral.client import send_events

    settings = settings_of(ctx)

    async def go() -> None:
        handle = (await _client(settings)).get_workflow_handle(session)
        (event_id,) = await send_events(handle, [{"type": "user.interrupt"}])
        settings.out.print(event_id, highlight=False)

    run(settings, go(), session_id=session)


def _check_types(types: list[str] | None) -> list[str] | None:
    from corral.contract.events import EVENT_TYPES

    unknown = sorted(set(types or []) - EVENT_TYPES)
    if unknown:
        raise typer.BadParameter(f"unknown event type {', '.join(unknown)}; one of: {', '.join(sorted(EVENT_TYPES))}")
    return types or None


@app.command("events")
def events_command(
    ctx: typer.Context,
    session: SessionId,
    after: Annotated[int, typer.Option(help="Only events after this position.", min=0)] = 0,
    types: Annotated[
        list[str] | None,
        typer.Option("--type", "-t", help="Only this event type (repeatable).", callback=_check_types),
    ] = None,
    limit: Annotated[int | None, typer.Option(help="At most this many events.", min=1)] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON lines, one event per line.")] = False,
) -> None:
    """Print a session's events: position, time, type and a short summary (or the events as JSON lines).

    Control characters in event content (a model or a tool can write terminal escape sequences) are shown escaped,
    never sent to the terminal; --json output escapes them as JSON does.
    """
    from cli import session_ops
    from cli.render import EventRenderer, safe_json_line
    from corral.client import read_events

    settings = settings_of(ctx)

    async def go() -> None:
        handle = (await _client(settings)).get_workflow_handle(session)
        async with session_ops.explained(handle):
            events = await read_events(handle, after=after, types=types, limit=limit)
        if not events:
            settings.err.print(f"no events{' of that type' if types else ''} after position {after}", style="dim")
        if as_json:
            for event in events:
                print(safe_json_line(event.model_dump_json()), flush=False)
            return
        renderer = EventRenderer(settings.out)
        for event in events:
            renderer.print(event)

    run(settings, go(), session_id=session)


@app.command("tail")
def tail_command(
    ctx: typer.Context,
    session: SessionId,
    after: Annotated[int, typer.Option(help="Start after this position.", min=0)] = 0,
    forever: Annotated[bool, typer.Option("--forever", help="Keep following after the session goes idle.")] = False,
) -> None:
    """Print a session's events and follow new ones until the reply to the latest message is done (idle).

    Ctrl-C stops following.
    """
    from cli import session_ops
    from cli.render import EventRenderer

    settings = settings_of(ctx)

    async def go() -> None:
        handle = (await _client(settings)).get_workflow_handle(session)
        async with session_ops.explained(handle):
            result = await session_ops.tail(
                handle, EventRenderer(settings.out), after=after, forever=forever, stream_url=settings.stream_url()
            )
        if result.reason.startswith("workflow"):
            settings.err.print(f"the session's {result.reason}: nothing more will happen", style="dim")

    run(settings, go(), session_id=session, interrupted="stopped following")


@app.command("ls")
def ls_command(
    ctx: typer.Context,
    status: Annotated[SessionStatusFilter | None, typer.Option(help="Only sessions in this status.")] = None,
    limit: Annotated[int, typer.Option(help="At most this many sessions.", min=1)] = 50,
) -> None:
    """List sessions, newest first.

    Runs the visibility query `WorkflowType='SessionWorkflow' [AND CorralStatus='idle']`; the same query works
    in the Temporal Web UI and with `temporal workflow list --query "…"`.
    """
    from cli import session_ops
    from cli.render import sessions_table

    settings = settings_of(ctx)
    query = session_ops.sessions_query(status.value if status else None)

    async def go() -> None:
        rows = await session_ops.list_sessions(await _client(settings), query, limit)
        if not rows:
            settings.out.print(f"no sessions match {query}")
            return
        settings.out.print(sessions_table(rows))

    run(settings, go())


if __name__ == "__main__":
    app()
