"""Session containers on a Docker engine: create or restart from a recipe (or make a warm pool member), remove.

Every container's main process is the resident runner (`sandbox/runner.py` talks to it).

No Temporal here: the sandbox activities call these functions (in a thread, the Docker SDK is synchronous) and
translate `SandboxGone` into what the session shows the model.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
import re
import socket
from dataclasses import dataclass
from typing import Any

import docker
import docker.errors
import docker.types
import docker.utils
from docker.models.containers import Container, _create_container_args
from docker.utils.socket import STDERR, STDOUT, frames_iter

from corral.contract.sandbox import Environment, RepositoryClone
from corral.names import DEFAULT_GIT_PROXY_PORT
from sandbox import egress, networks, runner
from sandbox.commands import (
    OUTPUT_DIR,
    STATE_DIR,
    call_output_command,
    clone_commands,
    packages_dockerfile,
    working_dir_command,
)
from sandbox.errors import SandboxError, SandboxGone, SandboxSetupError
from sandbox.workspace import (
    SANDBOX_GID,
    SANDBOX_UID,
    WORKSPACE,
    chown_workspace,
    hardened_run_options,
    prepare_workspace_volume,
    remove_oneshots,
)

log = logging.getLogger(__name__)

SESSION_LABEL = "corral.session"
SCOPE_LABEL = "corral.scope"
"""`<temporal cluster id>/<namespace>`: a reaper judges only the sessions of its own server and namespace."""
GENERATION_LABEL = "corral.generation"
OUTPUT_TMPFS_MB = 64
MAX_COMMAND_BYTES = 512 * 1024
"""The longest bash command (UTF-8): as much as the write tool's content, more than a model writes in one reply."""


POOL_VOLUME_PREFIX = "corral-ws-pool."
"""A warm pool member's workspace volume (the dot keeps it apart from any session's `corral-ws-<id>`)."""
CLAIMED_NAME = re.compile(r"^/?corral-(?!pool-)(.+)-g\d+$")


def container_name(session_id: str, generation: int) -> str:
    return f"corral-{session_id}-g{generation}"


def volume_name(session_id: str) -> str:
    return f"corral-ws-{session_id}"


def engine_id(client: docker.DockerClient) -> str:
    """A short, stable id of the engine: workers attached to the same engine serve the same task queue."""
    return str(client.info().get("ID", "local")).replace(":", "")[:12].lower()


def packages_image(client: docker.DockerClient, base: str, environment: Environment) -> str:
    """The base image plus the recipe's packages, built once per Dockerfile (base, package list) and cached by tag."""
    packages = environment.packages
    if packages.empty():
        return base
    dockerfile = packages_dockerfile(base, packages)
    digest = hashlib.sha256(dockerfile.encode()).hexdigest()[:12]  # the base and the packages, as they are installed
    tag = f"corral-sandbox-packages:{digest}"
    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    log.info("building %s with packages apt=%s pip=%s", tag, packages.apt, packages.pip)
    try:
        client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag=tag, rm=True, forcerm=True)
    except docker.errors.BuildError as exc:
        detail = "".join(str(chunk.get("stream", "")) for chunk in exc.build_log)[-2000:]
        raise SandboxSetupError(f"installing the environment's packages failed: {exc.msg}\n{detail}") from exc
    return tag


@dataclass(frozen=True)
class Provisioned:
    container_id: str
    container_name: str
    volume: str
    image: str
    from_pool: bool = False


CPU_PERIOD = 100_000
"""CPU limits as a quota per period (not NanoCpus), so `docker update` can change them on a warm pool member."""


def cpu_quota(cpus: float) -> int:
    return int(cpus * CPU_PERIOD)


