"""Stable public names: task queues, activity names, search attributes and environment variables.

Users script against these (the `temporal` CLI, their own workers), so they change only with a migration note.
"""

import re
from typing import Final, Literal, get_args

# Task queues, one per role (docs/operations.md, "The roles and how they scale").
HARNESS_TASK_QUEUE: Final = "corral-harness"
MODEL_TASK_QUEUE: Final = "corral-model"
SANDBOX_TASK_QUEUE: Final = "corral-sandbox"
PROXY_TASK_QUEUE: Final = "corral-proxy"
UTILITY_HAND_TASK_QUEUE: Final = "corral-utility"
GATEWAY_TASK_QUEUE: Final = "corral-api"
"""The gateway's own activities (a deployment run opens its session through the gateway's session creation, with the
same checks and errors as `POST /v1/sessions`): every gateway process serves it."""

CORRAL_TASK_QUEUES: Final = (
    HARNESS_TASK_QUEUE,
    MODEL_TASK_QUEUE,
    SANDBOX_TASK_QUEUE,
    PROXY_TASK_QUEUE,
    UTILITY_HAND_TASK_QUEUE,
    GATEWAY_TASK_QUEUE,
)
RESERVED_TASK_QUEUE_PREFIXES: Final = ("corral-", "/_sys/")
"""Task queues no hand may use, by anyone: every `corral-` queue is corral's (the roles above, the sandbox engine
pools `corral-sandbox.<engine>` and engines `corral-sandbox@<engine id>`, model pools such as `corral-model-eu`,
and any role added later), and `/_sys/` is Temporal's own. A hand there would receive `execute` activities meant
for corral's workers, or send them work they would run as corral's."""


def reserved_task_queue(queue: str) -> bool:
    """Whether `queue` is corral's (or Temporal's) own, so that no hand may be declared or registered on it."""
    name = queue.strip()
    return name in CORRAL_TASK_QUEUES or name.startswith(RESERVED_TASK_QUEUE_PREFIXES)


def reserved_task_queue_problem(queue: str) -> str | None:
    """Why `queue` cannot be a hand's, or None when it is not reserved; one message for every place that checks."""
    if not reserved_task_queue(queue):
        return None
    return (
        f"{queue!r} is reserved: every `corral-` task queue is corral's own (harness, model, sandbox, proxy, utility) "
        "and `/_sys/` is Temporal's; a hand serves a queue of its own"
    )


SANDBOX_ENGINE_NAME: Final = re.compile(r"^[a-z0-9](?:[a-z0-9-]{0,30}[a-z0-9])?$")
"""A sandbox engine pool's name: 1-32 lowercase letters, digits and inner hyphens (it becomes part of a queue name)."""


def sandbox_engine_problem(name: str) -> str | None:
    """Why `name` cannot name a sandbox engine pool, or None when it can; one message for every place that checks."""
    if SANDBOX_ENGINE_NAME.match(name):
        return None
    return (
        f"a sandbox engine pool's name is 1-32 lowercase letters, digits and hyphens, starting and ending with a "
        f"letter or digit, not {name!r}"
    )


def sandbox_provision_queue(engine: str | None) -> str:
    """Where a session's sandbox is provisioned: `corral-sandbox`, or `corral-sandbox.<engine>` for the workers
    started with `CORRAL_SANDBOX_ENGINE=<engine>` (the engine pool its environment names)."""
    return SANDBOX_TASK_QUEUE if engine is None else f"{SANDBOX_TASK_QUEUE}.{engine}"


