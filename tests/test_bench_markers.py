"""The load and recovery benchmarks count a sandbox command's runs by the lines of a marker file in its container."""

from __future__ import annotations

import asyncio

import docker

from bench.recovery import command_runs, marker_lines
from corral.contract.sandbox import Environment
from sandbox.containers import ensure_container
from sandbox.sessions import remove_session
from tests.conftest import unique


async def test_a_marker_file_is_counted_by_its_lines_and_a_missing_one_is_none(
    docker_client: docker.DockerClient, sandbox_image: str
) -> None:
    session_id = unique("sesn_markers")
    made = await asyncio.to_thread(ensure_container, docker_client, session_id, Environment(), 0, sandbox_image)
    try:
        container = docker_client.containers.get(made.container_id)
        assert await asyncio.to_thread(marker_lines, container) == (0, 0), "no marker file yet: no run"
        append = ["sh", "-c", "for n in 1 2 3; do echo run >> /workspace/runs; done"]
        await asyncio.to_thread(container.exec_run, append, user="1000:1000")
        assert await asyncio.to_thread(marker_lines, container) == (3, 0)
        assert await asyncio.to_thread(command_runs, docker_client, session_id) == (3, 0)
        assert await asyncio.to_thread(command_runs, docker_client, unique("sesn_none")) == (-1, 0)
    finally:
        await asyncio.to_thread(remove_session, docker_client, session_id, True)
