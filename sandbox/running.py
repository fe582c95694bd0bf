"""A session's running sandbox: the container if it still runs (else `SandboxGone` saying what became of it),
and the recorded output of a bash call, read out of it.
"""

from __future__ import annotations

import socket

import docker
import docker.errors
from docker.models.containers import Container
from docker.utils.socket import STDERR, STDOUT, frames_iter

from sandbox import runner
from sandbox.commands import call_output_command
from sandbox.errors import SandboxError, SandboxGone
from sandbox.workspace import SANDBOX_GID, SANDBOX_UID


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