# Workflow type and its handlers.
SESSION_WORKFLOW: Final = "SessionWorkflow"
DEPLOYMENT_FIRE_WORKFLOW: Final = "DeploymentFireWorkflow"
"""What a deployment's Temporal Schedule starts at each fire (and a manual run starts): it opens one deployment run."""
WEBHOOK_DELIVERY_WORKFLOW: Final = "WebhookDeliveryWorkflow"
"""One per (webhook event, endpoint): it owes the endpoint that delivery until it lands or is given up."""
SIGNAL_USER_MESSAGE: Final = "user_message"
SIGNAL_INTERRUPT: Final = "interrupt"
UPDATE_SEND_EVENTS: Final = "send_events"
UPDATE_SESSION: Final = "update_session"
UPDATE_SPAWN_THREAD: Final = "spawn_thread"
"""Start a session thread (a durable child workflow) from a Temporal client, as the coordinator's tool does."""
UPDATE_ADD_FILE: Final = "add_file_resource"
"""Mount one more file into a running session (`sessions.resources.add`); the gateway resolved it."""
UPDATE_REMOVE_FILE: Final = "remove_file_resource"
"""Mount no more a file resource (`sessions.resources.delete`): it is gone from the sandbox at the next call."""
UPDATE_ARCHIVE_THREAD: Final = "archive_thread"
"""Archive a session thread: its work stops and it takes no more messages (`threads.archive`)."""
SIGNAL_THREAD_REPORT: Final = "thread_report"
"""Internal: what a thread tells its session (status, replies, cross-posted tool calls, hand requests, usage)."""
SIGNAL_THREAD_INPUT: Final = "thread_input"
"""Internal: what a session tells one of its threads (messages, routed answers, interrupts, hand results)."""
WORKFLOW_RUN_WORKFLOW: Final = "WorkflowRun"
"""A workflow run: a plan the coordinator wrote, run durably as a child workflow of its session (workflows/runs.py)."""
UPDATE_START_WORKFLOW_RUN: Final = "start_workflow_run"
"""Start a workflow run from a Temporal client, as the coordinator's `start_workflow_run` tool does."""
SIGNAL_RUN_REPORT: Final = "workflow_run_report"
"""Internal: what a workflow run tells its session (events to log, threads to spawn, its end)."""
SIGNAL_RUN_INPUT: Final = "workflow_run_input"
"""Internal: what a session tells one of its workflow runs (its threads' replies and ends, stop)."""
QUERY_OUTPUTS: Final = "outputs"
"""A session's outputs kept so far: path under `/mnt/session/outputs/` -> the id of the file it became."""
DREAM_WORKFLOW: Final = "DreamWorkflow"
"""A dream (workflows/dreams.py): its id is the dream's; a session of its own does the work."""
QUERY_DREAM: Final = "dream"
UPDATE_CANCEL_DREAM: Final = "cancel_dream"
UPDATE_ARCHIVE_DREAM: Final = "archive_dream"
# The error types (ApplicationError.type) of a refused update: CamelCase names, as Temporal's convention and the
# activities' types (corral/contract/errors.py). A refusal is raised by a validator, so it is never in history.
ARCHIVED: Final = "SessionArchived"
"""The error type of an update refused because the session is archived."""
DELETING: Final = "SessionDeleting"
"""The error type of an update refused because the session is being deleted."""
BUSY: Final = "SessionBusy"
"""The error type of a deletion refused because the session is running (interrupt it first)."""
BUDGET_CREATE_ONLY: Final = "BudgetCreateOnly"
"""The error type of a budget refused because the session has none (a budget is set when a session is made)."""
BUDGET_NOT_RAISED: Final = "BudgetNotRaised"
"""The error type of a budget refused because the session has already spent it."""
THREAD_NOT_FOUND: Final = "ThreadNotFound"
"""The error type of a thread update that names no thread of the session."""
THREAD_LIMIT_REACHED: Final = "ThreadLimitReached"
"""The error type of a spawn refused because the session has made as many threads as it may."""
NOT_MULTIAGENT: Final = "NotMultiagent"
"""The error type of a thread update on a session whose agent coordinates no threads."""
THREAD_ARCHIVED: Final = "ThreadArchived"
"""The error type of a message or an archive refused because the thread is archived (or is the primary)."""
OUTCOME_IN_PROGRESS: Final = "OutcomeInProgress"
"""The error type of a `user.define_outcome` refused because another outcome is still pursued (interrupt it)."""
NO_FILE_RESOURCES: Final = "NoFileResources"
"""A file resource added to a session that takes none (one not started by the API), or removed where it is not."""
NO_WORKFLOW_RUNS: Final = "NoWorkflowRuns"
"""The error type of a workflow run refused because the session's agent may not start runs."""
FORMER_ERROR_TYPES: Final = {
    "archived": ARCHIVED,
    "deleting": DELETING,
    "busy": BUSY,
    "budget_create_only": BUDGET_CREATE_ONLY,
    "budget_not_raised": BUDGET_NOT_RAISED,
}
"""The snake_case types these refusals had before, read as their names now: a harness build that is still pinned to
running sessions raises them to a newer gateway (read a refusal's type with `refusal_type`)."""


