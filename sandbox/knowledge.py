"""Files, skills and memory stores in a sandbox, under `/mnt` (corral.contract.knowledge): placed when the sandbox is
made or re-made, and read back after each turn (what the agent wrote to its outputs and its writable stores).

Every sandbox has a `/mnt` of its own in memory (`KNOWLEDGE_TMPFS`), owned by root: what root places there (file
resources, skills, read-only stores) the sandbox user can read and not change. `/mnt/session/outputs` is the
sandbox user's, and `/mnt/memory` is sticky and open to all (as `/tmp` is), so each store's directory is its
placer's: root's for a read-only store, the sandbox user's for a writable one, and none can be removed by the other.

Bytes go in and out through `tar` in the container, over an exec's stdin and stdout, never through a shell string:
the paths are tar members that corral builds, and what comes back is read as data (regular files only; a link or
a device the agent made is not followed). The container's root has no capabilities, so it cannot change an owner:
what must be the sandbox user's is extracted by the sandbox user.
"""

from __future__ import annotations

import hashlib
import io
import socket
import struct
import tarfile
import time
from collections.abc import Iterable

import docker

from corral.blobs import BlobStore
from corral.contract.knowledge import (
    MEMORY_DIR,
    OUTPUTS_DIR,
    SKILLS_DIR,
    CollectedFile,
    CollectedStore,
    MemoryExport,
    SessionKnowledge,
)
from corral.contract.sandbox import CollectInput
from sandbox.errors import SandboxError
from sandbox.workspace import SANDBOX_GID, SANDBOX_UID

KNOWLEDGE_TMPFS_MB = 512
OUTPUTS_TMPFS_MB = 256
MEMORY_TMPFS_MB = 256
KNOWLEDGE_TMPFS = {
    "/mnt": f"rw,exec,nosuid,nodev,size={KNOWLEDGE_TMPFS_MB}m,mode=0755",  # exec: a skill may hold scripts
    OUTPUTS_DIR: f"rw,nosuid,nodev,size={OUTPUTS_TMPFS_MB}m,uid={SANDBOX_UID},gid={SANDBOX_GID},mode=0755",
    MEMORY_DIR: f"rw,nosuid,nodev,size={MEMORY_TMPFS_MB}m,mode=1777",
}
"""The sandbox's `/mnt` mounts: in memory, bounded, gone with the container (placed again when it is re-made)."""
MAX_COLLECTED_FILE_BYTES = 100 * 1024 * 1024
"""An output larger than this is not kept (the tmpfs bounds the whole directory anyway)."""
ROOT = "0:0"
SANDBOX_USER = f"{SANDBOX_UID}:{SANDBOX_GID}"
_EXEC_END_TIMEOUT_S = 30.0


def _tar(entries: Iterable[tuple[str, bytes | None, int]]) -> bytes:
    """A tar of `(path, bytes or None for a directory, mode)` members, paths relative to `/`."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for path, data, mode in entries:
            info = tarfile.TarInfo(path.lstrip("/"))
            info.mode, info.mtime = mode, int(time.time())
            if data is None:
                info.type = tarfile.DIRTYPE
                archive.addfile(info)
            else:
                info.size = len(data)
                archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def _parents(path: str, top: str) -> list[str]:
    """The directories between `top` (excluded) and `path` (excluded), outermost first."""
    parts = path[len(top) :].strip("/").split("/")[:-1]
    return [f"{top}/{'/'.join(parts[: index + 1])}" for index in range(len(parts))]


def _exec(client: docker.DockerClient, container_id: str, argv: list[str], user: str, stdin: bytes | None) -> bytes:
    """Run `argv` in the container as `user`, `stdin` written to it; its stdout, or SandboxError with its stderr."""
    api = client.api
    exec_id = api.exec_create(container_id, argv, stdin=stdin is not None, stdout=True, stderr=True, user=user)["Id"]
    sock = api.exec_start(exec_id, socket=True)
    raw = getattr(sock, "_sock", sock)
    try:
        if stdin is not None:
            raw.sendall(stdin)
            raw.shutdown(socket.SHUT_WR)
        received = bytearray()
        while chunk := raw.recv(1 << 16):
            received += chunk
    finally:
        sock.close()
    stdout, stderr = _demux(bytes(received))
    deadline = time.monotonic() + _EXEC_END_TIMEOUT_S
    while (state := api.exec_inspect(exec_id))["Running"] and time.monotonic() < deadline:
        time.sleep(0.02)  # the stream ended: the process is exiting
    if state["ExitCode"] != 0:
        raise SandboxError(f"{argv[0]} in the sandbox failed ({state['ExitCode']}): {stderr.decode(errors='replace')}")
    return stdout


def _demux(stream: bytes) -> tuple[bytes, bytes]:
    """Docker's multiplexed frames (8-byte header: stream, 3 zero bytes, big-endian length) split by stream."""
    out, err, at = bytearray(), bytearray(), 0
    while at + 8 <= len(stream):
        kind, size = stream[at], struct.unpack(">I", stream[at + 4 : at + 8])[0]
        (err if kind == 2 else out).extend(stream[at + 8 : at + 8 + size])
        at += 8 + size
    return bytes(out), bytes(err)


def _extract(client: docker.DockerClient, container_id: str, archive: bytes, user: str) -> None:
    _exec(client, container_id, ["tar", "-x", "--no-same-owner", "-C", "/", "-f", "-"], user, archive)