def ensure_container(
    client: docker.DockerClient,
    session_id: str,
    environment: Environment,
    generation: int,
    base_image: str,
    scope: str = "",
    repositories: list[RepositoryClone] | None = None,
    git_proxy_port: int = DEFAULT_GIT_PROXY_PORT,
    volume: str | None = None,
) -> Provisioned:
    """This session's container for `generation`, running: reused if running, started if stopped, else created.
    Its workspace is `volume` (the one the session had, perhaps a pool member's), else the session's own."""
    name = container_name(session_id, generation)
    volume = volume or session_volume(client, session_id) or volume_name(session_id)
    image = environment.image or packages_image(client, base_image, environment)
    environment, git_host = with_git_access(client, environment, base_image, repositories)
    networking = environment.networking.type
    labels = {
        SESSION_LABEL: session_id,
        GENERATION_LABEL: str(generation),
        SCOPE_LABEL: scope,
        runner.RUNNER_LABEL: runner.PROTOCOL_VERSION,
    }
    container = _reusable_container(client, name, networking)
    if networking != "none":
        networks.ensure_network(client, name, networking, _network_labels(session_id, scope, environment))
    if container is None:
        _ensure_volume(client, volume, image, {SESSION_LABEL: session_id, SCOPE_LABEL: scope})
        container = _create_with_open_stdin(client, image, name, labels, _run_options(environment, volume, name))
    if networking == "limited":
        egress.ensure_egress(client, base_image)  # made once per engine (and again if it was removed since)
        egress.connect_proxy(client, name)  # before the sandbox starts: its first request finds the proxy
    if container.status != "running":
        container.start()
    if networking == "limited":
        egress.refresh_policy(client)
    if environment.working_dir != "/workspace":
        container.exec_run(working_dir_command(environment.working_dir))
    _clone_all(client, container, name, repositories, git_host, git_proxy_port)
    return Provisioned(container_id=container.id or name, container_name=name, volume=volume, image=image)


def with_git_access(
    client: docker.DockerClient, environment: Environment, base_image: str, repositories: list[RepositoryClone] | None
) -> tuple[Environment, str | None]:
    """The recipe a sandbox that clones `repositories` really runs, and the host its clones reach the git proxy
    at (None: its own network's gateway). The git proxy must be reachable even with networking `none`: through
    the egress proxy, and nothing else, so such a recipe becomes `limited` with the git host allowed."""
    if not repositories or environment.networking.type == "unrestricted":
        return environment, None
    git_host = _egress_git_host(client, base_image)
    allowed = sorted({*environment.networking.allowed_hosts, git_host})
    networking = environment.networking.model_copy(update={"type": "limited", "allowed_hosts": allowed})
    return environment.model_copy(update={"networking": networking}), git_host


def settle_claimed(
    client: docker.DockerClient,
    made: Provisioned,
    session_id: str,
    environment: Environment,
    scope: str,
    base_image: str,
    repositories: list[RepositoryClone] | None = None,
    git_host: str | None = None,
    git_proxy_port: int = DEFAULT_GIT_PROXY_PORT,
) -> None:
    """What a claimed warm pool member still needs to be the session's sandbox: for a recipe with networking,
    the session's own network (its allow-list on it, for `limited`), joined before the parking network is left;
    then the repositories cloned. Its name and limits are set by the claim."""
    networking = environment.networking.type
    if networking != "none":
        network = networks.ensure_network(
            client, made.container_name, networking, _network_labels(session_id, scope, environment)
        )
        if networking == "limited":
            egress.ensure_egress(client, base_image)
            egress.connect_proxy(client, made.container_name)
        try:
            network.connect(made.container_id)
        except docker.errors.APIError as exc:
            if "already exists" not in str(exc):  # a retried claim joined it already
                raise SandboxSetupError(f"could not connect {made.container_name} to its network: {exc}") from exc
        networks.leave_parking(client, made.container_id)
        if networking == "limited":
            egress.refresh_policy(client)
    if repositories:
        container = client.containers.get(made.container_id)
        _clone_all(client, container, made.container_name, repositories, git_host, git_proxy_port)


def _network_labels(session_id: str, scope: str, environment: Environment) -> dict[str, str]:
    """A session network's labels; a limited one carries the sandbox's allow-list, which the egress proxy reads."""
    labels = {SESSION_LABEL: session_id, SCOPE_LABEL: scope}
    if environment.networking.type == "limited":
        labels[egress.ALLOWED_HOSTS_LABEL] = json.dumps(environment.networking.allowed_hosts)
    return labels


def _clone_all(
    client: docker.DockerClient,
    container: Container,
    name: str,
    repositories: list[RepositoryClone] | None,
    git_host: str | None,
    git_proxy_port: int,
) -> None:
    if repositories and git_host is None:
        git_host = egress.gateway(client, name)  # unrestricted: the host, at the gateway of the sandbox's network
    for repository in repositories or []:
        _clone(container, repository, f"http://{git_host}:{git_proxy_port}")


