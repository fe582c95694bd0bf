"""`corral`: run the local stack and talk to sessions from a terminal.

Commands are thin: they parse options, then call `up.py` (the stack) or `session_ops.py` (sessions), and every
failure a user can meet goes through `context.run`, which turns it into a message and an exit code.

Start-up time matters in a command people type: these modules import only typer at the top, and each command
imports what it needs (the Temporal client, rich, the pydantic contract) when it runs. `bench/cli_startup.py`
measures it.
"""

from __future__ import annotations

# Importing the command modules registers their commands on the app.
import cli.api_keys
import cli.deployment_commands
import cli.dream_commands
import cli.environment_commands
import cli.file_commands
import cli.hands
import cli.harness
import cli.log_commands
import cli.memory_commands
import cli.outcome_commands
import cli.run_commands
import cli.session_commands
import cli.skill_commands
import cli.stack_commands
import cli.thread_commands
import cli.webhook_commands
import cli.work_commands  # noqa: F401 (the name `cli` is bound by the lines above too)
from cli.app import app

__all__ = ["app"]

if __name__ == "__main__":
    app()
