"""`corral up` and `corral down`: bring the local stack up idempotently and down in reverse order, out loud.

The mechanism is in `stack.py`; this module decides what to start, waits with a spinner saying what it waits for,
and turns a process that did not come up into a message that points at its log.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from cli import stack
from cli.context import CliError, describe_failure
from cli.stack import StackConfig, StackError, StatePaths

TEMPORAL_TIMEOUT = 60.0
MODEL_SERVER_TIMEOUT = 30.0
WORKER_SETTLE_SECONDS = 2.0
"""Workers that cannot connect or lack configuration exit within this time; after it they are taken as up."""


@dataclass(frozen=True)
class UpOptions:
    temporal_port: int = 7233
    ui_port: int = 8233
    model_port: int = 8765
    stream_port: int = 8766
    git_proxy_port: int = 8767
    split: bool = False


@dataclass
class UpReport:
    """What `bring_up` found and did: the stack's config and, per process, its pid and whether it was new."""

    config: StackConfig
    processes: dict[str, tuple[int, bool]] = field(default_factory=dict)


def _say(console: Console, name: str, pid: int, started: bool) -> None:
    if started:
        console.print(Text("✓ ", style="green") + Text(f"{name} started (pid {pid})"))
    else:
        console.print(Text("• ", style="cyan") + Text(f"{name} already running (pid {pid})"))


def _failure(paths: StatePaths, name: str, what: str) -> CliError:
    log = paths.log_file(name)
    return CliError(f"{what}\n--- last lines of {log} ---\n{stack.log_tail(log)}", hint=f"full log: {log}")


def _check_free(port: int, what: str, option: str) -> None:
    if stack.port_in_use(port):
        raise CliError(
            f"port {port} ({what}) is already in use by another program",
            hint=f"stop that program, or choose another port with {option}",
        )


async def _up_temporal(
    console: Console, paths: StatePaths, options: UpOptions, namespace: str, previous: StackConfig | None
) -> tuple[int, bool, int, int]:
    """Start the dev server unless it runs, and wait until it accepts connections: (pid, started, port, ui port)."""
    pid = stack.running_pid(paths, stack.TEMPORAL)
    if pid is not None and previous is not None:
        port, ui_port = previous.temporal_port, previous.ui_port  # Already up: its ports are the ones recorded.
    else:
        port, ui_port = options.temporal_port, options.ui_port
    process = None
    if pid is None:
        _check_free(port, "Temporal gRPC", "--temporal-port")
        _check_free(ui_port, "Temporal Web UI", "--ui-port")
        try:
            argv = stack.temporal_command(paths, port, ui_port, namespace)
        except FileNotFoundError as exc:
            raise CliError(str(exc)) from None
        process = stack.spawn(paths, stack.TEMPORAL, argv, stack.base_environment())
        pid = process.pid
    address = f"127.0.0.1:{port}"
    with console.status(f"waiting for the Temporal dev server to accept connections at {address} …"):
        try:
            await stack.wait_for_temporal(address, namespace, TEMPORAL_TIMEOUT, process)
        except StackError as exc:
            raise _failure(paths, stack.TEMPORAL, f"the Temporal dev server did not come up: {exc}") from None
    return pid, process is not None, port, ui_port


async def _up_model_server(console: Console, paths: StatePaths, port: int) -> tuple[int, bool]:
    command = stack.model_server_command(port)
    return await _up_http_service(
        console, paths, stack.MODEL_SERVER, command, port, "offline model server", "--model-port"
    )


async def _up_http_service(
    console: Console, paths: StatePaths, name: str, command: list[str], port: int, what: str, option: str
) -> tuple[int, bool]:
    """Start a small HTTP service of the stack (unless it runs) and wait for its /healthz."""
    pid = stack.running_pid(paths, name)
    if pid is not None:
        return pid, False
    _check_free(port, what, option)
    process = stack.spawn(paths, name, command, stack.base_environment())
    url = f"http://127.0.0.1:{port}/healthz"
    with console.status(f"waiting for the {what} at {url} …"):
        try:
            await stack.wait_for_http(url, MODEL_SERVER_TIMEOUT, process)
        except StackError as exc:
            raise _failure(paths, name, f"the {what} did not come up: {exc}") from None
    return process.pid, True


def _recorded_port(paths: StatePaths, name: str, recorded_url: str | None, requested: int) -> int:
    """A running service keeps its recorded port; a new one gets the requested port."""
    if stack.running_pid(paths, name) is not None and recorded_url:
        return int(recorded_url.rsplit(":", 1)[1])
    return requested


