"""`corral up` and `corral down`: bring the local stack up idempotently and down in reverse order, out loud.

The services and the mechanism are in `stack.py`; this module decides what to start (`Plan`), starts it in one
loop with the environment each service may have, waits with a spinner saying what it waits for, and turns a
process that did not come up into a message that points at its log.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from cli import processes, stack
from cli.context import CliError, describe_failure
from cli.stack import Plan, Service, StackConfig, StatePaths, UpOptions
from corral.names import ENV_BLOB_STORE, ENV_TEMPORAL_ADDRESS, ENV_TEMPORAL_NAMESPACE

READY_TIMEOUT = {"temporal": 60.0, "http": 30.0}
OFFLINE_API_KEY = "offline-stand-in"
"""A dummy key for the offline model server, which accepts any non-empty key; never a real secret."""
MODEL_ENV = ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN")
VAULT_ENV = ("VAULT_ADDR", "VAULT_TOKEN", "BAO_ADDR", "BAO_TOKEN", "VAULT_ROLE_ID", "VAULT_SECRET_ID")
"""Only the proxy worker gets these: it is the one process with Vault access."""
WORKER_SETTLE_SECONDS = 2.0
"""Workers that cannot connect or lack configuration exit within this time; after it they are taken as up."""


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
    return CliError(f"{what}\n--- last lines of {log} ---\n{processes.log_tail(log)}", hint=f"full log: {log}")


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
    """Every service `stack.SERVICES` lists that this `up` wants, in order: a running one is left alone (and keeps
    its recorded ports), a new one is started and waited for. Workers are checked together at the end."""
    from corral.temporal import cluster_id, connect, ensure_retention

    paths.ensure()
    plan = _plan(console, paths, options, namespace)
    seen: dict[str, tuple[int, bool]] = {}
    settling: list[tuple[Service, subprocess.Popen[bytes]]] = []
    for service in stack.SERVICES:
        if not service.when(plan):
            continue
        if service.command is None:
            found = await _ENSURE[service.name](console, plan)
            if found is not None:
                seen[service.name] = found
                _say(console, service.name, *found)
            continue
        pid = processes.running_pid(paths, service.name)
        plan.choose_ports(service, running=pid is not None)
        process = None
        if pid is None:
            process = _start(service, plan)
            pid = process.pid
        seen[service.name] = (pid, process is not None)
        if service.ready == "stays up":  # checked all together, once the loop has started everything
            if process is not None:
                settling.append((service, process))
            continue
        await _until_ready(console, service, plan, process)
        _say(console, service.name, *seen[service.name])

    client = await connect(plan.address, namespace)
    await ensure_retention(client)  # the dev server keeps closed sessions a day; the local stack keeps them 30
    config = StackConfig(
        temporal_address=plan.address,
        namespace=namespace,
        temporal_port=plan.port("temporal_port"),
        ui_port=plan.port("ui_port"),
        offline=plan.offline,
        model_url=plan.model_url,
        stream_url=plan.stream_url,
        api_url=plan.api_url,
        git_proxy_port=plan.port("git_proxy_port"),
        mode="all-in-one" if stack.ALL_IN_ONE in plan.workers else "split",
        cluster_id=await cluster_id(client),
        started_at=plan.previous.started_at
        if plan.previous is not None and not any(started for _, started in seen.values())
        else datetime.now(UTC),
    )
    stack.write_stack(paths, config)

    if settling:
        with console.status(f"checking that the {'workers stay' if len(settling) > 1 else 'worker stays'} up …"):
            await asyncio.sleep(WORKER_SETTLE_SECONDS)
        for service, process in settling:
            if process.poll() is not None:
                processes.running_pid(paths, service.name)  # Cleans its pid file.
                raise _failure(paths, service.name, f"the {service.what} exited with code {process.returncode}")
    for service in stack.SERVICES:
        if service.ready == "stays up" and service.name in seen:
            _say(console, service.name, *seen[service.name])
    return UpReport(config, seen)


def _plan(console: Console, paths: StatePaths, options: UpOptions, namespace: str) -> Plan:
    """The model mode and the workers' layout: running workers keep theirs (a note says a change takes a restart)."""
    previous = stack.read_stack(paths)
    running = [name for name in stack.WORKERS if processes.running_pid(paths, name) is not None]
    wants_offline = not os.environ.get("ANTHROPIC_API_KEY")
    offline = previous.offline if running and previous is not None else wants_offline
    if offline != wants_offline:
        key_now = "is not set" if wants_offline else "is set"
        _note(
            console,
            f"ANTHROPIC_API_KEY {key_now} now, but the running workers were started otherwise; "
            "run `corral down && corral up` to switch.",
        )
    workers = stack.SPLIT_WORKERS if options.split else (stack.ALL_IN_ONE,)
    other = tuple(name for name in running if name not in workers)
    if other:
        _note(
            console,
            f"other workers are already running ({', '.join(other)}); "
            "run `corral down` first to switch between --split and --all-in-one.",
        )
        workers = other
    new_workers = any(name not in running for name in workers)
    vault_env = {key: os.environ[key] for key in VAULT_ENV if key in os.environ}
    return Plan(paths, options, namespace, previous, offline, workers, new_workers, vault_env)


