"""`corral deployments`: deployments as the operator sees them, through Temporal and this machine's knowledge
database: `ls`, `run` (a manual run, waited for), `pause`, `unpause` and `runs`. Deployments are made through the
API (`client.beta.deployments.create`), which checks them; a run's activity is served by the gateway's own worker
(queue `corral-gateway`), so `run` needs the gateway `corral up` started.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.app import app, client_of
from cli.context import CliError, Settings, run, settings_of

if TYPE_CHECKING:
    from temporalio.client import Client

    from corral.records import RecordView

deployments_app = typer.Typer(name="deployments", help="Deployments: agents that run on a schedule or on demand.",
                              no_args_is_help=True)  # fmt: skip
app.add_typer(deployments_app, rich_help_panel="The gateway")

DeploymentId = Annotated[str, typer.Argument(metavar="DEPLOYMENT", help="The deployment's id (depl_…).",
                                             show_default=False)]  # fmt: skip
HarnessQueue = Annotated[str | None, typer.Option(help="The harness task queue (default: corral-harness).")]
GatewayQueue = Annotated[str | None, typer.Option(help="The gateway's own task queue (default: corral-gateway).")]


async def _deployment(client: Client, deployment_id: str) -> RecordView:
    from corral.names import DEPLOYMENT_ID_PREFIX
    from corral.records import RecordNotFound, Records

    if not deployment_id.startswith(DEPLOYMENT_ID_PREFIX):
        raise CliError(f"{deployment_id!r} is not a deployment id (depl_…)", exit_code=2)
    try:
        return await Records(client).get_any(deployment_id, kind="deployment")
    except RecordNotFound as exc:
        raise CliError(f"no deployment {deployment_id}", hint="`corral deployments ls` lists them") from exc


def _runs_store(settings: Settings) -> Any:
    from corral.deployment_runs import DeploymentRuns
    from corral.knowledge_db import open_knowledge_db
    from corral.names import ENV_KNOWLEDGE_DB

    named = os.environ.get(ENV_KNOWLEDGE_DB)
    return DeploymentRuns(open_knowledge_db(Path(named) if named else settings.state_dir / "knowledge.db"))


@deployments_app.command("ls")
def ls(
    ctx: typer.Context,
    workspace: Annotated[str | None, typer.Option(help="Only this workspace's deployments.")] = None,
) -> None:
    """List deployments, newest first: status, schedule, agent."""
    settings = settings_of(ctx)

    async def go() -> None:
        from corral.records import Records

        records = Records(await client_of(settings))
        found, page = [], None
        while True:
            if workspace is None:
                batch, page = await records.list_any_workspace("deployment", limit=100, page=page)
            else:
                batch, page = await records.list("deployment", workspace, limit=100, page=page)
            found += batch
            if page is None:
                break
        if not found:
            settings.out.print("no deployments")
            return
        from rich.table import Table
        from rich.text import Text

        table = Table()
        for column in ("id", "name", "workspace", "status", "schedule", "agent"):
            table.add_column(column, no_wrap=column in ("id", "agent"))
        for record in found:
            body = record.body
            cron = body.get("schedule")
            schedule = f"{cron['expression']} {cron['timezone']}" if cron else "manual only"
            agent = f"{body['agent']['id']} v{body['agent']['version']}"
            table.add_row(Text(record.id), Text(body["name"]), Text(record.workspace), Text(body.get("status", "")),
                          Text(schedule), Text(agent))  # fmt: skip
        settings.out.print(table)

    run(settings, go())


@deployments_app.command("run")
def run_now(ctx: typer.Context, deployment_id: DeploymentId, harness_queue: HarnessQueue = None,
            gateway_queue: GatewayQueue = None) -> None:  # fmt: skip
    """Run a deployment now (as `deployments.run` does) and print its run: the session it made, or its error."""
    import json

    settings = settings_of(ctx)

    async def go() -> None:
        from corral.contract.deployments import (
            TRIGGER_MANUAL,
            DeploymentRunResult,
            FireDeploymentInput,
            fire_workflow_id,
        )
        from corral.names import (
            DEPLOYMENT_FIRE_WORKFLOW,
            DEPLOYMENT_RUN_ID_PREFIX,
            GATEWAY_TASK_QUEUE,
            HARNESS_TASK_QUEUE,
        )
        from corral.record_ids import new_record_id

        client = await client_of(settings)
        record = await _deployment(client, deployment_id)
        if record.archived_at is not None:
            raise CliError(f"{deployment_id} is archived", exit_code=2)
        run_id = new_record_id(DEPLOYMENT_RUN_ID_PREFIX.rstrip("_"))
        fire = FireDeploymentInput(deployment_id=record.id, workspace=record.workspace, trigger=TRIGGER_MANUAL,
                                   run_id=run_id, gateway_task_queue=gateway_queue or GATEWAY_TASK_QUEUE)  # fmt: skip
        result = await client.execute_workflow(
            DEPLOYMENT_FIRE_WORKFLOW, fire, id=fire_workflow_id(record.id, run_id),
            task_queue=harness_queue or HARNESS_TASK_QUEUE, result_type=DeploymentRunResult,
            static_summary=f"manual run of deployment {record.body['name']} ({record.id}) from the CLI",
        )  # fmt: skip
        settings.out.print_json(json.dumps(result.run))

    run(settings, go())


async def _set_paused(settings: Settings, deployment_id: str, paused: bool) -> None:
    from corral.records import Records
    from corral.webhooks import Webhooks, webhook_event

    client = await client_of(settings)
    record = await _deployment(client, deployment_id)
    if record.archived_at is not None:
        raise CliError(f"{deployment_id} is archived", exit_code=2)
    if (record.body.get("status") == "paused") == paused:
        settings.out.print(f"{deployment_id}: {record.body.get('status')} already")
        return
    reason = {"type": "manual"} if paused else None
    body = {**record.body, "status": "paused" if paused else "active", "paused_reason": reason}
    await Records(client).put(record.id, record.workspace, body, kind="deployment")
    if body.get("schedule") is not None:
        schedule = client.get_schedule_handle(record.id)
        note = f"{'paused' if paused else 'unpaused'} from the CLI"
        await (schedule.pause(note=note) if paused else schedule.unpause(note=note))
    event = webhook_event(f"deployment.{'paused' if paused else 'unpaused'}", record.id, record.workspace)
    await Webhooks(client, _runs_store(settings).db).emit([event])
    settings.out.print(f"{deployment_id}: {body['status']}")


@deployments_app.command("pause")
def pause(ctx: typer.Context, deployment_id: DeploymentId) -> None:
    """Pause a deployment: its schedule stops firing (a manual run still runs)."""
    settings = settings_of(ctx)
    run(settings, _set_paused(settings, deployment_id, True))


@deployments_app.command("unpause")
def unpause(ctx: typer.Context, deployment_id: DeploymentId) -> None:
    """Unpause a deployment (after `pause`, or after a failed scheduled fire paused it)."""
    settings = settings_of(ctx)
    run(settings, _set_paused(settings, deployment_id, False))


@deployments_app.command("runs")
def runs(
    ctx: typer.Context,
    deployment_id: DeploymentId,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="How many, newest first.")] = 20,
) -> None:
    """A deployment's runs, newest first: when, what triggered it, the session it made or its error."""
    settings = settings_of(ctx)

    async def go() -> None:
        from rich.table import Table
        from rich.text import Text

        from corral.deployment_runs import RunFilter

        record = await _deployment(await client_of(settings), deployment_id)
        store = _runs_store(settings)
        found = await store.db.run(store.list, record.workspace, RunFilter(deployment_id=record.id), limit, None)
        if not found:
            settings.out.print("no runs")
            return
        table = Table()
        for column in ("id", "created", "trigger", "session or error"):
            table.add_column(column, no_wrap=column == "id")
        for one in found:
            trigger = one["trigger_context"]
            when = trigger.get("scheduled_at") or "manual"
            outcome = one["session_id"] or f"{one['error']['type']}: {one['error']['message']}"
            table.add_row(Text(one["id"]), Text(one["created_at"]), Text(f"{trigger['type']} {when}"), Text(outcome))
        settings.out.print(table)

    run(settings, go())
