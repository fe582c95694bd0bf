"""Session containers on a Docker engine: create or restart from a recipe, or make and settle a warm pool member.

Every container's main process is the resident runner (`sandbox/runner.py` talks to it). How a session's sandbox
is named, found and removed is `sandbox/sessions.py`; reading from one that runs, `sandbox/running.py`.

No Temporal here: the sandbox activities call these functions (in a thread, the Docker SDK is synchronous) and
translate `SandboxGone` into what the session shows the model.
"""

from __future__ import annotations

import hashlib
import io
import json
import logging
from dataclasses import dataclass
from typing import Any

import docker
import docker.errors
import docker.types
import docker.utils
from docker.models.containers import Container, _create_container_args

from corral.contract.sandbox import Environment, RepositoryClone
from corral.names import DEFAULT_GIT_PROXY_PORT
from sandbox import egress, networks, runner
from sandbox.commands import (
    OUTPUT_DIR,
    STATE_DIR,
    clone_commands,
    packages_dockerfile,
    working_dir_command,
)
from sandbox.errors import SandboxSetupError
from sandbox.knowledge import KNOWLEDGE_TMPFS
from sandbox.sessions import GENERATION_LABEL, SCOPE_LABEL, SESSION_LABEL, container_name, session_volume, volume_name
from sandbox.workspace import (
    SANDBOX_GID,
    SANDBOX_UID,
    WORKSPACE,
    chown_workspace,
    hardened_run_options,
    prepare_workspace_volume,
)

log = logging.getLogger(__name__)

OUTPUT_TMPFS_MB = 64
MAX_COMMAND_BYTES = 512 * 1024
"""The longest bash command (UTF-8): as much as the write tool's content, more than a model writes in one reply."""


POOL_VOLUME_PREFIX = "corral-ws-pool."
"""A warm pool member's workspace volume (the dot keeps it apart from any session's `corral-ws-<id>`)."""


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
            **KNOWLEDGE_TMPFS,
        },
    )
    return options