def _model_port(paths: StatePaths, previous: StackConfig | None, requested: int) -> int:
    """The running model server keeps its recorded port; a new one gets the requested port."""
    if stack.running_pid(paths, stack.MODEL_SERVER) is not None and previous is not None and previous.model_url:
        return int(previous.model_url.rsplit(":", 1)[1])
    return requested


def _note(console: Console, text: str) -> None:
    console.print(Text(f"note: {text}", style="yellow"))


async def bring_up(console: Console, paths: StatePaths, options: UpOptions, namespace: str) -> UpReport:
    """Start whatever part of the stack is not running; leave running parts alone.

    Raises CliError naming the part that failed, with its log, and which parts are left running.
    """
    try:
        return await _bring_up(console, paths, options, namespace)
    except CliError as error:
        raise note_running(error, paths) from None
    except Exception as error:  # a bug or an unforeseen failure: still a message, with the logs to read
        failed = CliError(f"corral up failed: {describe_failure(error)}", hint=f"the logs to read: {paths.logs}")
        raise note_running(failed, paths) from error


def note_running(error: CliError, paths: StatePaths) -> CliError:
    """Add to `error` which processes of the stack are still running, and how to look at or stop them."""
    running = running_processes(paths)
    note = "`corral status` shows it, `corral down` stops it"
    if running and note not in (error.hint or ""):
        line = f"the stack is still running ({', '.join(running)}): {note}"
        error.hint = f"{error.hint}\n{line}" if error.hint else line
    return error


async def _bring_up(console: Console, paths: StatePaths, options: UpOptions, namespace: str) -> UpReport:
    paths.ensure()
    previous = stack.read_stack(paths)
    processes: dict[str, tuple[int, bool]] = {}

    pid, started, port, ui_port = await _up_temporal(console, paths, options, namespace, previous)
    processes[stack.TEMPORAL] = (pid, started)
    _say(console, stack.TEMPORAL, pid, started)
    address = f"127.0.0.1:{port}"
    cluster = await stack.temporal_cluster_id(address, namespace)

    # Running workers keep the model mode they were started with; a changed environment takes a restart.
    running: dict[str, int] = {}
    for name in (stack.ALL_IN_ONE, *stack.SPLIT_WORKERS):
        worker_pid = stack.running_pid(paths, name)
        if worker_pid is not None:
            running[name] = worker_pid
    wants_offline = not os.environ.get("ANTHROPIC_API_KEY")
    offline = previous.offline if running and previous is not None else wants_offline
    if offline != wants_offline:
        key_now = "is not set" if wants_offline else "is set"
        _note(
            console,
            f"ANTHROPIC_API_KEY {key_now} now, but the running workers were started otherwise; "
            "run `corral down && corral up` to switch.",
        )

    model_url: str | None = None
    if offline:
        model_port = _model_port(paths, previous, options.model_port)
        pid, started = await _up_model_server(console, paths, model_port)
        processes[stack.MODEL_SERVER] = (pid, started)
        _say(console, stack.MODEL_SERVER, pid, started)
        model_url = f"http://127.0.0.1:{model_port}"

    # Vault and the proxy: the one process with Vault access, never part of the all-in-one.
    proxy = await _up_proxy(console, paths, address, namespace, options.git_proxy_port)
    for name, (proxy_pid, proxy_started) in proxy.items():
        processes[name] = (proxy_pid, proxy_started)
        _say(console, name, proxy_pid, proxy_started)

    # The live-delta relay: model workers publish to it, `corral tail` subscribes (see corral/streaming).
    stream_port = _recorded_port(
        paths, stack.STREAM_RELAY, previous.stream_url if previous else None, options.stream_port
    )
    pid, started = await _up_http_service(
        console, paths, stack.STREAM_RELAY, stack.stream_relay_command(stream_port), stream_port,
        "stream relay", "--stream-port",
    )  # fmt: skip
    processes[stack.STREAM_RELAY] = (pid, started)
    _say(console, stack.STREAM_RELAY, pid, started)
    stream_url = f"http://127.0.0.1:{stream_port}"

    wanted: tuple[str, ...] = stack.SPLIT_WORKERS if options.split else (stack.ALL_IN_ONE,)
    other = tuple(name for name in running if name not in wanted)
    if other:
        _note(
            console,
            f"other workers are already running ({', '.join(other)}); "
            "run `corral down` first to switch between --split and --all-in-one.",
        )
        wanted = other
    mode: Literal["all-in-one", "split"] = "all-in-one" if stack.ALL_IN_ONE in wanted else "split"
    image = await _up_sandbox(console, paths) if any(name not in running for name in wanted) else None
    spawned: dict[str, subprocess.Popen[bytes]] = {}
    for name in wanted:
        if name in running:
            processes[name] = (running[name], False)
        else:
            env = stack.worker_environment(
                name, address, namespace, model_url, image, stream_url, git_proxy_port=options.git_proxy_port
            )
            spawned[name] = stack.spawn(paths, name, stack.worker_command(name), env)
            processes[name] = (spawned[name].pid, True)

    config = StackConfig(
        temporal_address=address,
        namespace=namespace,
        temporal_port=port,
        ui_port=ui_port,
        offline=offline,
        model_url=model_url,
        stream_url=stream_url,
        mode=mode,
        cluster_id=cluster,
        started_at=previous.started_at if previous and not any(s for _, s in processes.values()) else _now(),
    )
    stack.write_stack(paths, config)

    if spawned:
        with console.status(f"checking that the worker{'s' if len(spawned) > 1 else ''} stay up …"):
            await asyncio.sleep(WORKER_SETTLE_SECONDS)
        for name, process in spawned.items():
            if process.poll() is not None:
                stack.running_pid(paths, name)  # Cleans its pid file.
                raise _failure(paths, name, f"the {name} worker exited with code {process.returncode}")
    for name in wanted:
        _say(console, name, *processes[name])
    return UpReport(config, processes)


