"""`corral up`: bring the local stack up idempotently, out loud (`down.py` takes it down in reverse order).

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

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from cli import ports, processes, stack
from cli.context import CliError, describe_failure
from cli.stack import Plan, Service, StackConfig, StatePaths, UpOptions
from corral.names import (
    ENV_GIT_PROXY_PORT,
    ENV_SANDBOX_IMAGE,
    ENV_STREAM_URL,
    ENV_TEMPORAL_ADDRESS,
    ENV_TEMPORAL_NAMESPACE,
)

READY_TIMEOUT = {"temporal": 60.0, "http": 30.0}
OFFLINE_API_KEY = "offline-stand-in"
"""A dummy key for the offline model server, which accepts any non-empty key; never a real secret."""
MODEL_ENV = ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_AUTH_TOKEN")
GATEWAY_VAULT_PREFIX = "CORRAL_GATEWAY_"
GATEWAY_VAULT_ENV = ("CORRAL_GATEWAY_VAULT_ROLE_ID", "CORRAL_GATEWAY_VAULT_SECRET_ID", "CORRAL_GATEWAY_VAULT_TOKEN")
"""With a Vault of the user's, the gateway's write-only login (see proxy/access.py): the gateway gets each under the
name `proxy.login` reads, the one without `GATEWAY_VAULT_PREFIX`. Only the proxy worker gets the user's own login
(`proxy.login.LOGIN_ENV`): it is the one process that reads credentials."""
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
    from proxy.login import ENV_VAULT_ADDR, LOGIN_ENV, vault_address  # the proxy library loads when `corral up` runs

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
    vault_env = {key: os.environ[key] for key in LOGIN_ENV if key in os.environ}
    plan = Plan(paths, options, namespace, previous, offline, workers, new_workers, vault_env)
    plan.stream_token = stack.ensure_stream_token(paths)
    stack.follow_with_stream_token(plan.stream_token)  # `corral demo` tails the stack it has just brought up
    address = vault_address(vault_env)
    gateway = {
        key.removeprefix(GATEWAY_VAULT_PREFIX): os.environ[key] for key in GATEWAY_VAULT_ENV if os.environ.get(key)
    }
    if address and gateway:
        plan.gateway_vault_env = {ENV_VAULT_ADDR: address, **gateway}
    elif address:
        _note(
            console,
            "the gateway gets no login to your Vault, so its vault routes answer 503: give it a write-only one "
            "(CORRAL_GATEWAY_VAULT_ROLE_ID and CORRAL_GATEWAY_VAULT_SECRET_ID; see docs/operations.md)",
        )
    for port in (port for service in stack.SERVICES for port in service.ports):
        warning = ports.ephemeral_warning(plan.port(port.name), port.option)
        if warning is not None:
            _note(console, warning)
    return plan


def _start(service: Service, plan: Plan) -> subprocess.Popen[bytes]:
    """Spawn `service` detached, once its ports are known to be free."""
    for port in service.ports:
        if processes.port_in_use(plan.port(port.name)):
            raise ports.taken(plan.port(port.name), port.what, port.option)
    assert service.command is not None
    try:
        argv = service.command(plan)
    except FileNotFoundError as exc:  # the Temporal CLI is not installed
        raise CliError(str(exc)) from None
    return processes.spawn(plan.paths, service.name, argv, environment(service, plan))


def environment(service: Service, plan: Plan) -> dict[str, str]:
    """The user's environment without any model or Vault credential, plus what `service.env` grants: model
    credentials reach only the model roles, Vault's address and token only the proxy worker (the gateway gets its
    own write-only login), the stream relay's token only the relay, its publishers and the gateway.

    Offline (`plan.model_url`), the model role talks to the stand-in with a dummy key; otherwise it gets the
    user's ANTHROPIC_API_KEY / ANTHROPIC_BASE_URL as they are.
    """
    from proxy.login import LOGIN_ENV

    withheld = {*MODEL_ENV, *LOGIN_ENV, *GATEWAY_VAULT_ENV, stack.STREAM_TOKEN_ENV}
    env = {key: value for key, value in os.environ.items() if key not in withheld}
    env["PYTHONUNBUFFERED"] = "1"
    if "temporal" in service.env:
        env |= {ENV_TEMPORAL_ADDRESS: plan.address, ENV_TEMPORAL_NAMESPACE: plan.namespace}
    if "model" in service.env and plan.model_url is not None:
        env |= {"ANTHROPIC_BASE_URL": plan.model_url, "ANTHROPIC_API_KEY": OFFLINE_API_KEY}
    elif "model" in service.env:
        env |= {key: os.environ[key] for key in MODEL_ENV if key in os.environ}
    if "vault" in service.env:
        env |= plan.vault_env
    if "vault-writer" in service.env:
        env |= plan.gateway_vault_env
    if "sandbox" in service.env and plan.sandbox_image is not None:
        env[ENV_SANDBOX_IMAGE] = plan.sandbox_image
    if "stream" in service.env:
        env[ENV_STREAM_URL] = plan.stream_url
        if plan.stream_token is not None:
            env[stack.STREAM_TOKEN_ENV] = plan.stream_token
    if "git-proxy" in service.env:  # the proxy listens there, and sandboxes' origin points there
        env[ENV_GIT_PROXY_PORT] = str(plan.port("git_proxy_port"))
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
    Its root token is for the proxy worker alone; the gateway gets a login that cannot read a secret."""
    from proxy import ProxyError, ensure_local_vault
    from proxy.login import ENV_VAULT_ADDR, ENV_VAULT_MOUNT, ENV_VAULT_ROLE_ID, ENV_VAULT_SECRET_ID, ENV_VAULT_TOKEN

    running = processes.running_pid(plan.paths, stack.VAULT)
    with console.status("starting OpenBao (Vault API, durable storage in the state dir) …"):
        try:
            local = await asyncio.to_thread(ensure_local_vault, plan.paths.root)
        except ProxyError as exc:
            raise CliError(f"Vault is not available: {exc}", hint="or set VAULT_ADDR and VAULT_TOKEN") from exc
    vault = local.vault
    plan.vault_env = {ENV_VAULT_ADDR: vault.address, ENV_VAULT_TOKEN: vault.root_token.get_secret_value()}
    plan.gateway_vault_env = {
        ENV_VAULT_ADDR: vault.address, ENV_VAULT_ROLE_ID: local.gateway.role_id,
        ENV_VAULT_SECRET_ID: local.gateway.secret_id.get_secret_value(), ENV_VAULT_MOUNT: vault.mount,
    }  # fmt: skip
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
    from sandbox import SandboxSetupError, ensure_docker_engine, ensure_sandbox_image

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