def place_knowledge(
    client: docker.DockerClient,
    container_id: str,
    blobs: BlobStore,
    knowledge: SessionKnowledge,
    memory: list[MemoryExport],
) -> None:
    """Put the session's files, skills and memory stores in place (again, after a restart: `/mnt` is in memory)."""
    owned: list[tuple[str, bytes | None, int]] = []  # root's: read-only for the agent
    for mount in knowledge.files:
        owned += [(parent, None, 0o755) for parent in _parents(mount.mount_path, "/mnt")]
        owned.append((mount.mount_path, blobs.get(mount.blob_key), 0o444))
    for skill in knowledge.skills:
        owned += _skill_members(skill.name, blobs.get(skill.blob_key))
    writable: list[tuple[str, bytes | None, int]] = []  # the sandbox user's
    exports = {export.memory_store_id: export for export in memory}
    for store in knowledge.memory_stores:
        if _exists(client, container_id, store.mount_path):
            continue  # placed in this container already: what the agent wrote since is collected, not overwritten
        export = exports.get(store.memory_store_id)
        members = _store_members(store.mount_path, blobs.get(export.blob_key) if export else None)
        if store.access == "read_only":
            owned += [(path, data, 0o444 if data is not None else 0o755) for path, data, _ in members]
        else:
            writable += [(path, data, 0o644 if data is not None else 0o755) for path, data, _ in members]
    if owned:
        _extract(client, container_id, _tar(owned), ROOT)
    if writable:
        _extract(client, container_id, _tar(writable), SANDBOX_USER)


def _exists(client: docker.DockerClient, container_id: str, path: str) -> bool:
    try:
        _exec(client, container_id, ["test", "-e", path], ROOT, None)
    except SandboxError:
        return False
    return True


def _skill_members(name: str, bundle: bytes) -> list[tuple[str, bytes | None, int]]:
    """A skill's bundle (a tar, SKILL.md at its root) under `/mnt/skills/<name>/`: regular files and directories."""
    top = f"{SKILLS_DIR}/{name}"
    members: list[tuple[str, bytes | None, int]] = [(SKILLS_DIR, None, 0o755), (top, None, 0o755)]
    with tarfile.open(fileobj=io.BytesIO(bundle)) as archive:
        for info in archive.getmembers():
            relative = info.name.lstrip("./").strip("/")
            if not relative or ".." in relative.split("/"):
                continue
            if info.isdir():
                members.append((f"{top}/{relative}", None, 0o755))
            elif info.isfile():
                extracted = archive.extractfile(info)
                data = extracted.read() if extracted is not None else b""
                members += [(parent, None, 0o755) for parent in _parents(f"{top}/{relative}", top)]
                members.append((f"{top}/{relative}", data, 0o555 if info.mode & 0o111 else 0o444))
    return members


def _store_members(mount_path: str, archive_bytes: bytes | None) -> list[tuple[str, bytes | None, int]]:
    """A memory store's export (a tar of its files, paths relative to the store) under its mount path."""
    members: list[tuple[str, bytes | None, int]] = [(mount_path, None, 0)]
    if archive_bytes is None:
        return members
    with tarfile.open(fileobj=io.BytesIO(archive_bytes)) as archive:
        for info in archive.getmembers():
            if not info.isfile():
                continue
            extracted = archive.extractfile(info)
            path = f"{mount_path}/{info.name.strip('/')}"
            members += [(parent, None, 0) for parent in _parents(path, mount_path)]
            members.append((path, extracted.read() if extracted is not None else b"", 0))
    return members


def _read_dir(client: docker.DockerClient, container_id: str, directory: str) -> dict[str, bytes]:
    """Every regular file under `directory` in the container, by path relative to it (empty if it is missing)."""
    script_free = ["tar", "-c", "-C", directory, "-f", "-", "."]
    try:
        raw = _exec(client, container_id, script_free, SANDBOX_USER, None)
    except SandboxError:
        return {}
    found: dict[str, bytes] = {}
    with tarfile.open(fileobj=io.BytesIO(raw)) as archive:
        for info in archive.getmembers():
            relative = info.name.removeprefix("./").strip("/")
            if not info.isfile() or not relative or info.size > MAX_COLLECTED_FILE_BYTES:
                continue
            extracted = archive.extractfile(info)
            if extracted is not None:
                found[relative] = extracted.read()
    return found


def _changes(found: dict[str, bytes], seen: dict[str, str], blobs: BlobStore, key_prefix: str) -> list[CollectedFile]:
    """What differs from `seen` (path -> sha256): changed or new files (their bytes put in the blob store under
    their hash), and removed ones."""
    changed: list[CollectedFile] = []
    for path, data in sorted(found.items()):
        digest = hashlib.sha256(data).hexdigest()
        if seen.get(path) == digest:
            continue
        key = f"{key_prefix}/{digest}"
        blobs.put(key, data)
        changed.append(CollectedFile(path=path, sha256=digest, size_bytes=len(data), blob_key=key))
    changed += [CollectedFile(path=path) for path in sorted(set(seen) - set(found))]
    return changed


def collect_knowledge(
    client: docker.DockerClient, blobs: BlobStore, input: CollectInput
) -> tuple[list[CollectedFile], list[CollectedStore]]:
    """What changed since the workflow last kept it: the outputs directory, and each writable memory store."""
    container_id = input.sandbox.container_id
    prefix = f"collected/{input.session_id}"
    outputs = _changes(_read_dir(client, container_id, OUTPUTS_DIR), input.outputs_seen, blobs, prefix)
    outputs = [output for output in outputs if output.sha256 is not None]  # a removed output stays a file
    stores = []
    for export in input.memory:
        mount = input.mounts.get(export.memory_store_id)
        if mount is None:
            continue
        found = _read_dir(client, container_id, mount)
        stores.append(CollectedStore(memory_store_id=export.memory_store_id,
                                     changed=_changes(found, export.manifest, blobs, prefix)))  # fmt: skip
    return outputs, stores
