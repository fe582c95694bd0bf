"""The sandbox groundwork against a real Docker engine: the engine is found or started, the image is built once
(cached in the engine and keyed by its recipe), and a sandbox run with the hardened flags can write only its
workspace and /tmp and has no network."""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import docker
import docker.errors
import pytest
from docker.types import Mount

from sandbox import ensure_docker_engine, ensure_sandbox_image, sandbox_image_tag
from sandbox.engine import our_daemon_pid
from sandbox.image import LAYER_DIR, base_work_dir
from sandbox.rootfs import PACKAGES, host_debian_mirror
from sandbox.workspace import SANDBOX_UID, WORKSPACE, hardened_run_options, prepare_workspace_volume

STATE_DIR = Path(__file__).resolve().parents[1] / ".corral"
"""The repo's git-ignored state dir, so the engine and the image build are shared with `corral up` and reused."""


@dataclass
class Ran:
    exit_code: int
    output: str

    def values(self) -> dict[str, str]:
        """The `key=value` lines a test script printed."""
        pairs = (line.split("=", 1) for line in self.output.splitlines() if "=" in line)
        return {key: value for key, value in pairs}


def run(client: docker.DockerClient, image: str, script: str, **options: Any) -> Ran:
    """Run `script` with bash in a fresh container and return its exit code and combined output."""
    container = client.containers.run(image, ["bash", "-c", script], detach=True, **options)
    try:
        status = container.wait(timeout=60)
        output = container.logs(stdout=True, stderr=True).decode(errors="replace")
    finally:
        container.remove(force=True)
    return Ran(int(status["StatusCode"]), output)


@pytest.fixture
def workspace_volume(docker_client: docker.DockerClient) -> Iterator[str]:
    name = f"corral-test-workspace-{uuid.uuid4().hex[:10]}"
    yield name
    try:
        docker_client.volumes.get(name).remove(force=True)
    except docker.errors.NotFound:
        pass


def test_image_runs_as_the_sandbox_user_in_workspace(docker_client: docker.DockerClient, sandbox_image: str) -> None:
    ran = run(docker_client, sandbox_image, 'echo "uid=$(id -u)"; echo "user=$(id -un)"; echo "pwd=$PWD"')
    assert ran.exit_code == 0, ran.output
    assert ran.values() == {"uid": str(SANDBOX_UID), "user": "sandbox", "pwd": WORKSPACE}


def test_image_has_the_agent_tools(docker_client: docker.DockerClient, sandbox_image: str) -> None:
    script = "python3 --version && git --version && rg --version && curl --version && ps --version && patch --version"
    ran = run(docker_client, sandbox_image, script)
    assert ran.exit_code == 0, ran.output
    assert re.search(r"^Python 3\.\d+", ran.output, re.M)
    assert re.search(r"^git version 2\.", ran.output, re.M)
    assert re.search(r"^ripgrep \d+", ran.output, re.M)


def test_workspace_is_writable_by_the_sandbox_user(docker_client: docker.DockerClient, sandbox_image: str) -> None:
    ran = run(docker_client, sandbox_image, "echo hello > note.txt && cat /workspace/note.txt && stat -c %u .")
    assert ran.exit_code == 0, ran.output
    assert ran.output.split() == ["hello", str(SANDBOX_UID)]


HARDENED_PROBE = r"""
probe() { if ( : > "$1" ) 2>/dev/null; then echo "$1=writable"; else echo "$1=denied"; fi; }
for path in /workspace/f /tmp/f /f /etc/f /usr/f /home/sandbox/f /var/tmp/f /dev/shm/f; do probe "$path"; done
echo "uid=$(id -u)"
echo "net=$(ls /sys/class/net | tr '\n' ' ' | sed 's/ $//')"
echo "routes=$(tail -n +2 /proc/net/route | wc -l)"
echo "listening=$(cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk '$4 == "0A"' | wc -l)"
echo "capeff=$(awk '/^CapEff/ {print $2}' /proc/self/status)"
echo "nonewprivs=$(awk '/^NoNewPrivs/ {print $2}' /proc/self/status)"
echo "pids_max=$(cat /sys/fs/cgroup/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids/pids.max)"
echo "init=$(tr '\0' ' ' < /proc/1/cmdline | cut -d' ' -f1)"
"""


