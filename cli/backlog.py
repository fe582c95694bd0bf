"""What `corral status` says about load: each role's task queue (backlog, oldest task, workers polling) and, for one
session, what its turn is waiting for. The figures come from `corral.queues`; they are approximate, and say so."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from rich.table import Table
from rich.text import Text
from temporalio.client import Client, WorkflowExecutionStatus

from cli.render import safe
from corral.contract.search_attributes import STATUS_KEY
from corral.queues import ROLE_QUEUES, QueueLoad, Waiting, session_waits


def seconds(value: float) -> str:
    return f"{value:.1f} s"


def queues_table(loads: Iterable[QueueLoad]) -> Table:
    """One row per role's shared queue: its backlog (approximate), how long the oldest task has waited, and the
    workers polling it; a queue with work and no worker is red, one with a backlog yellow."""
    roles = {queue: role for queue, role, _ in ROLE_QUEUES}
    table = Table(title="task queues (approximate: Temporal's own counts, a few seconds old)", title_justify="left")
    for column, justify in (("role", "left"), ("queue", "left"), ("waiting", "right"), ("oldest", "right"),
                            ("workers", "right"), ("in/s", "right"), ("out/s", "right")):  # fmt: skip
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for load in loads:
        style = "red" if load.backlog and not load.pollers else "yellow" if load.backlog else ""
        table.add_row(
            roles.get(load.queue, ""),
            load.queue,
            Text(f"~{load.backlog}" if load.backlog else "0", style=style),
            seconds(load.oldest.total_seconds()) if load.backlog else "—",
            Text(str(load.pollers), style="red" if not load.pollers else ""),
            f"{load.add_rate:.1f}",
            f"{load.dispatch_rate:.1f}",
        )
    return table


def wait_text(wait: Waiting, now: datetime) -> Text:
    """One waiting task in words: whose worker it waits for, for how long, and what is ahead of it (approximately)."""
    role = f"a {wait.role} worker" if wait.role else "a worker"
    what = wait.activity_type or "the harness's next step"
    line = Text(f"waiting for {role} for {seconds(wait.waited(now).total_seconds())}", style="yellow")
    line.append(f" ({safe(what)}, queue {safe(wait.queue)})")
    load, ahead = wait.load, wait.ahead(now)
    before = "no task" if not ahead else f"about {ahead} task{'' if ahead == 1 else 's'}"
    line.append(f": {before} ahead of it, ~{wait.backlog()} waiting in that queue, the oldest for "
                f"{seconds(wait.oldest(now).total_seconds())}")  # fmt: skip
    if load.pollers:
        line.append(f"; {load.pollers} worker{'' if load.pollers == 1 else 's'} polling")
    else:
        line.append("; no worker polls that queue: it waits until one starts", style="red")
    return line


async def session_lines(client: Client, session_id: str) -> list[Text]:
    """The session's status (its `CorralStatus` search attribute: read from the server, so it answers even when
    no harness worker is free to answer a query) and each task it waits for, oldest first."""
    description = await client.get_workflow_handle(session_id).describe()
    status = description.typed_search_attributes.get(STATUS_KEY) or "idle"
    workflow = (description.status or WorkflowExecutionStatus.RUNNING).name.replace("_", " ").lower()
    lines = [Text(f"{session_id}  ", style="bold") + Text(f"{safe(status)}  (workflow {workflow})")]
    if description.status not in (None, WorkflowExecutionStatus.RUNNING):
        return lines
    now = datetime.now(UTC)
    waits = await session_waits(client, description, now)
    lines += [wait_text(wait, now) for wait in waits] or [Text("not waiting for any worker", style="green")]
    return lines
