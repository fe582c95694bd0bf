"""Console entry point `corral-gateway`: serve the Managed Agents HTTP API on corral (default 127.0.0.1:8780).

Vaults and credentials (`/v1/vaults`) need Vault, in the environment: `VAULT_ADDR` and an AppRole (`VAULT_ROLE_ID`
+ `VAULT_SECRET_ID`) or `VAULT_TOKEN`, `CORRAL_VAULT_MOUNT`. Give it a login that writes credentials and cannot read
them (`proxy/access.py`; `corral up` does), never the proxy's. Without one those routes answer 503 and everything
else works. No flag takes a Vault token: arguments show in `ps`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from collections.abc import Callable

import uvicorn

from corral import telemetry
from corral.contract.work import DEFAULT_LEASE_SECONDS, MAX_LEASE_SECONDS, MIN_LEASE_SECONDS
from corral.names import (
    ENV_GATEWAY_STREAMS_PER_KEY,
    ENV_MAX_THREADS_PER_RUN,
    ENV_MAX_THREADS_PER_SESSION,
    ENV_MAX_WORKFLOW_RUNS_PER_SESSION,
    ENV_STREAM_TOKEN,
    ENV_STREAM_URL,
    ENV_WORK_LEASE_SECONDS,
    GATEWAY_TASK_QUEUE,
    HARNESS_TASK_QUEUE,
    MODEL_TASK_QUEUE,
    PROXY_TASK_QUEUE,
)
from corral.temporal import connect, ensure_search_attributes, temporal_address
from gateway.app import DEFAULT_PORT, create_app
from gateway.deployment_runs import gateway_worker
from gateway.http import DEFAULT_STREAMS_PER_KEY
from gateway.multiagent_session import DEFAULT_LIMITS, SessionLimits, limit_problem
from gateway.vault_access import configured_login
from relay.partition import relay_urls


def _relays(value: str) -> str:
    """`--stream-url`: one relay URL or a comma-separated list, written back normalised (`relay_urls`)."""
    try:
        return ",".join(relay_urls(value))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="corral-gateway",
        description="Anthropic's Managed Agents API on corral: point an `anthropic` client's base_url here.",
        epilog="Vaults need VAULT_ADDR and VAULT_ROLE_ID and VAULT_SECRET_ID (or VAULT_TOKEN) in the environment: "
        "a write-only login (python -m proxy.access prints its policy).",
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--temporal", default=None, help="Temporal address (default: $CORRAL_TEMPORAL_ADDRESS)")
    parser.add_argument("--harness-queue", default=HARNESS_TASK_QUEUE)
    parser.add_argument("--model-queue", default=MODEL_TASK_QUEUE)
    parser.add_argument("--gateway-queue", default=GATEWAY_TASK_QUEUE,
                        help="the task queue of this gateway's own worker, which opens deployment runs "
                             f"(default: {GATEWAY_TASK_QUEUE})")  # fmt: skip
    parser.add_argument("--proxy-queue", default=PROXY_TASK_QUEUE,
                        help="the proxy role's task queue, which sends the webhook deliveries this gateway starts "
                             f"(default: {PROXY_TASK_QUEUE})")  # fmt: skip
    parser.add_argument("--stream-url", default=os.environ.get(ENV_STREAM_URL) or None, type=_relays,
                        help="the stream relay of live text, for `event_deltas[]`, or a comma-separated list of "
                             "relays (the model workers' list: every one is followed) (default: $CORRAL_STREAM_URL; "
                             "its token: $CORRAL_STREAM_TOKEN)")  # fmt: skip
    parser.add_argument("--max-streams-per-key", type=_positive, metavar="N",  # argparse types a string default too
                        default=os.environ.get(ENV_GATEWAY_STREAMS_PER_KEY) or str(DEFAULT_STREAMS_PER_KEY),
                        help="event streams one API key may hold open at once on this gateway; past it, 429 with "
                             f"retry-after (default: ${ENV_GATEWAY_STREAMS_PER_KEY}, "
                             f"else {DEFAULT_STREAMS_PER_KEY})")  # fmt: skip
    parser.add_argument("--work-lease-seconds", type=_lease, metavar="SECONDS",
                        default=os.environ.get(ENV_WORK_LEASE_SECONDS) or str(DEFAULT_LEASE_SECONDS),
                        help="a self-hosted worker's lease when its heartbeat asks for none: its item is taken back "
                             f"this long after its last heartbeat (default: ${ENV_WORK_LEASE_SECONDS}, "
                             f"else {DEFAULT_LEASE_SECONDS:g})")  # fmt: skip
    for option, field, variable, what, help in LIMITS:
        default = getattr(DEFAULT_LIMITS, field)
        parser.add_argument(option, dest=field, type=_limit(option, field, variable, what), metavar="N",
                            default=os.environ.get(variable) or str(default),
                            help=f"{help} (default: ${variable}, else {default})")  # fmt: skip
    return parser


LIMITS = (
    ("--max-threads-per-session", "max_threads", ENV_MAX_THREADS_PER_SESSION, "threads per session",
     "threads a multi-agent session may spawn in all; one more is refused with a tool error"),
    ("--max-workflow-runs-per-session", "max_runs", ENV_MAX_WORKFLOW_RUNS_PER_SESSION, "workflow runs per session",
     "workflow runs a multi-agent session may start in all; one more is a max_workflow_runs_error"),
    ("--max-threads-per-workflow-run", "max_threads_per_run", ENV_MAX_THREADS_PER_RUN, "threads per workflow run",
     "threads one workflow run may spawn in all; a plan that needs more is a thread_limit_error"),
)  # fmt: skip
"""Each limit of a multi-agent session: its option, its `SessionLimits` field, its variable, what it counts."""


def _limit(option: str, field: str, variable: str, what: str) -> Callable[[str], int]:
    """The argparse type of one limit (or its variable): a whole number within the contract's bounds."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            problem: str | None = "not a whole number"
        else:
            problem = limit_problem(field, number)
        if problem is not None:
            raise argparse.ArgumentTypeError(
                f"{value!r} is not a number of {what}: {problem} ({option} or ${variable})"
            )
        return number

    parse.__name__ = option  # argparse names the type in its error when the type raises something else
    return parse


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(
            f"a number of streams is a whole number of at least 1, not {value!r} (--max-streams-per-key or "
            f"${ENV_GATEWAY_STREAMS_PER_KEY})"
        )
    return number