def _start(service: Service, plan: Plan) -> subprocess.Popen[bytes]:
    """Spawn `service` detached, once its ports are known to be free."""
    for port in service.ports:
        if processes.port_in_use(plan.port(port.name)):
            raise CliError(
                f"port {plan.port(port.name)} ({port.what}) is already in use by another program",
                hint=f"stop that program, or choose another port with {port.option}",
            )
    assert service.command is not None
    try:
        argv = service.command(plan)
    except FileNotFoundError as exc:  # the Temporal CLI is not installed
        raise CliError(str(exc)) from None
    return processes.spawn(plan.paths, service.name, argv, environment(service, plan))


def environment(service: Service, plan: Plan) -> dict[str, str]:
    """The user's environment without any model or Vault credential, plus what `service.env` grants: model
    credentials reach only the model roles, Vault's address and token only the proxy worker.

    Offline (`plan.model_url`), the model role talks to the stand-in with a dummy key; otherwise it gets the
    user's ANTHROPIC_API_KEY / ANTHROPIC_BASE_URL as they are.
    """
    env = {key: value for key, value in os.environ.items() if key not in MODEL_ENV and key not in VAULT_ENV}
    env["PYTHONUNBUFFERED"] = "1"
    if "temporal" in service.env:
        env |= {ENV_TEMPORAL_ADDRESS: plan.address, ENV_TEMPORAL_NAMESPACE: plan.namespace}
    if "model" in service.env and plan.model_url is not None:
        env |= {"ANTHROPIC_BASE_URL": plan.model_url, "ANTHROPIC_API_KEY": OFFLINE_API_KEY}
    elif "model" in service.env:
        env |= {key: os.environ[key] for key in MODEL_ENV if key in os.environ}
    if "vault" in service.env:
        env |= plan.vault_env
    if "sandbox" in service.env and plan.sandbox_image is not None:
        env["CORRAL_SANDBOX_IMAGE"] = plan.sandbox_image
    if "stream" in service.env:
        env["CORRAL_STREAM_URL"] = plan.stream_url
    if "git-proxy" in service.env:  # the proxy listens there, and sandboxes' origin points there
        env["CORRAL_GIT_PROXY_PORT"] = str(plan.port("git_proxy_port"))
    return env


async def _until_ready(console: Console, service: Service, plan: Plan, process: subprocess.Popen[bytes] | None) -> None:
    """Wait with a spinner until Temporal accepts a client, or an HTTP service's /healthz answers 200 (a running
    one at once); a process that exits, or time running out, is a failure that shows its log."""
    import httpx

    from corral.temporal import connect

    temporal = service.ready == "temporal"
    target = plan.address if temporal else f"http://127.0.0.1:{plan.port(service.ports[0].name)}/healthz"
    deadline = time.monotonic() + READY_TIMEOUT[service.ready]
    problem = "no attempt made"
    with console.status(f"waiting for the {service.what} {'to accept connections ' if temporal else ''}at {target} …"):
        async with httpx.AsyncClient(timeout=2) as http:
            while time.monotonic() < deadline and (process is None or process.poll() is None):
                try:
                    if temporal:
                        await asyncio.wait_for(connect(plan.address, plan.namespace), timeout=5)
                        return
                    if (response := await http.get(target)).status_code == 200:
                        return
                    problem = f"HTTP {response.status_code}"
                except (RuntimeError, TimeoutError, httpx.HTTPError) as exc:
                    problem = str(exc) or type(exc).__name__
                await asyncio.sleep(0.3)
    if process is not None and process.poll() is not None:
        problem = f"it exited with code {process.returncode}"
    else:
        problem = f"{target} did not answer within {READY_TIMEOUT[service.ready]:.0f} s ({problem})"
    raise _failure(plan.paths, service.name, f"the {service.what} did not come up: {problem}")


