"""Fork: a new session whose log is another's up to a position, then its own; the source is only read."""

from __future__ import annotations

import docker
import pytest

from corral.client import fork_session, read_events, send_text
from corral.contract.session import AgentConfig
from tests.conftest import Stack, stop_reason, texts, wait_for_idle


async def test_a_fork_shares_the_prefix_then_goes_its_own_way(stack: Stack) -> None:
    model = stack.script([{"text": "Reply.", "echo_last_user": True}], loop=True)
    source = await stack.start(model, "first question")
    first = await wait_for_idle(source)
    fork_at = first[-1].position  # the end of the first exchange
    await send_text(source, "second question, source only")
    await wait_for_idle(source, after=fork_at)
    before = [event.model_dump() for event in await read_events(source)]

    fork = await fork_session(stack.client, source.id, fork_at)
    stack.started.append(fork)
    await send_text(fork, "second question, fork only")
    answered = await wait_for_idle(fork, after=fork_at)
    assert stop_reason(answered[-1]).type == "end_turn"

    forked = await read_events(fork)
    assert [e.model_dump() for e in forked[:fork_at]] == before[:fork_at], "the prefix is the source's, as it was"
    assert texts(forked[fork_at:])[-1].endswith("second question, fork only"), "the fork goes on by itself"
    assert "second question, source only" not in str([e.model_dump() for e in forked])
    assert [e.model_dump() for e in await read_events(source)] == before, "the source is untouched"
    model_saw = str(stack.requests(model)[-1]["body"]["messages"])
    assert "first question" in model_saw, "the model sees the copied conversation"
    assert [e.position for e in forked] == list(range(1, len(forked) + 1))
    details = await (await fork.describe()).static_details()
    assert details is not None and source.id in details


async def test_a_position_the_source_does_not_have_is_refused(stack: Stack) -> None:
    model = stack.script([{"text": "Reply."}], loop=True)
    source = await stack.start(model, "hello")
    events = await wait_for_idle(source)
    with pytest.raises(ValueError, match=f"holds positions 1 to {events[-1].position}"):
        await fork_session(stack.client, source.id, events[-1].position + 5)


async def test_a_fork_gets_a_copy_of_the_workspace(
    sandbox_stack: Stack, docker_client: docker.DockerClient, sandbox_image: str
) -> None:
    stack = sandbox_stack
    write = {"tool_uses": [{"name": "bash", "input": {"command": "echo from-the-source > /workspace/kept.txt"}}]}
    read = {"tool_uses": [{"name": "bash", "input": {"command": "cat /workspace/kept.txt; echo more >> kept.txt"}}]}
    source_model = stack.script([write, {"text": "written"}])
    toolset = [{"type": "agent_toolset_20260401"}]
    source = await stack.start(source_model, "write it", tools=toolset)
    written = await wait_for_idle(source, within_seconds=120)

    # The fork's conversation starts with the source's two assistant turns: a looping script picks `read` next.
    reader = AgentConfig.model_validate({"model": stack.script([read, {"text": "read"}], loop=True), "tools": toolset})
    fork = await fork_session(stack.client, source.id, written[-1].position, agent=reader)
    stack.started.append(fork)
    await send_text(fork, "read it")
    events = await wait_for_idle(fork, after=written[-1].position, within_seconds=120)
    assert "from-the-source" in texts(events, "agent.tool_result")[-1], "the fork's workspace is a copy"
    assert not [e for e in events if e.type == "session.error"]
    source_file = docker_client.containers.run(
        sandbox_image, ["cat", "/w/kept.txt"], volumes={f"corral-ws-{source.id}": {"bind": "/w", "mode": "ro"}},
        remove=True, network_mode="none",
    )  # fmt: skip
    assert source_file.decode().strip() == "from-the-source", "the source's workspace is untouched by the fork"