def refusal_type(error_type: str | None) -> str | None:
    """A refused session update's error type as it is named now, whichever harness build raised it."""
    return FORMER_ERROR_TYPES.get(error_type, error_type) if error_type is not None else None


QUERY_SESSION: Final = "session"
QUERY_EVENTS: Final = "events"
QUERY_MODEL_CONTEXT: Final = "model_context"
QUERY_CONTEXT_VIEW: Final = "context_view"
QUERY_THREADS: Final = "threads"
"""A session's threads, its primary thread first (`list[ThreadInfo]`); asked of the session's workflow."""
QUERY_WORKFLOW_RUNS: Final = "workflow_runs"
"""A session's workflow runs, oldest first, with their phases' progress (`list[WorkflowRunInfo]`)."""

# Activities. Every hand serves the same activity name on its own task queue.
ACTIVITY_MODEL_TURN: Final = "model_turn"
ACTIVITY_READ_LOG: Final = "read_log"
"""A page of another session's log (what a fork copies); served by the model workers, which read logs already."""
ACTIVITY_ARCHIVE_LOG: Final = "archive_log"
"""Write a run's events to the blob store before the session continues as new; served by the model workers."""
ACTIVITY_EXECUTE: Final = "execute"
ACTIVITY_OPEN_DEPLOYMENT_RUN: Final = "open_deployment_run"
"""A deployment fire's one activity, on the gateway's queue: it makes the run's session through the gateway's own
checks and records the run."""
ACTIVITY_PROVISION_SANDBOX: Final = "provision_sandbox"
ACTIVITY_STOP_SANDBOX: Final = "stop_sandbox"
ACTIVITY_RELEASE_SANDBOX: Final = "release_sandbox"
ACTIVITY_FORK_WORKSPACE: Final = "fork_workspace"
ACTIVITY_COLLECT_KNOWLEDGE: Final = "collect_knowledge"
"""Read what the agent wrote under `/mnt/session/outputs/` and into writable memory stores (the sandbox's)."""
ACTIVITY_EXPORT_MEMORY: Final = "export_memory"
"""Write a session's memory stores to the blob store for the sandbox to mount (served by the model workers)."""
ACTIVITY_PREPARE_DREAM: Final = "prepare_dream"
"""A dream's session's knowledge: its sessions' transcripts as files, its store mounted read-only (model workers)."""
ACTIVITY_AWAIT_IDLE: Final = "await_session_idle"
"""Wait, heartbeating, until a session's turn has ended (model workers, which read sessions already)."""
ACTIVITY_APPLY_DREAM: Final = "apply_dream"
"""Write what a dream's session wrote as the output store, in one transaction (model workers)."""
ACTIVITY_COMMIT_KNOWLEDGE: Final = "commit_knowledge"
"""Make collected outputs files and collected memory changes versions (served by the model workers)."""
ACTIVITY_EMIT_WEBHOOKS: Final = "emit_webhooks"
"""Hand a session's webhook events to the endpoints that want them (served by the model workers, which hold the
knowledge database where endpoints are)."""
ACTIVITY_PROXY_BIND_SESSION: Final = "proxy_bind_session"
ACTIVITY_PROXY_RELEASE_SESSION: Final = "proxy_release_session"
ACTIVITY_MCP_LIST_TOOLS: Final = "mcp_list_tools"
ACTIVITY_MCP_CALL_TOOL: Final = "mcp_call_tool"
ACTIVITY_PROXY_VALIDATE_CREDENTIAL: Final = "proxy_validate_credential"
CREDENTIAL_VALIDATION_WORKFLOW: Final = "CredentialValidationWorkflow"
ACTIVITY_DELIVER_WEBHOOK: Final = "deliver_webhook"
"""One signed POST of a webhook event to one endpoint (the proxy: it alone reads the signing secret)."""
ACTIVITY_GIVE_UP_WEBHOOK: Final = "give_up_webhook"
"""A delivery that kept failing: record it failed and disable its endpoint (the proxy, beside the deliveries)."""
FILE_EXPIRY_WORKFLOW: Final = "FileExpiryWorkflow"
"""A file's durable expiry timer (workflows/file_expiry.py): started with the file's remaining time as its start
delay, it then removes the file. Its id is `file_expiry_workflow_id(file_id)`."""
ACTIVITY_EXPIRE_FILE: Final = "expire_file"
"""Remove one file whose time has come (served by the model workers, which hold the blob store)."""
"""Runs one validation of a credential on the proxy, which alone may read its secret (the gateway starts it)."""