def _lease(value: str) -> float:
    try:
        seconds = float(value)
    except ValueError:
        seconds = 0.0
    if not MIN_LEASE_SECONDS <= seconds <= MAX_LEASE_SECONDS:  # NaN too
        raise argparse.ArgumentTypeError(
            f"a lease is from {MIN_LEASE_SECONDS:g} to {MAX_LEASE_SECONDS:g} seconds, not {value!r} "
            f"(--work-lease-seconds or ${ENV_WORK_LEASE_SECONDS})"
        )
    return seconds


async def serve(args: argparse.Namespace) -> None:
    client = await connect(args.temporal or temporal_address())
    await ensure_search_attributes(client)
    limits = SessionLimits(args.max_threads, args.max_runs, args.max_threads_per_run)
    app = create_app(client, args.harness_queue, args.model_queue, args.max_streams_per_key, limits, args.gateway_queue,
                     args.proxy_queue)  # fmt: skip
    app.state.stream_url = args.stream_url  # read by the events stream (gateway/stream.py)
    app.state.stream_token = os.environ.get(ENV_STREAM_TOKEN) or None
    app.state.work_lease_seconds = args.work_lease_seconds  # read by the heartbeat route (gateway/work.py)
    # With JSON logs, uvicorn's loggers go through the root's JSON handler, not the handlers of its own log_config.
    observed = telemetry.current()
    json_logs = observed is not None and observed.json_logs
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level="info", access_log=False,
                            log_config=None if json_logs else uvicorn.config.LOGGING_CONFIG)  # fmt: skip
    log = logging.getLogger("gateway")
    log.info("corral gateway at http://%s:%d", args.host, args.port)
    login = configured_login()
    if login is None:
        log.warning("no Vault configured (VAULT_ADDR, VAULT_ROLE_ID and VAULT_SECRET_ID): /v1/vaults answers 503")
    else:
        log.info("vaults in Vault at %s, mount %s", login.address, login.mount)
    async with gateway_worker(app.state.gateway, client, args.gateway_queue):  # deployment fires' activity
        await uvicorn.Server(config).serve()


def main() -> None:
    telemetry.setup("corral-gateway")  # logs, and traces and metrics if configured: before the client connects
    asyncio.run(serve(build_parser().parse_args()))


if __name__ == "__main__":
    main()
