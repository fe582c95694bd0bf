"""`corral harness check`: before deploying new harness code, replay recent histories with it.

The work is in `workers/harness_check.py`; this parses options, shows progress and renders the report. Exit code
0: every history replayed (skipped ones, whose history is gone, do not count); 1: at least one failed to replay,
or the check could not run (Temporal unreachable: the message says which).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Annotated

import typer

from cli.app import app, client_of
from cli.context import run, settings_of
from corral.names import ENV_HARNESS_DEPLOYMENT

if TYPE_CHECKING:
    from rich.console import Console

    from workers.deployment import DeploymentState
    from workers.harness_check import ExecutionCheck, HarnessCheckReport, Progress

# Like every command module, this imports the Temporal client, rich and the workflow code (through
# workers.harness_check) only when its command runs: `corral --help` starts without them.

harness_app = typer.Typer(
    name="harness", help="The harness (workflow code): check it before a deploy, see its builds, promote one."
)
app.add_typer(harness_app, rich_help_panel="Deploying")

EXIT_REPLAY_FAILED = 1

_DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")


def parse_duration(value: str) -> timedelta:
    """`24h`, `90m`, `7d`, `1h30m`, `45s`: days, hours, minutes and seconds, in that order."""
    match = _DURATION.fullmatch(value.strip())
    if not value.strip() or match is None:
        raise typer.BadParameter(f"{value!r} is not a duration like 24h, 90m, 7d or 1h30m")
    days, hours, minutes, seconds = (int(part or 0) for part in match.groups())
    return timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)


def _check_duration(value: str) -> str:
    parse_duration(value)
    return value


def _check_task_queue(value: str | None) -> str | None:
    if value is not None and (not value.strip() or "'" in value):
        raise typer.BadParameter(f"{value!r} is not a task queue name")
    return value


def _check_types(types: list[str] | None) -> list[str] | None:
    from workers.harness_check import HARNESS_WORKFLOW_TYPES

    unknown = sorted(set(types or []) - set(HARNESS_WORKFLOW_TYPES))
    if unknown:
        raise typer.BadParameter(
            f"unknown workflow type {', '.join(unknown)}; one of: {', '.join(HARNESS_WORKFLOW_TYPES)}"
        )
    return types or None


@harness_app.command("check")
def check_command(
    ctx: typer.Context,
    since: Annotated[
        str,
        typer.Option(help="Also replay executions closed this recently (e.g. 24h, 90m, 7d).", callback=_check_duration),
    ] = "24h",
    limit: Annotated[
        int, typer.Option(help="At most this many executions of each workflow type, running ones first.", min=1)
    ] = 200,
    workflow_types: Annotated[
        list[str] | None,
        typer.Option(
            "--workflow-type",
            help="Only this workflow type: SessionWorkflow or RecordWorkflow (repeatable). Default: both.",
            callback=_check_types,
            show_default=False,
        ),
    ] = None,
    task_queue: Annotated[
        str | None,
        typer.Option(
            help="Only executions on this task queue. Default: any.", callback=_check_task_queue, show_default=False
        ),
    ] = None,
) -> None:
    """Replay the histories of running sessions and records, and of those closed since --since, with the workflow
    code installed here, as the harness worker would run it; list every one that does not replay.

    Run it before deploying a new harness worker. Exit code 0: every history replayed (one deleted meanwhile is
    skipped); 1: at least one failed (deploying this code would wedge those sessions), or Temporal is unreachable.
    """
    from workers.harness_check import HARNESS_WORKFLOW_TYPES, check_harness

    settings = settings_of(ctx)

    async def go() -> HarnessCheckReport:
        client = await client_of(settings)
        with _progress(settings.err) as on_progress:
            return await check_harness(
                client,
                since=parse_duration(since),
                limit=limit,
                workflow_types=workflow_types or HARNESS_WORKFLOW_TYPES,
                task_queue=task_queue,
                on_progress=on_progress,
            )

    report = run(settings, go())
    render_report(settings.out, report, limit)
    if not report.ok:
        raise typer.Exit(EXIT_REPLAY_FAILED)


@contextlib.contextmanager
def _progress(console: Console) -> Iterator[Progress]:
    """`N of M` while the check runs: a bar on a terminal, one line per execution when stderr is captured (a CI log
    shows how far it got, and what each one came to)."""
    if not console.is_terminal:
        from cli.render import safe

        def line(done: int, total: int, check: ExecutionCheck) -> None:
            console.print(f"{done} of {total}: {check.outcome} {check.workflow_type} {safe(check.workflow_id)}")

        yield line
        return
    from rich.progress import BarColumn, MofNCompleteColumn, TextColumn
    from rich.progress import Progress as ProgressBar

    with ProgressBar(
        TextColumn("replaying"), BarColumn(), MofNCompleteColumn(), console=console, transient=True
    ) as bar:
        task = bar.add_task("replay", total=None)
        yield lambda done, total, _check: bar.update(task, completed=done, total=total)


def render_report(console: Console, report: HarnessCheckReport, limit: int) -> None:
    """A table of outcomes per workflow type, then one row per failure, then the verdict."""
    from rich.table import Table
    from rich.text import Text

    from cli.render import safe

    for query in report.listing.queries:
        console.print(Text(f"query: {query}", style="dim"), soft_wrap=True)
    if not report.checks:
        console.print("no execution to replay: nothing ran or closed in that time", style="yellow")
        return
    summary = Table(title="Replayed with this code")
    for column in ("workflow type", "clean", "failed", "skipped"):
        summary.add_column(column, justify="left" if column == "workflow type" else "right")
    for kind, counts in sorted(report.counts().items()):
        failed = counts["failed"]
        summary.add_row(
            kind, str(counts["clean"]), Text(str(failed), style="bold red" if failed else ""), str(counts["skipped"])
        )
    console.print(summary)
    if report.failures:
        failures = Table(title="Did not replay", show_lines=True)
        for column in ("workflow id", "run id", "type", "error"):
            failures.add_column(column, no_wrap=column != "error", overflow="fold")
        for check in report.failures:
            kind = "non-determinism" if check.nondeterminism else "replay error"
            failures.add_row(
                Text(safe(check.workflow_id)),
                Text(check.run_id),
                check.workflow_type,
                Text(f"{kind}: ", style="red") + Text(safe(check.message)),
            )
        console.print(failures)
    if report.skipped:
        console.print(
            f"{len(report.skipped)} skipped: their histories were deleted before they could be read", style="dim"
        )
    if report.listing.matched > len(report.checks):
        console.print(
            f"checked {len(report.checks)} of the {report.listing.matched} matching executions (--limit {limit})",
            style="yellow",
        )
    replayed = len(report.checks) - len(report.skipped)
    if report.ok:
        console.print(Text(f"all {replayed} replayed cleanly", style="bold green"))
    else:
        console.print(
            Text(
                f"{len(report.failures)} of {replayed} did not replay: a harness worker running this code would fail "
                "their next workflow task",
                style="bold red",
            )
        )


# ---- a versioned harness (workers/deployment.py) ------------------------------------------------------------------

DEFAULT_DEPLOYMENT = "corral-harness"
DeploymentOption = Annotated[
    str,
    typer.Option(
        "--deployment",
        envvar=ENV_HARNESS_DEPLOYMENT,
        help="The harness's Worker Deployment (what its workers' CORRAL_HARNESS_DEPLOYMENT names).",
    ),
]


@harness_app.command("builds")
def builds_command(ctx: typer.Context, deployment: DeploymentOption = DEFAULT_DEPLOYMENT) -> None:
    """The builds of a versioned harness and their state: `current` takes new sessions; `draining` still runs
    sessions pinned to it (keep its workers); `drained` runs none (its workers can go)."""
    from workers.deployment import describe_deployment

    settings = settings_of(ctx)

    async def go() -> DeploymentState | None:
        return await describe_deployment(await client_of(settings), deployment)

    state = run(settings, go())
    if state is None:
        from cli.context import CliError, fail

        fail(settings, CliError(f"no deployment {deployment!r}: no harness worker of it has run",
                                hint="start the harness with CORRAL_HARNESS_DEPLOYMENT set"))  # fmt: skip
    render_builds(settings.out, state)


@harness_app.command("promote")
def promote_command(
    ctx: typer.Context,
    build_id: Annotated[str, typer.Argument(help="The build to make current (its workers' CORRAL_HARNESS_BUILD_ID).")],
    deployment: DeploymentOption = DEFAULT_DEPLOYMENT,
    timeout: Annotated[float, typer.Option(help="Seconds to wait for its workers and the routing.", min=1)] = 60,
) -> None:
    """Make a build of the harness current: new sessions start on it, and running ones move to it as their
    deployment's upgrade policy says (`pinned`: at their next safe point; `auto-upgrade`: at their next task).
    Run `corral harness check` with the new build's code first."""
    from workers.deployment import DeploymentError, describe_deployment, set_current_build

    settings = settings_of(ctx)

    async def go() -> DeploymentState | None:
        client = await client_of(settings)
        try:
            await set_current_build(client, deployment, build_id, timeout=timeout)
        except DeploymentError as exc:
            from cli.context import CliError

            raise CliError(str(exc), hint="`corral harness builds` lists the builds Temporal knows") from None
        return await describe_deployment(client, deployment)

    state = run(settings, go())
    settings.out.print(f"{build_id} is the current build of {deployment}", style="bold green")
    if state is not None:
        render_builds(settings.out, state)


def render_builds(console: Console, state: DeploymentState) -> None:
    from rich.table import Table
    from rich.text import Text

    from cli.render import safe

    table = Table(title=f"Builds of {safe(state.name)}")
    table.add_column("build")
    table.add_column("state")
    styles = {"current": "bold green", "draining": "yellow", "ramping": "cyan"}
    for build in state.builds:
        table.add_row(Text(safe(build.build_id)), Text(build.status, style=styles.get(build.status, "")))
    console.print(table)
    if state.current is None:
        console.print("no build is current: no session can start", style="bold red")