# Search attributes registered on the namespace so sessions can be listed by status and model.
SEARCH_ATTRIBUTE_STATUS: Final = "CorralStatus"
SEARCH_ATTRIBUTE_MODEL: Final = "CorralModel"

SessionStatus = Literal["idle", "running", "rescheduling", "terminated"]
"""A session's status: the one spelling of the vocabulary that the workflow sets, `CorralStatus` holds, the API shows
and the CLI filters by. Here, with the names, so that the CLI lists sessions without loading the contract."""
SESSION_STATUSES: Final = frozenset(get_args(SessionStatus))
WorkflowRunStatus = Literal["running", "idle", "ended"]
"""Where a workflow run is: working, waiting on nothing of its own, or ended (its events' `status_*`)."""
"""Every status, derived from the `Literal` so that the values are written once."""
WORKING_STATUSES: Final[frozenset[SessionStatus]] = frozenset({"running", "rescheduling"})
"""The statuses of a session at work (a turn in progress, or waiting to retry one): it is not deleted then."""

SIGNAL_WEBHOOKS: Final = "webhooks"
"""Tell a running session that its workspace now has a webhook endpoint: it emits its events from then on."""
HANDING_OVER: Final = "SessionHandingOver"
"""The error type of a `send_events` update refused while the session continues as new: send it again."""

OPERATOR_WORKSPACE: Final = "corral-operator"
"""The workspace the operator's own records (the hand registry, corral.hand_registry) are filed under: no API key
is ever made for it, so no tenant can open it."""