def make_pool_member(
    client: docker.DockerClient, name: str, environment: Environment, image: str, labels: dict[str, str]
) -> Provisioned:
    """A started sandbox for the warm pool: `name`, a fresh workspace volume of its own. One for a recipe with
    networking waits on the parking network (`networks.PARKING_NETWORK`), where it reaches nothing; the claim moves
    it to a network of the session's own.

    The container is created first, and its mount creates the volume: a worker killed at any point leaves a
    member that is not running, which the pool's upkeep (or `corral down`) removes with its volume, never a
    volume on its own."""
    volume = f"{POOL_VOLUME_PREFIX}{name.removeprefix('corral-')}"
    labels = {**labels, runner.RUNNER_LABEL: runner.PROTOCOL_VERSION}
    options = _run_options(environment, volume, name)
    del options["volumes"]
    if environment.networking.type != "none":
        options["network_mode"] = networks.ensure_parking(client).name
    mount = docker.types.Mount(WORKSPACE, volume, type="volume", labels={SCOPE_LABEL: labels[SCOPE_LABEL]})
    container = _create_with_open_stdin(client, image, name, labels, options | {"mounts": [mount]})
    chown_workspace(client, volume, image)
    container.start()
    if environment.working_dir != "/workspace":
        container.exec_run(working_dir_command(environment.working_dir))
    return Provisioned(container_id=str(container.id), container_name=name, volume=volume, image=image)


def _ensure_volume(client: docker.DockerClient, volume: str, image: str, labels: dict[str, str]) -> None:
    try:
        client.volumes.get(volume)
    except docker.errors.NotFound:
        prepare_workspace_volume(client, volume, image, labels=labels)


def workspace_mount(container: Container) -> str | None:
    """The name of the volume mounted at the container's /workspace."""
    for mount in container.attrs.get("Mounts", []):
        if mount.get("Destination") == WORKSPACE and mount.get("Type") == "volume":
            return str(mount.get("Name"))
    return None


def session_containers(client: docker.DockerClient, session_id: str) -> list[Container]:
    """Every container of a session: those made for it (labelled) and warm pool members it claimed (renamed)."""
    labelled = client.containers.list(all=True, filters={"label": f"{SESSION_LABEL}={session_id}"}, ignore_removed=True)
    pattern = re.compile(rf"^/?{re.escape(container_name(session_id, 0)[:-1])}\d+$")
    named = client.containers.list(all=True, filters={"name": container_name(session_id, 0)[:-1]}, ignore_removed=True)
    by_id = {str(c.id): c for c in labelled}
    by_id.update({str(c.id): c for c in named if pattern.match(str(c.name))})
    return list(by_id.values())


def has_sandbox(client: docker.DockerClient, session_id: str, generation: int) -> bool:
    """Whether the session already has this generation's container or a workspace volume of its own (a fork's
    copy, or one made before the warm pool): two lookups by name, for the first call's fast path."""
    for lookup, name in ((client.containers.get, container_name(session_id, generation)),
                         (client.volumes.get, volume_name(session_id))):  # fmt: skip
        try:
            lookup(name)
            return True
        except docker.errors.NotFound:
            continue
    return False


def session_volume(client: docker.DockerClient, session_id: str) -> str | None:
    """The session's workspace volume as it exists on this engine: its own, or the pool member's it claimed."""
    own = volume_name(session_id)
    try:
        client.volumes.get(own)
        return own
    except docker.errors.NotFound:
        pass
    for container in session_containers(client, session_id):
        mounted = workspace_mount(container)
        if mounted:
            return mounted
    return None


def _create_with_open_stdin(
    client: docker.DockerClient, image: str, name: str, labels: dict[str, str], options: dict[str, Any]
) -> Container:
    """Create a sandbox whose main process is the resident runner, with a stdin that stays open across attaches.

    The SDK turns `stdin_open` into StdinOnce as well, which closes the container's stdin when the first attached
    client leaves: the runner would read end-of-file and the sandbox would end with the worker that made it. So
    the SDK builds the request from the same keyword arguments as `containers.create`, and StdinOnce is cleared."""
    command = [runner.RUNNER]
    version = client.api._version  # what `containers.create` passes too
    args = _create_container_args(
        {"image": image, "command": command, "name": name, "labels": labels, "version": version, **options}
    )
    args.pop("name")
    if isinstance(args.get("environment"), dict):
        args["environment"] = docker.utils.format_environment(args["environment"])
    config = client.api.create_container_config(**args)
    config["StdinOnce"] = False
    created = client.api.create_container_from_config(config, name)
    return client.containers.get(created["Id"])