async def _up_proxy(
    console: Console, paths: StatePaths, address: str, namespace: str, git_proxy_port: int
) -> dict[str, tuple[int, bool]]:
    """Vault (the user's `VAULT_ADDR`, else an OpenBao dev server here) and the proxy worker that alone uses it."""
    from proxy import ProxyError, ensure_dev_vault

    started: dict[str, tuple[int, bool]] = {}
    vault_env = {key: os.environ[key] for key in stack.VAULT_ENV if key in os.environ}
    if not vault_env.get("VAULT_ADDR") and not vault_env.get("BAO_ADDR"):
        running = stack.running_pid(paths, stack.VAULT)
        with console.status("starting the OpenBao dev server (Vault API) …"):
            try:
                vault = await asyncio.to_thread(ensure_dev_vault, paths.root)
            except ProxyError as exc:
                raise CliError(f"Vault is not available: {exc}", hint="or set VAULT_ADDR and VAULT_TOKEN") from exc
        if vault.pid is not None:
            paths.pid_file(stack.VAULT).write_text(f"{vault.pid}\n")
            started[stack.VAULT] = (vault.pid, running != vault.pid)
        vault_env = {"VAULT_ADDR": vault.address, "VAULT_TOKEN": vault.root_token.get_secret_value()}
    pid = stack.running_pid(paths, stack.PROXY_WORKER)
    if pid is not None:
        started[stack.PROXY_WORKER] = (pid, False)
        return started
    env = stack.worker_environment(stack.PROXY_WORKER, address, namespace, None, git_proxy_port=git_proxy_port)
    env |= vault_env
    process = stack.spawn(paths, stack.PROXY_WORKER, stack.proxy_worker_command(), env)
    started[stack.PROXY_WORKER] = (process.pid, True)
    return started


async def _up_sandbox(console: Console, paths: StatePaths) -> str:
    """A Docker engine (started here when none answers) and the sandbox image (built here once, no registry)."""
    from corral.sandbox import SandboxSetupError, ensure_docker_engine, ensure_sandbox_image

    with console.status("checking the Docker engine and the sandbox image …") as status:

        def progress(message: str) -> None:
            status.update(message)
            console.print(f"[dim]{message}[/dim]")

        try:
            engine = await asyncio.to_thread(ensure_docker_engine, paths.root, progress=progress)
            image = await asyncio.to_thread(ensure_sandbox_image, engine, paths.root, progress=progress)
        except SandboxSetupError as exc:
            raise CliError(
                f"the sandbox is not available: {exc}",
                hint="set DOCKER_HOST to a reachable engine, or run as root so corral can start Debian's docker.io",
            ) from exc
    console.print(f"[green]✓[/green] sandbox image {image} on the Docker engine")
    return image


def running_processes(paths: StatePaths) -> list[str]:
    """The stack's processes that are alive now, in start order."""
    return [name for name in stack.known_processes(paths) if stack.running_pid(paths, name) is not None]


def _now() -> datetime:
    return datetime.now(UTC)