# Id prefixes: an id says what it names, so the gateway refuses an id of the wrong kind before any lookup.
SESSION_ID_PREFIX: Final = "sesn_"
EVENT_ID_PREFIX: Final = "sevt_"
AGENT_ID_PREFIX: Final = "agent_"
ENVIRONMENT_ID_PREFIX: Final = "env_"
VAULT_ID_PREFIX: Final = "vlt_"
CREDENTIAL_ID_PREFIX: Final = "vcrd_"
"""A vault's credential (the proxy's `VaultStore` makes these ids)."""
API_KEY_ID_PREFIX: Final = "apikey_"
"""An API key's record (corral.apikeys); a key itself is `corral-<record id>-<secret>`."""
HAND_ID_PREFIX: Final = "hand_"
"""A hand queue's registration (corral.hand_registry): derived from the queue's name."""
SESSION_RESOURCE_ID_PREFIX: Final = "repo"
"""A session's repository resource: `repo1`, `repo2`… in the order the session was given them."""
THREAD_ID_PREFIX: Final = "sthr_"
"""A session thread: a child workflow's id (`sthr_<hex>`); the primary thread's is made from its session's id."""
OUTCOME_ID_PREFIX: Final = "outc_"
WORKFLOW_RUN_ID_PREFIX: Final = "wrun_"
"""Not documented upstream (its events carry the id only); corral's, like its phases' `wrph_`."""
WORKFLOW_RUN_PHASE_ID_PREFIX: Final = "wrph_"
WORK_ID_PREFIX: Final = "work_"
"""A self-hosted environment's work item (corral.contract.work), made by its queue: `work_<hex>`."""
ENVIRONMENT_KEY_ID_PREFIX: Final = "envkey_"
"""An environment key's record: a key opens its environment's work queue only (gateway/work_auth.py)."""
FILE_ID_PREFIX: Final = "file_"
"""An uploaded file, or one a session wrote under its outputs directory (corral.files)."""
FILE_RESOURCE_ID_PREFIX: Final = "sres_"
"""A session's file resource (a mount of one file); repositories keep `repo1`, `repo2`…"""
SKILL_ID_PREFIX: Final = "skill_"
SKILL_VERSION_ID_PREFIX: Final = "skillver_"
"""Not documented upstream (the SDK takes any version string, or `latest`); corral's."""
MEMORY_STORE_ID_PREFIX: Final = "memstore_"
MEMORY_ID_PREFIX: Final = "mem_"
MEMORY_VERSION_ID_PREFIX: Final = "memver_"
DREAM_ID_PREFIX: Final = "drm_"
DEPLOYMENT_ID_PREFIX: Final = "depl_"
"""Not documented upstream; corral's. A deployment's Temporal Schedule has the deployment's id."""
DEPLOYMENT_RUN_ID_PREFIX: Final = "drun_"
WEBHOOK_ENDPOINT_ID_PREFIX: Final = "whep_"
"""A workspace's webhook endpoint (a corral API extension: the SDK has organisation endpoints only)."""
WEBHOOK_EVENT_ID_PREFIX: Final = "wevt_"
"""A webhook event: the `id` of its payload and the `webhook-id` of every delivery of it, retries included."""
ID_KINDS: Final = {
    SESSION_ID_PREFIX: "session",
    EVENT_ID_PREFIX: "event",
    AGENT_ID_PREFIX: "agent",
    ENVIRONMENT_ID_PREFIX: "environment",
    VAULT_ID_PREFIX: "vault",
    CREDENTIAL_ID_PREFIX: "credential",
    API_KEY_ID_PREFIX: "API key",
    HAND_ID_PREFIX: "hand registration",
    SESSION_RESOURCE_ID_PREFIX: "session resource",
    THREAD_ID_PREFIX: "session thread",
    OUTCOME_ID_PREFIX: "outcome",
    WORKFLOW_RUN_ID_PREFIX: "workflow run",
    WORK_ID_PREFIX: "work item",
    ENVIRONMENT_KEY_ID_PREFIX: "environment key",
    FILE_ID_PREFIX: "file",
    FILE_RESOURCE_ID_PREFIX: "file resource",
    SKILL_ID_PREFIX: "skill",
    SKILL_VERSION_ID_PREFIX: "skill version",
    MEMORY_STORE_ID_PREFIX: "memory store",
    MEMORY_ID_PREFIX: "memory",
    MEMORY_VERSION_ID_PREFIX: "memory version",
    DREAM_ID_PREFIX: "dream",
    DEPLOYMENT_ID_PREFIX: "deployment",
    DEPLOYMENT_RUN_ID_PREFIX: "deployment run",
    WEBHOOK_ENDPOINT_ID_PREFIX: "webhook endpoint",
    WEBHOOK_EVENT_ID_PREFIX: "webhook event",
}
"""What each prefix names, for errors that say which kind of id was given where another was expected."""

