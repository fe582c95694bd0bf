"""The official `anthropic` SDK's self-hosted environment worker, unchanged, serving a corral environment from this
machine: it polls the environment's work queue, claims a session's work item, runs the session's built-in tool calls
(`bash`, `read`, `write`, `edit`, `glob`, `grep`) here, in the current directory, and posts each result back.
It holds only the environment's key, never an API key. Make the environment and its key first (docs/self_hosted.md):
`export ANTHROPIC_ENVIRONMENT_KEY=$(corral environment key create ENV_ID --workspace demo)`, then run
`python examples/self_hosted_worker.py ENV_ID` (ANTHROPIC_BASE_URL for a gateway other than `corral up`'s).
It runs until you stop it (Ctrl-C), and logs a line per work item it claims and per tool call it runs.
"""

import asyncio
import logging
import os
import sys

from anthropic import AsyncAnthropic

logging.basicConfig(format="%(asctime)s %(message)s")
logging.getLogger("anthropic.lib").setLevel(logging.INFO)  # the worker's own lines, not every HTTP request's

environment_id = sys.argv[1]  # a self-hosted environment: created with config {"type": "self_hosted"}
key = os.environ["ANTHROPIC_ENVIRONMENT_KEY"]  # from `corral environment key create ENV_ID --workspace W`
client = AsyncAnthropic(base_url=os.environ.get("ANTHROPIC_BASE_URL", "http://127.0.0.1:8780"))  # no API key
worker = client.beta.environments.work.worker(environment_id=environment_id, environment_key=key, workdir=os.getcwd())
asyncio.run(worker.run())  # claims each session's work item in turn, and runs its built-in tool calls here
