"""What every command shares: the global options, the two consoles, and the one place errors become messages.

Every failure a user can cause or meet (Temporal not running, an unknown session, a rejected update) is turned
into a one-line message and an exit code here, so no command prints a stack trace for them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
from collections.abc import Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.text import Text

from cli.errors import CliError
from corral.names import DEFAULT_TEMPORAL_ADDRESS, DEFAULT_TEMPORAL_NAMESPACE, ENV_STREAM_URL

if TYPE_CHECKING:
    from cli.stack import StackConfig, StatePaths

T = TypeVar("T")

DEFAULT_UI_URL = "http://127.0.0.1:8233"
OFFLINE_MODEL = "corral-offline-stand-in"
REAL_DEFAULT_MODEL = "claude-sonnet-4-6"


CAPTURED_WIDTH = 160
"""Output that is not a terminal has no width; rich would assume 80 and squeeze tables that scripts grep."""


def make_console(*, stderr: bool) -> Console:
    console = Console(stderr=stderr)
    if not console.is_terminal and "COLUMNS" not in os.environ:
        console = Console(stderr=stderr, width=CAPTURED_WIDTH)
    return console


@dataclass
class Settings:
    """The global options, resolved once in the typer callback and handed to every command via `ctx.obj`."""

    address_option: str | None
    namespace_option: str | None
    state_dir: Path
    out: Console = field(default_factory=lambda: make_console(stderr=False))
    err: Console = field(default_factory=lambda: make_console(stderr=True))

    @property
    def paths(self) -> StatePaths:
        from cli.stack import StatePaths

        return StatePaths(self.state_dir)

    def stack(self) -> StackConfig | None:
        from cli.stack import read_stack

        return read_stack(self.paths)

    @property
    def address(self) -> str:
        """--address / CORRAL_TEMPORAL_ADDRESS if given, else the address of the stack `corral up` started here."""
        if self.address_option:
            return self.address_option
        stack = self.stack()
        return stack.temporal_address if stack is not None else DEFAULT_TEMPORAL_ADDRESS

    @property
    def namespace(self) -> str:
        """--namespace / CORRAL_TEMPORAL_NAMESPACE if given, else the local stack's, else `default`."""
        if self.namespace_option:
            return self.namespace_option
        stack = self.stack()
        return stack.namespace if stack is not None else DEFAULT_TEMPORAL_NAMESPACE

    @property
    def ui_url(self) -> str:
        stack = self.stack()
        return stack.ui_url if stack is not None else DEFAULT_UI_URL

    def workflow_url(self, session_id: str) -> str:
        return f"{self.ui_url}/namespaces/{self.namespace}/workflows/{session_id}"

    def stream_url(self) -> str | None:
        """The stream relay of live deltas: `CORRAL_STREAM_URL`, else the one `corral up` started."""
        configured = os.environ.get(ENV_STREAM_URL)
        if configured:
            return configured
        stack = self.stack()
        return stack.stream_url if stack is not None else None

    def default_model(self) -> str:
        """The stand-in when the stack runs offline (or, with no stack recorded, when no API key is set)."""
        stack = self.stack()
        offline = stack.offline if stack is not None else not os.environ.get("ANTHROPIC_API_KEY")
        return OFFLINE_MODEL if offline else REAL_DEFAULT_MODEL

    @property
    def stdout_is_terminal(self) -> bool:
        return sys.stdout.isatty()

    @property
    def human(self) -> Console:
        """Where chatter goes: stdout on a terminal, stderr when stdout is captured by a script."""
        return self.out if self.stdout_is_terminal else self.err


def settings_of(ctx: typer.Context) -> Settings:
    settings = ctx.obj
    if not isinstance(settings, Settings):
        raise RuntimeError("the corral callback did not run")  # Only possible when a command is invoked alone.
    return settings


def fail(settings: Settings, error: CliError) -> NoReturn:
    """Print `error` in red on stderr (hint dimmed underneath) and exit with its code."""
    settings.err.print(Text("error: ", style="bold red") + Text(error.message, style="red"))
    if error.hint:
        settings.err.print(Text(error.hint, style="dim"))
    raise typer.Exit(error.exit_code)


def unreachable(address: str) -> CliError:
    return CliError(f"cannot reach Temporal at {address} — run `corral up` first")