async def _ensure_vault(console: Console, plan: Plan) -> tuple[int, bool] | None:
    """The state dir's OpenBao: reused if it answers, else started and unsealed (initialised on the first `up`).
    Its address and token are for the proxy worker alone."""
    from proxy import ProxyError, ensure_local_vault

    running = processes.running_pid(plan.paths, stack.VAULT)
    with console.status("starting OpenBao (Vault API, durable storage in the state dir) …"):
        try:
            local = await asyncio.to_thread(ensure_local_vault, plan.paths.root)
        except ProxyError as exc:
            raise CliError(f"Vault is not available: {exc}", hint="or set VAULT_ADDR and VAULT_TOKEN") from exc
    vault = local.vault
    plan.vault_env = {"VAULT_ADDR": vault.address, "VAULT_TOKEN": vault.root_token.get_secret_value()}
    if local.arrival == "initialised":
        console.print(
            Text("✓ ", style="green")
            + Text(f"OpenBao initialised in {local.directory}: its unseal key and root token are in init.json there, ")
            + Text("readable by you alone; back up the state dir to keep your vaults", style="yellow")
        )
    elif local.arrival == "unsealed":
        console.print(Text("✓ ", style="green") + Text(f"OpenBao unsealed with the key in {local.directory}"))
    assert vault.pid is not None
    plan.paths.pid_file(stack.VAULT).write_text(f"{vault.pid}\n")
    return vault.pid, running != vault.pid


async def _ensure_sandbox(console: Console, plan: Plan) -> None:
    """A Docker engine (started here when none answers) and the sandbox image (built here once, no registry)."""
    from corral.sandbox import SandboxSetupError, ensure_docker_engine, ensure_sandbox_image

    with console.status("checking the Docker engine and the sandbox image …") as status:

        def progress(message: str) -> None:
            status.update(message)
            console.print(f"[dim]{message}[/dim]")

        try:
            engine = await asyncio.to_thread(ensure_docker_engine, plan.paths.root, progress=progress)
            image = await asyncio.to_thread(ensure_sandbox_image, engine, plan.paths.root, progress=progress)
        except SandboxSetupError as exc:
            raise CliError(
                f"the sandbox is not available: {exc}",
                hint="set DOCKER_HOST to a reachable engine, or run as root so corral can start Debian's docker.io",
            ) from exc
    console.print(f"[green]✓[/green] sandbox image {image} on the Docker engine")
    plan.sandbox_image = image


_ENSURE: dict[str, Callable[[Console, Plan], Awaitable[tuple[int, bool] | None]]] = {
    stack.VAULT: _ensure_vault,
    stack.DOCKERD: _ensure_sandbox,
}
"""The services with `ready="ensured"`: set up by their own module, idempotently, rather than spawned here."""


def running_processes(paths: StatePaths) -> list[str]:
    """The stack's processes that are alive now, in start order."""
    return [name for name in processes.known_processes(paths) if processes.running_pid(paths, name) is not None]


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
    grid.add_row("API", f"{config.api_url}  (Managed Agents API: `corral api-key create --workspace NAME`)")
    workers = [f"{name} pid {pid}" for name, (pid, _) in report.processes.items() if name in stack.WORKERS]
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


