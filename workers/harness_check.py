"""Before a deploy: replay the recent histories of corral's workflows with this code, and report non-determinism.

A new harness worker replays every running session's history when it first picks the session up, and a change to
workflow code that would make a different decision for an old event (a command added, removed or reordered
without `workflow.patched`) wedges that session with a non-determinism error. `check_harness` finds this before
the deploy: it lists the executions of corral's workflow types through visibility (every running one, and the
closed ones since a moment), fetches each history and replays it with a `Replayer` set up as the harness worker
is (`workers/roles.py`). `corral harness check` (cli/harness.py) renders the report; tests call this directly.

An execution whose history is gone by the time it is fetched (deleted at the end of its retention, or by hand) is
skipped and counted, not failed: there is nothing left that new code could break.
"""

from __future__ import annotations

import re
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

from temporalio.client import Client, WorkflowExecution, WorkflowHistory
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from corral.contract.records import RECORD_WORKFLOW
from corral.names import SESSION_WORKFLOW
from workers.roles import HARNESS_CHECK_RUNNER, HARNESS_WORKFLOWS, harness_interceptors

HARNESS_WORKFLOW_TYPES: tuple[str, ...] = (SESSION_WORKFLOW, RECORD_WORKFLOW)
"""The workflow types the harness worker runs: what the check lists."""

DEFAULT_SINCE = timedelta(hours=24)
DEFAULT_LIMIT = 200

Outcome = Literal["clean", "failed", "skipped"]


def harness_replayer(client: Client, workflows: Sequence[type] | None = None) -> Replayer:
    """A Replayer that runs workflow code as the harness worker does: its workflow classes (or `workflows`), its
    interceptors and the client's data converter (corral's, as every worker's), in the sandbox the harness itself
    does without (`HARNESS_CHECK_RUNNER`), so that a non-deterministic call is named here."""
    return Replayer(
        workflows=list(HARNESS_WORKFLOWS if workflows is None else workflows),
        workflow_runner=HARNESS_CHECK_RUNNER,
        interceptors=harness_interceptors(),
        namespace=client.namespace,  # workflow code reads it (web UI links, sandbox labels)
        data_converter=client.data_converter,
    )


@dataclass(frozen=True)
class ExecutionCheck:
    """One execution and what its replay showed. `message` says why it failed or was skipped."""

    workflow_id: str
    run_id: str
    workflow_type: str
    outcome: Outcome
    message: str = ""
    nondeterminism: bool = False
    """The failure is a non-determinism error (else the replay failed another way, e.g. an exception in the
    workflow code or a payload it could not decode)."""


@dataclass(frozen=True)
class Listing:
    """The executions to check, as visibility listed them. `matched` may exceed them when `limit` cut the list."""

    queries: tuple[str, ...]
    """For each workflow type, the visibility queries of its running executions and of its closed ones
    (`executions_query`)."""
    matched: int
    executions: list[WorkflowExecution]


@dataclass(frozen=True)
class HarnessCheckReport:
    """What `check_harness` found: the listing and, in the same order, what each execution's replay showed."""

    listing: Listing
    checks: list[ExecutionCheck]

    @property
    def failures(self) -> list[ExecutionCheck]:
        return [check for check in self.checks if check.outcome == "failed"]

    @property
    def skipped(self) -> list[ExecutionCheck]:
        return [check for check in self.checks if check.outcome == "skipped"]

    @property
    def ok(self) -> bool:
        """No history failed to replay (skipped ones do not count against it)."""
        return not self.failures

    def counts(self) -> dict[str, Counter[Outcome]]:
        """Per workflow type, how many executions replayed clean, failed or were skipped."""
        counts: dict[str, Counter[Outcome]] = {}
        for check in self.checks:
            counts.setdefault(check.workflow_type, Counter())[check.outcome] += 1
        return counts


Progress = Callable[[int, int, ExecutionCheck], None]
"""Called after each execution: (done, total, its check)."""


def executions_query(
    since: datetime, workflow_types: Sequence[str] = HARNESS_WORKFLOW_TYPES, task_queue: str | None = None
) -> tuple[str, str]:
    """The two visibility queries of what the check replays: the running executions of these types, and those
    closed at or after `since` (continued-as-new runs included: each is a history the new code must replay)."""
    if task_queue is not None and "'" in task_queue:
        raise ValueError(f"{task_queue!r} is not a task queue name: it contains a quote")
    types = ", ".join(f"'{kind}'" for kind in workflow_types)
    scope = f"WorkflowType IN ({types})" + (f" AND TaskQueue = '{task_queue}'" if task_queue is not None else "")
    cutoff = since.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{scope} AND ExecutionStatus = 'Running'", f"{scope} AND CloseTime >= '{cutoff}'"