def _reusable_container(client: docker.DockerClient, name: str, networking: str) -> Container | None:
    """The container `name` if it can run again as it is; one that is dead, or that shares a network with other
    sandboxes (made before each had its own), is removed (its workspace is a volume, and is kept)."""
    try:
        container = client.containers.get(name)
    except docker.errors.NotFound:
        return None
    if container.status not in ("running", "created", "exited"):
        container.remove(force=True)  # dead or being removed: make a fresh one
        return None
    if container.labels.get(runner.RUNNER_LABEL) != runner.PROTOCOL_VERSION:
        log.info("sandbox %s was made without this version's resident runner; making it again", name)
        container.remove(force=True)
        return None
    joined = container.attrs.get("NetworkSettings", {}).get("Networks") or {}  # a claimed member joined its own
    mode = container.attrs.get("HostConfig", {}).get("NetworkMode")
    if mode != _network_mode(name, networking) and not (networking != "none" and name in joined):
        log.info("sandbox %s shares a network with other sandboxes; making it again on a network of its own", name)
        container.remove(force=True)
        return None
    return container


def _network_mode(name: str, networking: str) -> str:
    """A sandbox's network: its own (named after it) unless it has none."""
    return "none" if networking == "none" else name


def _egress_git_host(client: docker.DockerClient, base_image: str) -> str:
    """The host address a limited sandbox reaches the git proxy at, through the egress proxy."""
    egress.ensure_egress(client, base_image)
    return egress.gateway(client, egress.EGRESS_NETWORK)


def _clone(container: Container, repository: RepositoryClone, proxy: str) -> None:
    """Clone through the git proxy (it adds the token outside the sandbox); a workspace that survived a dead
    container already has the clone, and keeps it."""
    commands = clone_commands(repository, proxy)
    if _in_sandbox(container, commands.present).exit_code == 0:
        return
    for command in (commands.clone, commands.checkout):
        if command is None:
            continue
        result = _in_sandbox(container, command)
        if result.exit_code != 0:
            output = result.output.decode(errors="replace")[-800:]
            raise SandboxSetupError(
                f"could not clone repository {repository.repository_id} into {repository.mount_path}: {output}"
            )


def _in_sandbox(container: Container, command: list[str]) -> Any:
    """Run one argv as the sandbox user, git never asking for a password."""
    return container.exec_run(command, user=f"{SANDBOX_UID}:{SANDBOX_GID}", environment={"GIT_TERMINAL_PROMPT": "0"})


def _run_options(environment: Environment, volume: str, name: str) -> dict[str, Any]:
    """The hardened defaults, with the recipe's limits and networking."""
    limits = environment.limits
    options = hardened_run_options(volume)
    options.pop("nano_cpus")  # a quota instead, which `docker update` can change
    networking = environment.networking.type
    options.update(
        mem_limit=f"{limits.memory_mb}m",
        memswap_limit=f"{limits.memory_mb}m",
        cpu_period=CPU_PERIOD,
        cpu_quota=cpu_quota(limits.cpus),
        pids_limit=limits.pids,
        network_mode=_network_mode(name, networking),
        working_dir=environment.working_dir,
        # The resident runner reads its requests on stdin and answers on stdout, to the attached worker only: no
        # log driver, so neither commands nor outputs are written to the engine's disk.
        stdin_open=True,
        log_config=docker.types.LogConfig(type="none"),
        # Nothing from the host: the image's PATH, LANG and HOME, plus the egress proxy for limited networking.
        environment=egress.proxy_environment() if networking == "limited" else {},
        tmpfs={
            "/tmp": f"rw,nosuid,nodev,size={limits.tmp_mb}m",
            STATE_DIR: f"rw,nosuid,nodev,noexec,size=64m,uid={SANDBOX_UID},gid={SANDBOX_GID},mode=0700",
            OUTPUT_DIR: f"rw,nosuid,nodev,noexec,size={OUTPUT_TMPFS_MB}m,uid={SANDBOX_UID},gid={SANDBOX_GID},mode=0700",
            "/home/sandbox": f"rw,nosuid,nodev,size=16m,uid={SANDBOX_UID},gid={SANDBOX_GID},mode=0755",
        },
    )
    return options


def get_running(client: docker.DockerClient, container_id: str) -> Container:
    """The container, or SandboxGone saying what happened to it."""
    try:
        container = client.containers.get(container_id)
    except docker.errors.NotFound:
        raise SandboxGone("the sandbox container no longer exists (it was removed)") from None
    if container.status != "running":
        raise SandboxGone(describe_death(container))
    if container.labels.get(runner.RUNNER_LABEL) != runner.PROTOCOL_VERSION:
        raise SandboxGone("the sandbox container was made by an earlier version of corral, without its resident runner")
    return container


def describe_death(container: Container) -> str:
    state = container.attrs.get("State", {})
    if state.get("OOMKilled"):
        return "the sandbox container was killed because it ran out of memory"
    code = state.get("ExitCode")
    reason = " (killed)" if code == 137 else ""
    return f"the sandbox container stopped: it is {container.status}, exit code {code}{reason}"