async def bring_down(
    console: Console, paths: StatePaths, *, remove_sandboxes: bool = False, purge: bool = False
) -> None:
    """Stop every recorded process in reverse start order (workers first, Temporal last), and say what is kept.

    With `purge` (which implies `remove_sandboxes`), the state dir goes too: sessions, vaults, logs, blobs.

    With `remove_sandboxes`, every sandbox on the engine goes too, after the workers (so none makes a new one) and
    before a `dockerd` this stack started (the engine must answer to remove them).
    """
    stopped = 0
    sandboxes_done = False
    remove_sandboxes |= purge
    recorded = stack.read_stack(paths)
    scope = recorded.sandbox_scope if recorded is not None else None
    for name in reversed(processes.known_processes(paths)):
        if name == stack.DOCKERD and not sandboxes_done:
            await _sandboxes_at_down(console, scope, remove_sandboxes)
            sandboxes_done = True
        with console.status(f"stopping {name} …"):
            pid, outcome = await asyncio.to_thread(processes.stop, paths, name)
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
    if purge:
        await asyncio.to_thread(_purge_state, console, paths)
        return
    from proxy.localvault import local_vault_dir

    kept = Text("kept: ", style="bold")
    kept.append(f"sessions and their logs in {paths.database}, process logs in {paths.logs}")
    if local_vault_dir(paths.root).is_dir():  # sealed once stopped; `corral up` unseals it
        kept.append(f", vaults and credentials in {local_vault_dir(paths.root)} (sealed)")
    blobs = os.environ.get(ENV_BLOB_STORE, "")
    if blobs:  # set by the CLI: the state dir's, or the user's own store
        kept.append(f", long sessions' earlier runs and large payloads in {blobs}")
    console.print(kept)


def purge_list(paths: StatePaths) -> list[str]:
    """What `corral down --purge` removes, one line each, to show before asking."""
    lines = [
        f"the state dir {paths.root}: every session and its log, every vault and credential, logs and pid files",
        "every sandbox of this stack: containers, workspace volumes, networks",
    ]
    blobs = os.environ.get(ENV_BLOB_STORE, "")
    if blobs and not _inside(blobs, paths.root):
        lines.append(f"(not the blob store at {blobs}: it is outside the state dir, so it is yours to remove)")
    return lines


def _purge_state(console: Console, paths: StatePaths) -> None:
    import shutil

    if not paths.root.exists():
        console.print(f"nothing to remove: {paths.root} does not exist")
        return
    marks = (paths.stack_file, paths.database, paths.pids, paths.root / "openbao")
    if not any(mark.exists() for mark in marks):  # a --state-dir typo must not take a home directory with it
        raise CliError(
            f"{paths.root} does not look like a corral state dir (no stack.json, temporal.db, pids/ or "
            "openbao/ in it): nothing was removed",
            exit_code=2,
        )
    shutil.rmtree(paths.root)
    console.print(Text("✓ ", style="green") + Text(f"removed {paths.root}: sessions, vaults, logs and blobs in it"))
    console.print("kept: the sandbox images on the Docker engine (a cache; `docker image rm` removes them)")


def _inside(location: str, root: Path) -> bool:
    if "://" in location:
        return False
    return Path(location).resolve().is_relative_to(root.resolve())


async def _sandboxes_at_down(console: Console, scope: str | None, remove: bool) -> None:
    """Remove this stack's sandboxes (`--sandboxes`), or say which ones stay.

    Only the sandboxes of this stack's Temporal server (`scope`): other stacks and test runs may share the engine.
    A stack recorded before scopes were, or an engine that does not answer, is skipped with a note.
    """
    from corral.sandbox import (
        SandboxError,
        connect_docker,
        list_sandbox_resources,
        remove_all_sandboxes,
        remove_pool_members,
    )

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
        try:
            pool = await asyncio.to_thread(remove_pool_members, client, scope)
        except SandboxError as exc:
            raise CliError(f"could not remove the warm pool: {exc}") from None
        if not pool.empty:
            console.print(
                Text("✓ ", style="green") + Text(f"removed the warm pool's idle sandboxes: {pool.describe()}")
            )
        found = await asyncio.to_thread(list_sandbox_resources, client, scope)
        if not found.empty:
            note = Text(f"kept on the Docker engine: {found.describe()}; ", style="yellow")
            note.append("`corral down --sandboxes` removes them", style="yellow")
            console.print(note)
    finally:
        client.close()
