"""`corral up`, `down`, `status` and `demo`: the local stack. The mechanism is in `up.py` and `stack.py`."""

from __future__ import annotations

from typing import Annotated

import typer

from cli.app import app, check_session_id
from cli.context import run, settings_of
from cli.vault import vault_app
from corral.names import DEFAULT_GIT_PROXY_PORT

PANEL = "The local stack"

# ---- the local stack ------------------------------------------------------------------------------------------


app.add_typer(vault_app, rich_help_panel=PANEL)

# The stack's options, shared by `up` and `demo`.
TemporalPort = Annotated[int, typer.Option(help="gRPC port of the Temporal dev server.")]
UiPort = Annotated[int, typer.Option(help="Port of the Temporal Web UI.")]
ModelPort = Annotated[int, typer.Option(help="Port of the offline model server (no ANTHROPIC_API_KEY).")]
StreamPort = Annotated[int, typer.Option(help="Port of the stream relay (live text deltas).")]
ApiPort = Annotated[int, typer.Option(help="Port of the Managed Agents API (the gateway).")]
GitProxyPort = Annotated[int, typer.Option(help="Port of the git proxy (in the proxy worker).")]
Split = Annotated[bool, typer.Option("--split/--all-in-one", help="One worker process per role, or all in one.")]


@app.command("up", rich_help_panel=PANEL)
def up_command(
    ctx: typer.Context,
    temporal_port: TemporalPort = 7233,
    ui_port: UiPort = 8233,
    model_port: ModelPort = 8765,
    stream_port: StreamPort = 8766,
    git_proxy_port: GitProxyPort = DEFAULT_GIT_PROXY_PORT,
    split: Split = False,
    api_port: ApiPort = 8780,
) -> None:
    """Start the local stack in the background: Temporal dev server, offline model (without an API key), workers,
    and the Managed Agents API at http://127.0.0.1:8780 (--api-port).

    Idempotent: parts already running are left alone. State lives in --state-dir.
    """
    from cli import up

    settings = settings_of(ctx)
    options = up.UpOptions(temporal_port, ui_port, model_port, stream_port, git_proxy_port, split, api_port)
    report = run(settings, up.bring_up(settings.out, settings.paths, options, settings.namespace))
    settings.out.print(up.stack_panel(report, settings.paths))


@app.command("down", rich_help_panel=PANEL)
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
    purge: Annotated[
        bool,
        typer.Option(
            "--purge",
            help="Remove everything after stopping: the sandboxes and the whole state dir (every session, vault, "
            "credential, log and blob in it). Asks first.",
        ),
    ] = False,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask before --purge (for scripts).")] = False,
) -> None:
    """Stop the local stack: SIGTERM each process group (workers first), SIGKILL after 10 s.

    Says what it stopped and what it keeps: the Temporal database (sessions and their logs), the vaults and
    credentials (OpenBao's storage, sealed), the logs, and, unless --sandboxes, the sandboxes on the Docker engine.
    """
    import sys

    from cli import down
    from cli.context import CliError, fail

    settings = settings_of(ctx)
    if purge and not yes:
        listing = "\n".join(f"  - {line}" for line in down.purge_list(settings.paths))
        if not sys.stdin.isatty():
            fail(settings, CliError(f"--purge would remove:\n{listing}", hint="add --yes to confirm", exit_code=2))
        settings.out.print(f"corral down --purge removes, for good:\n{listing}")
        if not typer.confirm("Remove all of this?", default=False):
            fail(settings, CliError("nothing was stopped or removed", exit_code=1))
    run(settings, down.bring_down(settings.out, settings.paths, remove_sandboxes=sandboxes, purge=purge))


def _optional_session_id(value: str | None) -> str | None:
    return None if value is None else check_session_id(value)


@app.command("status", rich_help_panel=PANEL)
def status_command(
    ctx: typer.Context,
    session: Annotated[
        str | None,
        typer.Argument(
            metavar="SESSION",
            help="A session: its status and what its turn is waiting for (a worker of which role, for how long, "
            "about how many tasks ahead of it).",
            show_default=False,
            callback=_optional_session_id,
        ),
    ] = None,
) -> None:
    """Show the stack's processes (pid, alive), addresses and task queues: each role's backlog (tasks waiting for a
    worker, approximately), how long the oldest has waited, and the workers polling. With SESSION, that session's
    status and what its turn is waiting for."""
    from rich.table import Table

    from cli.app import client_of
    from cli.backlog import queues_table, session_lines
    from cli.context import describe_failure
    from cli.processes import known_processes, process_state
    from cli.render import processes_table
    from corral.queues import stack_load

    settings = settings_of(ctx)
    if session is not None:

        async def one() -> None:
            for line in await session_lines(await client_of(settings), session):
                settings.out.print(line)

        run(settings, one(), session_id=session)
        return
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
        if stack.api_url:
            grid.add_row("API", f"{stack.api_url}  (Managed Agents API)")
    grid.add_row("Logs", str(settings.paths.logs))
    settings.out.print(grid)

    async def queues() -> None:
        try:
            loads = await stack_load(await client_of(settings))
        except Exception as error:  # a stack that is down is a state to report, not a failure of `status`
            settings.out.print(f"task queues: unknown ({describe_failure(error, settings.address)})", style="dim")
            return
        settings.out.print(queues_table(loads))

    run(settings, queues())


@app.command("demo", rich_help_panel=PANEL)
def demo_command(
    ctx: typer.Context,
    temporal_port: TemporalPort = 7233,
    ui_port: UiPort = 8233,
    model_port: ModelPort = 8765,
    stream_port: StreamPort = 8766,
    git_proxy_port: GitProxyPort = DEFAULT_GIT_PROXY_PORT,
    split: Split = False,
    api_port: ApiPort = 8780,
) -> None:
    """Bring the stack up, run a session that uses tools, follow it live, and show where to look next."""
    from cli import up
    from cli.demo import run_demo

    settings = settings_of(ctx)
    options = up.UpOptions(temporal_port, ui_port, model_port, stream_port, git_proxy_port, split, api_port)
    run(settings, run_demo(settings, options))