def _create_exec(client: docker.DockerClient, container: Container, command: list[str], workdir: str) -> str:
    created = client.api.exec_create(
        container.id,
        command,
        stdin=True,
        stdout=True,
        stderr=True,
        user=f"{SANDBOX_UID}:{SANDBOX_GID}",
        environment={"CORRAL_WORKDIR": workdir},
    )
    return str(created["Id"])


def _feed_exec(client: docker.DockerClient, exec_id: str, data: bytes) -> tuple[bytes, bytes]:
    """Start the exec, write `data` to its stdin and close it, and return its stdout and stderr once it ends.

    Through stdin, not the command line: Linux caps one argument at 128 KiB (MAX_ARG_STRLEN), which a write's
    content or a long command passes ("argument list too long"). The frames are joined once at the end: the
    SDK's own `demux` adds them up one by one, which takes minutes for tens of megabytes.
    """
    stream = client.api.exec_start(exec_id, socket=True)
    raw = getattr(stream, "_sock", stream)
    chunks: dict[int, list[bytes]] = {STDOUT: [], STDERR: []}
    try:
        raw.sendall(data)
        raw.shutdown(socket.SHUT_WR)
        for stream_id, chunk in frames_iter(stream, tty=False):
            chunks.setdefault(stream_id, []).append(chunk)
    finally:
        stream.close()
    return b"".join(chunks[STDOUT]), b"".join(chunks[STDERR])


def call_output_file(container: Container, call_id: str) -> bytes:
    """The whole output of a bash call, as the container recorded it (SandboxError when it is not there). Read by
    `cat` in the container: the daemon's archive API does not see the tmpfs the calls are recorded in."""
    client = container.client
    assert client is not None
    command = call_output_command(call_id)
    try:
        exec_id = _create_exec(client, container, command, "/")
        stdout, stderr = _feed_exec(client, exec_id, b"")
        exit_code = client.api.exec_inspect(exec_id).get("ExitCode")
    except docker.errors.APIError as exc:
        raise _gone_or_raise(container, exc) from exc
    if exit_code != 0:
        raise SandboxError(f"the output of call {call_id} could not be read: {stderr.decode()[-300:]}")
    return stdout


def _gone_or_raise(container: Container, exc: docker.errors.APIError) -> Exception:
    try:
        container.reload()
    except docker.errors.NotFound:
        return SandboxGone("the sandbox container no longer exists (it was removed)")
    if container.status != "running":
        return SandboxGone(describe_death(container))
    return exc


def stop_container(client: docker.DockerClient, container_id: str) -> None:
    try:
        client.containers.get(container_id).stop(timeout=2)
    except docker.errors.NotFound:
        pass
    egress.refresh_policy(client)


def remove_session(client: docker.DockerClient, session_id: str, remove_volume: bool) -> int:
    """Remove every container of a session (and its workspace volume); returns how many containers."""
    containers = session_containers(client, session_id)
    volumes = {volume_name(session_id)} | {v for v in map(workspace_mount, containers) if v}
    for container in containers:
        container.remove(force=True)
    networks.remove_networks(client, f"{SESSION_LABEL}={session_id}")
    if remove_volume:
        for volume in volumes:
            remove_oneshots(client, volume)  # one a killed worker left would hold the volume
            try:
                client.volumes.get(volume).remove(force=True)
            except docker.errors.NotFound:
                pass
    if containers:
        egress.refresh_policy(client)
    return len(containers)


def session_ids_with_containers(client: docker.DockerClient, scope: str) -> set[str]:
    """Sessions of `scope` (cluster and namespace) that have a container (running or stopped) on this engine, or
    a sandbox network left without one (its worker died between making the network and the container)."""
    containers = client.containers.list(all=True, filters={"label": f"{SCOPE_LABEL}={scope}"}, ignore_removed=True)
    sessions = {str(c.labels[SESSION_LABEL]) for c in containers if SESSION_LABEL in c.labels}
    # Warm pool members claimed by a session carry its name (`corral-<session>-g<n>`), not its label.
    claimed = (CLAIMED_NAME.match(str(c.name)) for c in containers if SESSION_LABEL not in c.labels)
    sessions |= {match.group(1) for match in claimed if match}
    for network in client.networks.list(filters={"label": [f"{SCOPE_LABEL}={scope}", egress.NETWORK_LABEL]}):
        session_id = (network.attrs.get("Labels") or {}).get(SESSION_LABEL)
        if session_id:
            sessions.add(str(session_id))
    return sessions