async def check_harness(
    client: Client,
    *,
    since: timedelta = DEFAULT_SINCE,
    limit: int = DEFAULT_LIMIT,
    workflow_types: Sequence[str] = HARNESS_WORKFLOW_TYPES,
    task_queue: str | None = None,
    workflows: Sequence[type] | None = None,
    on_progress: Progress | None = None,
) -> HarnessCheckReport:
    """Replay the recent executions' histories with this code (or with `workflows`, the classes a test swaps in):
    `list_executions`, then `replay_executions`. Errors reaching Temporal propagate (the CLI turns them into a
    message)."""
    listing = await list_executions(
        client, since=since, limit=limit, workflow_types=workflow_types, task_queue=task_queue
    )
    checks = await replay_executions(client, listing.executions, workflows=workflows, on_progress=on_progress)
    return HarnessCheckReport(listing, checks)


async def list_executions(
    client: Client,
    *,
    since: timedelta = DEFAULT_SINCE,
    limit: int = DEFAULT_LIMIT,
    workflow_types: Sequence[str] = HARNESS_WORKFLOW_TYPES,
    task_queue: str | None = None,
) -> Listing:
    """At most `limit` executions of each of `workflow_types` (see `executions_query`; each type its own share, so
    the many long-running records never crowd the sessions out): the running ones first, since a new worker replays
    them as soon as it is deployed, then those closed in the last `since`."""
    unknown = sorted(set(workflow_types) - set(HARNESS_WORKFLOW_TYPES))
    if unknown:
        raise ValueError(f"not a workflow type of the harness: {', '.join(unknown)}")
    queries: list[str] = []
    matched = 0
    executions: list[WorkflowExecution] = []
    listed: set[str] = set()
    for kind in workflow_types:
        taken = 0
        for query in executions_query(datetime.now(UTC) - since, [kind], task_queue):
            queries.append(query)
            matched += (await client.count_workflows(query)).count
            async for execution in client.list_workflows(query, limit=limit):
                if taken == limit:
                    break
                if execution.run_id not in listed:  # one that closed between the two listings is in both
                    listed.add(execution.run_id)
                    executions.append(execution)
                    taken += 1
    return Listing(tuple(queries), matched, executions)


async def replay_executions(
    client: Client,
    executions: Sequence[WorkflowExecution],
    *,
    workflows: Sequence[type] | None = None,
    on_progress: Progress | None = None,
) -> list[ExecutionCheck]:
    """Fetch each execution's history and replay it, one by one through one replay worker; an execution whose
    history is gone is skipped."""
    checks: list[ExecutionCheck] = []

    def record(check: ExecutionCheck) -> None:
        checks.append(check)
        if on_progress is not None:
            on_progress(len(checks), len(executions), check)

    replaying: deque[WorkflowExecution] = deque()
    """The executions whose histories went to the replayer, in order; it answers for them in the same order. (A
    history's own run id cannot tell: after a reset, its first event names the run it was reset from.)"""

    async def histories() -> AsyncIterator[WorkflowHistory]:
        """Each execution's history in turn; one that is gone is recorded as skipped here and not replayed."""
        for execution in executions:
            try:
                history = await client.get_workflow_handle(execution.id, run_id=execution.run_id).fetch_history()
            except RPCError as error:
                if error.status != RPCStatusCode.NOT_FOUND:
                    raise
                record(_check(execution, "skipped", "its history is gone (deleted since it was listed)"))
                continue
            if not history.events:
                record(_check(execution, "skipped", "its history is empty"))
                continue
            replaying.append(execution)
            yield history

    async with harness_replayer(client, workflows).workflow_replay_iterator(histories()) as results:
        async for result in results:
            execution = replaying.popleft()
            failure = result.replay_failure
            if failure is None:
                record(_check(execution, "clean"))
            else:
                nondeterminism = isinstance(failure, NondeterminismError)
                record(_check(execution, "failed", failure_summary(failure), nondeterminism=nondeterminism))
    return checks


def _check(execution: WorkflowExecution, outcome: Outcome, message: str = "", **extra: bool) -> ExecutionCheck:
    return ExecutionCheck(execution.id, execution.run_id, execution.workflow_type, outcome, message=message, **extra)


_CORE_MESSAGE = re.compile(r'Failure \{ message: "((?:[^"\\]|\\.)*)"')
"""The quoted message in the SDK core's debug dump of a failure (Rust's escapes inside)."""


def failure_summary(failure: BaseException, lines: int = 2, width: int = 300) -> str:
    """The first lines of a replay failure: enough to name the event and the command that disagree.

    The SDK core reports a non-determinism error as a debug dump of its failure (`Workflow activation completion
    failed: Failure { failure: Some(Failure { message: "[TMPRL1100] Nondeterminism error: …", source: …`): the
    quoted message is what a person needs, so it is taken out of the dump when there is one.
    """
    text = str(failure) or type(failure).__name__
    quoted = _CORE_MESSAGE.search(text)
    if quoted is not None:
        text = re.sub(r"\\(.)", lambda escape: "\n" if escape.group(1) == "n" else escape.group(1), quoted.group(1))
    kept = "\n".join([line.strip() for line in text.splitlines() if line.strip()][:lines])
    return kept if len(kept) <= width else kept[: width - 1] + "…"