# Environment variables read by processes (never by workflow code).
ENV_TEMPORAL_ADDRESS: Final = "CORRAL_TEMPORAL_ADDRESS"
ENV_TEMPORAL_NAMESPACE: Final = "CORRAL_TEMPORAL_NAMESPACE"
ENV_SANDBOX_ENGINE: Final = "CORRAL_SANDBOX_ENGINE"
"""The engine pool a sandbox worker serves (`sandbox_provision_queue`); unset: the default pool, `corral-sandbox`."""
ENV_BLOB_STORE: Final = "CORRAL_BLOB_STORE"
"""Where sessions' archived logs are (corral.blobs): a directory or a file:// URL; default `blobs/` in the state dir."""
ENV_KNOWLEDGE_DB: Final = "CORRAL_KNOWLEDGE_DB"
"""The embedded database of what outlives a session (files' metadata, skills, memory stores: corral.knowledge_db);
default `knowledge.db` in the state dir."""
ENV_STATE_DIR: Final = "CORRAL_STATE_DIR"
"""Where a machine's local state is (the stack's pid files, logs and database, the sandbox image's build, blobs);
default `.corral`."""
ENV_STREAM_URL: Final = "CORRAL_STREAM_URL"
"""The stream relay (or relays, comma-separated) that live text deltas go through."""
ENV_STREAM_TOKEN: Final = "CORRAL_STREAM_TOKEN"
"""The stream relay's bearer token."""
ENV_SANDBOX_IMAGE: Final = "CORRAL_SANDBOX_IMAGE"
"""The image sandboxes run; unset: the one built on this machine."""
ENV_GIT_PROXY_PORT: Final = "CORRAL_GIT_PROXY_PORT"
"""Where the proxy worker's git proxy listens (default `DEFAULT_GIT_PROXY_PORT`)."""
ENV_HARNESS_DEPLOYMENT: Final = "CORRAL_HARNESS_DEPLOYMENT"
"""The harness's Worker Deployment; unset: an unversioned harness."""
DEFAULT_TEMPORAL_ADDRESS: Final = "127.0.0.1:7233"
DEFAULT_TEMPORAL_NAMESPACE: Final = "default"
DEFAULT_GIT_PROXY_PORT: Final = 8767
"""Where the proxy worker's git proxy listens and sandboxes' git origins point (`CORRAL_GIT_PROXY_PORT`)."""
ENV_GATEWAY_STREAMS_PER_KEY: Final = "CORRAL_GATEWAY_MAX_STREAMS_PER_KEY"
"""Event streams one API key may hold open at once on one gateway (default `gateway.http.DEFAULT_STREAMS_PER_KEY`)."""
ENV_MAX_THREADS_PER_SESSION: Final = "CORRAL_MAX_THREADS_PER_SESSION"
"""Threads a multi-agent session made through the gateway may spawn in all (default 16, `Multiagent.max_threads`)."""
ENV_MAX_WORKFLOW_RUNS_PER_SESSION: Final = "CORRAL_MAX_WORKFLOW_RUNS_PER_SESSION"
"""Workflow runs a session made through the gateway may start in all (default 8, `Multiagent.max_runs`)."""
ENV_MAX_THREADS_PER_RUN: Final = "CORRAL_MAX_THREADS_PER_WORKFLOW_RUN"
"""Threads one workflow run may spawn in all (default 10, `Multiagent.max_threads_per_run`)."""
ENV_WORK_LEASE_SECONDS: Final = "CORRAL_WORK_LEASE_SECONDS"
"""A self-hosted worker's lease when its heartbeat asks for none (default
`corral.contract.work.DEFAULT_LEASE_SECONDS`): a killed worker's item is taken back this long after its last
heartbeat. Read by the gateway."""
ENV_WEBHOOK_FIRST_RETRY: Final = "CORRAL_WEBHOOK_FIRST_RETRY_SECONDS"
"""Webhook delivery policy, read by the process that emits (corral.webhooks.delivery_policy)."""
ENV_WEBHOOK_LONGEST_WAIT: Final = "CORRAL_WEBHOOK_LONGEST_WAIT_SECONDS"
ENV_WEBHOOK_GIVE_UP_AFTER: Final = "CORRAL_WEBHOOK_GIVE_UP_AFTER_SECONDS"
ENV_FILE_QUOTA_BYTES: Final = "CORRAL_FILE_QUOTA_BYTES"
"""The bytes of files one workspace may hold (default `corral.files.DEFAULT_QUOTA_BYTES`, 10 GiB)."""
ENV_FILE_MAX_BYTES: Final = "CORRAL_FILE_MAX_BYTES"
"""The largest file one upload may carry (default `corral.files.DEFAULT_MAX_FILE_BYTES`, 500 MiB)."""
ENV_MODEL_STALL_TIMEOUT: Final = "CORRAL_MODEL_STALL_TIMEOUT_SECONDS"
DEFAULT_MODEL_STALL_TIMEOUT_SECONDS: Final = 120.0
"""A model response stream that sends no byte for this long (pings count) has stalled: the model worker ends the
attempt and the session retries it. Long enough for a large prompt's first token, far below the 10-minute turn."""