def test_hardened_run_writes_only_workspace_and_tmp_and_has_no_network(
    docker_client: docker.DockerClient, sandbox_image: str, workspace_volume: str
) -> None:
    prepare_workspace_volume(docker_client, workspace_volume, sandbox_image)
    ran = run(docker_client, sandbox_image, HARDENED_PROBE, **hardened_run_options(workspace_volume))
    assert ran.exit_code == 0, ran.output
    values = ran.values()
    assert values["/workspace/f"] == "writable"
    assert values["/tmp/f"] == "writable"
    for path in ("/f", "/etc/f", "/usr/f", "/home/sandbox/f", "/var/tmp/f"):
        assert values[path] == "denied", path
    assert values["uid"] == str(SANDBOX_UID)
    assert values["net"] == "lo"  # network_mode=none: only the loopback interface ...
    assert values["routes"] == "0"  # ... and no route anywhere
    assert values["listening"] == "0"
    assert values["capeff"] == "0000000000000000"
    assert values["nonewprivs"] == "1"
    assert values["pids_max"] == "128"
    assert values["init"].endswith("docker-init")

    # The workspace outlives the container; the next sandbox on the same volume sees the file.
    again = run(docker_client, sandbox_image, "ls /workspace", **hardened_run_options(workspace_volume))
    assert again.output.split() == ["f"]


def test_fresh_volume_is_root_owned_until_prepared(
    docker_client: docker.DockerClient, sandbox_image: str, workspace_volume: str
) -> None:
    # `nocopy` stops Docker from copying the image's /workspace (and its owner) into the empty volume, as a volume
    # driver without copy-up would: the sandbox user then cannot write its workspace ...
    docker_client.volumes.create(name=workspace_volume)
    mount = Mount(target=WORKSPACE, source=workspace_volume, type="volume", no_copy=True)
    options = {key: value for key, value in hardened_run_options(workspace_volume).items() if key != "volumes"}
    options["mounts"] = [mount]
    probe = (
        'echo "owner=$(stat -c %u /workspace)"; if touch /workspace/f 2>/dev/null; then echo w=ok; else echo w=no; fi'
    )
    before = run(docker_client, sandbox_image, probe, **options)
    assert before.values() == {"owner": "0", "w": "no"}, before.output
    # ... until the volume is prepared.
    prepare_workspace_volume(docker_client, workspace_volume, sandbox_image)
    after = run(docker_client, sandbox_image, probe, **options)
    assert after.values() == {"owner": str(SANDBOX_UID), "w": "ok"}, after.output


def test_engine_and_image_are_reused_not_rebuilt(docker_client: docker.DockerClient, sandbox_image: str) -> None:
    pid_before = our_daemon_pid(STATE_DIR)
    image_id = docker_client.images.get(sandbox_image).id
    messages: list[str] = []

    client = ensure_docker_engine(STATE_DIR, progress=messages.append)
    tag = ensure_sandbox_image(client, STATE_DIR, progress=messages.append)

    assert tag == sandbox_image == sandbox_image_tag()
    assert messages == []  # nothing installed, started, debootstrapped or built
    assert not base_work_dir(STATE_DIR).exists()  # no debootstrap root was made (nor left behind)
    assert client.images.get(tag).id == image_id
    assert our_daemon_pid(STATE_DIR) == pid_before  # no second dockerd


def test_production_dockerfile_matches_the_local_recipe() -> None:
    production = (LAYER_DIR / "Dockerfile").read_text()
    layer = (LAYER_DIR / "Dockerfile.layer").read_text()
    install = re.search(r"--no-install-recommends \\\n(.*?) \\\n &&", production, re.S)
    assert install is not None
    assert sorted(install.group(1).replace("\\", " ").split()) == sorted(PACKAGES)

    def after_from(text: str) -> str:
        return text.split("\nFROM ", 1)[1].split("\n", 1)[1]

    assert after_from(layer) in production


def test_host_debian_mirror_reads_both_source_formats(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "extra.list").write_text(
        "deb [arch=amd64] https://example.invalid/apt stable main\n"
    )
    (tmp_path / "sources.list.d" / "debian.sources").write_text(
        "Types: deb\n# a comment\nURIs: http://mirror.invalid/debian/\nSuites: bookworm bookworm-updates\n"
        "Components: main\n\nTypes: deb\nURIs: http://security.invalid/debian-security\n"
        "Suites: bookworm-security\nComponents: main\n"
    )
    assert host_debian_mirror("bookworm", apt_dir=tmp_path) == "http://mirror.invalid/debian"
    (tmp_path / "sources.list").write_text("# old style\ndeb http://old.invalid/debian bookworm main contrib\n")
    assert host_debian_mirror("bookworm", apt_dir=tmp_path) == "http://old.invalid/debian"
    assert host_debian_mirror("trixie", apt_dir=tmp_path) == "http://deb.debian.org/debian"
