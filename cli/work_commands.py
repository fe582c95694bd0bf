"""`corral environment work ENV`: a self-hosted environment's work queue as its `EnvironmentWorkQueue` holds it
(corral/work_queue.py): how many items wait for a worker, how many are being served, how many workers polled
lately, and every item the queue keeps, newest first, with its session and its lease's last heartbeat.

It reads Temporal directly, as the other commands do, so it needs no key: the environment's record says whose it
is. `work_command` is a command of the `environment` group (cli/environment_commands.py).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from cli.app import client_of
from cli.context import CliError, run, settings_of
from cli.environment_commands import environment_app

if TYPE_CHECKING:
    from datetime import datetime

    from rich.table import Table

    from corral.contract.work import WorkItem, WorkQueueState


@environment_app.command("work")
def work_command(
    ctx: typer.Context,
    environment: Annotated[str, typer.Argument(metavar="ENV", help="The self-hosted environment's id (env_…).")],
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object: the queue's figures and its items.")
    ] = False,
) -> None:
    """Show a self-hosted environment's work queue: its depth (items waiting for a worker), pending (items
    polled and not yet acknowledged), workers polling (in the last 30 s), then its items, newest first: id,
    session, state, last heartbeat. An environment that is not self-hosted is an error (exit 1).
    """
    from datetime import UTC, datetime

    settings = settings_of(ctx)

    async def go() -> None:
        from corral.envkeys import SELF_HOSTED
        from corral.records import RecordNotFound, Records
        from corral.work_queue import WorkQueues

        client = await client_of(settings)
        try:
            record = await Records(client).get_any(environment, kind="environment")
        except RecordNotFound:
            raise CliError(f"no environment {environment}", hint="its id reads env_…") from None
        kind = (record.body.get("config") or {}).get("type", "cloud")
        if kind != SELF_HOSTED:
            raise CliError(f"environment {environment} is a {kind} environment: only a {SELF_HOSTED} one has a "
                           "work queue")  # fmt: skip
        queues = WorkQueues(client)
        state = await queues.state(record.id, record.workspace)
        items = await queues.items(record.id)
        now = datetime.now(UTC)
        if as_json:
            print(queue_json(state, items, now), flush=False)
            return
        settings.out.print(queue_summary(state, now))
        if items:
            settings.out.print(items_table(items))

    run(settings, go())


def workers_polling(state: WorkQueueState, now: datetime) -> int:
    from datetime import timedelta

    from corral.contract.work import POLLERS_WINDOW_SECONDS

    since = now - timedelta(seconds=POLLERS_WINDOW_SECONDS)
    return sum(1 for polled in state.pollers.values() if polled >= since)


def queue_json(state: WorkQueueState, items: list[WorkItem], now: datetime) -> str:
    """The queue as one JSON object; its items without the lease's token or the session token's digest (a listing
    is no place for either)."""
    import json

    from cli.render import safe_json_line

    oldest = state.oldest_queued_at.isoformat() if state.oldest_queued_at else None
    shown = [item.model_dump(mode="json", exclude={"last_heartbeat", "token_sha256"}) for item in items]
    queue = {"environment_id": state.environment_id, "depth": state.depth, "pending": state.pending,
             "oldest_queued_at": oldest, "workers_polling": workers_polling(state, now), "items": shown}  # fmt: skip
    return safe_json_line(json.dumps(queue))


def queue_summary(state: WorkQueueState, now: datetime) -> str:
    from cli.render import local_time, safe

    oldest = f", oldest queued {local_time(state.oldest_queued_at)}" if state.oldest_queued_at else ""
    return (f"{safe(state.environment_id)}: depth {state.depth}, pending {state.pending}, "
            f"workers polling {workers_polling(state, now)}{oldest}")  # fmt: skip


def items_table(items: list[WorkItem]) -> Table:
    """One row per item: id, session, state, last heartbeat, created."""
    from rich.table import Table
    from rich.text import Text

    from cli.render import local_time, safe

    table = Table()
    for column in ("work item", "session", "state", "last heartbeat", "created"):
        table.add_column(column, no_wrap=column in ("work item", "session"))
    styles = {"queued": "yellow", "starting": "yellow", "active": "green", "stopping": "dim", "stopped": "dim"}
    for item in items:
        ended = f" ({item.end_reason})" if item.end_reason and item.state == "stopped" else ""
        table.add_row(
            safe(item.id),
            safe(item.session_id),
            Text(item.state + ended, style=styles.get(item.state, "")),
            local_time(item.latest_heartbeat_at) if item.latest_heartbeat_at else "—",
            local_time(item.created_at),
        )
    return table
