"""The official SDK's self-hosted environment worker, unchanged, as a process of its own: what a user runs on their
machine, given only the gateway's URL and an environment key. The key comes from `ANTHROPIC_ENVIRONMENT_KEY` (never
argv, where `ps` would show it); the client's own API key is not a corral key, so nothing but the environment key
and the work items' session tokens can open a route.

Tests wait on its log instead of sleeping: the SDK's own loggers (the poller, the lease, the worker and the session
tool runner) at INFO on stderr, each line `<time> <worker id> <logger> <level> <message>`, so one line says a work
item was claimed (`claimed work work_id=...`), one that a tool call runs (`executing tool tool=... tool_use_id=...`),
one that the poll found nothing (`idle; polling ...`), and the lease's end says why.

Usage: `ANTHROPIC_ENVIRONMENT_KEY=... python -m tests.self_hosted_worker --base-url URL --environment ENV_ID
--workdir DIR [--worker-id NAME]`.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys

import anthropic

KEY_VARIABLE = "ANTHROPIC_ENVIRONMENT_KEY"
LOGGERS = ("anthropic.lib.environments", "anthropic.lib.tools._beta_session_runner")
NOT_A_KEY = "not-a-corral-key"
"""The client's API key: the worker must never need one (every call it makes is bearer-scoped)."""

# Log lines tests read: the SDK's own messages (its poller and its session tool runner).
CLAIMED = "claimed work work_id="
EXECUTING = "executing tool tool="
IDLE = "idle; polling environment_id="


def log_to_stderr(worker_id: str) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(f"%(asctime)s {worker_id} %(name)s %(levelname)s %(message)s"))
    for name in LOGGERS:
        logger = logging.getLogger(name)
        logger.setLevel(logging.INFO)
        logger.addHandler(handler)
        logger.propagate = False


async def serve(base_url: str, environment_id: str, workdir: str, worker_id: str) -> None:
    key = os.environ.get(KEY_VARIABLE)
    if not key:
        raise SystemExit(f"self_hosted_worker: set {KEY_VARIABLE} to the environment's key")
    client = anthropic.AsyncAnthropic(base_url=base_url, api_key=NOT_A_KEY)
    worker = client.beta.environments.work.worker(
        environment_id=environment_id, environment_key=key, workdir=workdir, worker_id=worker_id
    )
    await worker.run()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base-url", required=True, help="the gateway, e.g. http://127.0.0.1:8780")
    parser.add_argument("--environment", required=True, help="the self-hosted environment's id (env_...)")
    parser.add_argument("--workdir", required=True, help="where the built-in tools run (the worker's machine)")
    parser.add_argument("--worker-id", default=f"worker-{os.getpid()}", help="sent on each poll, and in each line")
    args = parser.parse_args()
    log_to_stderr(args.worker_id)
    asyncio.run(serve(args.base_url, args.environment, args.workdir, args.worker_id))


if __name__ == "__main__":
    main()