def stack_panel(report: UpReport, paths: StatePaths) -> Panel:
    """Where everything is and what to type next."""
    config = report.config
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("Temporal", f"{config.temporal_address}  (namespace {config.namespace})")
    grid.add_row("Web UI", f"{config.ui_url}/namespaces/{config.namespace}/workflows")
    if config.offline:
        model = Text(f"offline stand-in at {config.model_url}", style="yellow")
        model.append(" — deterministic scripts, NOT a real model", style="bold yellow")
    else:
        base_url = os.environ.get("ANTHROPIC_BASE_URL")
        model = Text(f"Messages API at {base_url}" if base_url else "Anthropic API (ANTHROPIC_API_KEY)")
    grid.add_row("Model", model)
    workers = [f"{name} pid {pid}" for name, (pid, _) in report.processes.items() if name in stack.WORKER_MODULES]
    grid.add_row("Workers", ", ".join(workers))
    grid.add_row("Logs", str(paths.logs))
    grid.add_row("Next", 'corral start "hello"')
    grid.add_row("", "corral tail ID")
    grid.add_row("", "corral down")
    parts: list[Table | Text] = [grid]
    if config.offline:
        parts.append(
            Text(
                "\nANTHROPIC_API_KEY is not set, so replies come from corral's offline stand-in model. "
                "To use Claude: export ANTHROPIC_API_KEY=… and run `corral down && corral up`.",
                style="yellow",
            )
        )
    return Panel(Group(*parts), title="corral is up", title_align="left", border_style="green", expand=False)


async def bring_down(console: Console, paths: StatePaths, *, remove_sandboxes: bool = False) -> None:
    """Stop every recorded process in reverse start order (workers first, Temporal last), and say what is kept.

    With `remove_sandboxes`, every sandbox on the engine goes too, after the workers (so none makes a new one) and
    before a `dockerd` this stack started (the engine must answer to remove them).
    """
    stopped = 0
    sandboxes_done = False
    recorded = stack.read_stack(paths)
    scope = recorded.sandbox_scope if recorded is not None else None
    for name in reversed(stack.known_processes(paths)):
        if name == stack.DOCKERD and not sandboxes_done:
            await _sandboxes_at_down(console, scope, remove_sandboxes)
            sandboxes_done = True
        with console.status(f"stopping {name} …"):
            pid, outcome = await asyncio.to_thread(stack.stop, paths, name)
        if outcome == "stopped":
            stopped += 1
            console.print(Text("✓ ", style="green") + Text(f"{name} stopped (pid {pid})"))
        elif outcome == "killed":
            stopped += 1
            console.print(Text("✓ ", style="yellow") + Text(f"{name} did not stop in time; killed (pid {pid})"))
    if not sandboxes_done:
        await _sandboxes_at_down(console, scope, remove_sandboxes)
    if stopped:
        console.print("corral stack stopped", style="green")
    else:
        console.print(f"nothing was running (state dir {paths.root})")
    kept = Text("kept: ", style="bold")
    kept.append(f"sessions and their logs in {paths.database}, process logs in {paths.logs}")
    console.print(kept)
    console.print(Text("lost: vaults and credentials of the OpenBao dev server (it keeps them in memory)", style="dim"))


async def _sandboxes_at_down(console: Console, scope: str | None, remove: bool) -> None:
    """Remove this stack's sandboxes (`--sandboxes`), or say which ones stay.

    Only the sandboxes of this stack's Temporal server (`scope`): other stacks and test runs may share the engine.
    A stack recorded before scopes were, or an engine that does not answer, is skipped with a note.
    """
    from corral.sandbox import SandboxError, connect_docker, list_sandbox_resources, remove_all_sandboxes

    if scope is None:
        if remove:
            _note(console, "no stack is recorded here, so no sandbox is known to be this stack's; none removed")
        return
    client = await asyncio.to_thread(connect_docker)
    if client is None:
        if remove:
            _note(console, "no Docker engine answers: no sandbox to remove")
        return
    try:
        if remove:
            with console.status("removing sandbox containers, workspace volumes and networks …"):
                try:
                    removed = await asyncio.to_thread(remove_all_sandboxes, client, scope)
                except SandboxError as exc:
                    raise CliError(f"could not remove every sandbox: {exc}") from None
            console.print(Text("✓ ", style="green") + Text(f"removed {removed.describe()}"))
            return
        found = await asyncio.to_thread(list_sandbox_resources, client, scope)
        if not found.empty:
            note = Text(f"kept on the Docker engine: {found.describe()}; ", style="yellow")
            note.append("`corral down --sandboxes` removes them", style="yellow")
            console.print(note)
    finally:
        client.close()