def translate(error: BaseException, address: str, session_id: str | None = None) -> CliError | None:
    """The user-facing form of an error from the Temporal client, or None when it is a bug to show as such."""
    from pydantic import ValidationError
    from temporalio.client import WorkflowUpdateFailedError
    from temporalio.exceptions import ApplicationError
    from temporalio.service import RPCError, RPCStatusCode

    from corral.errors import SessionEnded, SessionStartFailed

    if isinstance(error, CliError):
        return error
    if isinstance(error, SessionStartFailed):
        return CliError(
            str(error),
            hint=f"`temporal workflow describe --workflow-id {error.session_id}` shows the failure; "
            "start a new session with an input that fits (`corral start --input FILE` checks it first)",
        )
    if isinstance(error, SessionEnded):
        return CliError(
            f"{error}; it takes no more events",
            hint=f"what it wrote can still be read: `corral events {error.session_id}`",
        )
    if isinstance(error, ValidationError):  # what the user gave does not fit the contract (corral.contract)
        problems = "; ".join(
            f"{'.'.join(str(part) for part in problem['loc']) or 'input'}: {problem['msg']}"
            for problem in error.errors(include_url=False)[:5]
        )
        return CliError(f"invalid input: {problems}", exit_code=2)
    if isinstance(error, RuntimeError) and str(error).startswith("Failed client connect"):
        return unreachable(address)
    if isinstance(error, WorkflowUpdateFailedError):
        cause = error.cause
        message = cause.message if isinstance(cause, ApplicationError) else str(cause or error)
        return CliError(f"rejected: {message}")
    if isinstance(error, RPCError):
        if error.status == RPCStatusCode.NOT_FOUND and session_id is not None:
            return CliError(f"no session {session_id}", hint="`corral ls` lists the sessions")
        if error.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
            return unreachable(address)
        if error.status == RPCStatusCode.FAILED_PRECONDITION and "no poller" in error.message:
            return CliError(
                "no worker is serving this session: the harness worker is not running",
                hint="`corral status` shows which process is down; `corral up` starts it again",
            )
        return CliError(f"Temporal refused the request ({error.status.name}): {error.message}")
    return None


def run(
    settings: Settings,
    coroutine: Coroutine[Any, Any, T],
    *,
    session_id: str | None = None,
    interrupted: str | None = None,
) -> T:
    """`asyncio.run(coroutine)` with every expected failure turned into a message and an exit code.

    Ctrl-C exits 130, or 0 with the `interrupted` message for commands where stopping is the normal way out.
    """
    try:
        return asyncio.run(coroutine)
    except KeyboardInterrupt:
        settings.err.print(interrupted or "interrupted", style="dim")
        raise typer.Exit(0 if interrupted else 130) from None
    except Exception as exc:
        error = translate(exc, settings.address, session_id)
        if error is None:
            raise
        fail(settings, error)


def describe_failure(error: BaseException, address: str = "the configured address") -> str:
    """A failure in a person's words: a CliError's message, a command with the tool's own error output, or the
    exception's type and text (never a traceback)."""
    translated = translate(error, address)
    if translated is not None:
        return translated.message
    if isinstance(error, subprocess.CalledProcessError):
        output = error.stderr or error.output or b""
        said = (output.decode(errors="replace") if isinstance(output, bytes) else str(output)).strip()
        command = " ".join(str(part) for part in error.cmd) if isinstance(error.cmd, list | tuple) else str(error.cmd)
        return f"`{command}` exited with code {error.returncode}" + (f": {said}" if said else "")
    return f"{type(error).__name__}: {error}" if str(error) else type(error).__name__


@contextlib.contextmanager
def step(what: str, *, log: Path | None = None, address: str = "the configured address") -> Iterator[None]:
    """Name the step a long command is on: whatever fails inside is reported as `<what> failed: <the tool's own
    error>`, with the log to read, never as a traceback."""
    try:
        yield
    except CliError as error:
        if not error.message.startswith(what):
            error.message = f"{what} failed: {error.message}"
        raise
    except Exception as error:
        hint = f"the log to read: {log}" if log is not None else None
        raise CliError(f"{what} failed: {describe_failure(error, address)}", hint=hint) from error


def show_once(settings: Settings, secret: str, title: str, note: str) -> None:
    """A secret shown this once (a key, a signing secret): alone on stdout when a script captures it; else whole
    (never wrapped: a copied secret must be whole), with `note` saying what it opens and where it goes."""
    if not settings.stdout_is_terminal:
        print(secret, flush=True)
        return
    from rich.panel import Panel
    from rich.text import Text

    settings.out.print(Text(secret), soft_wrap=True)
    settings.out.print(Panel(Text(note, style="yellow"), title=title))
