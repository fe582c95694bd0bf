"""Self-hosted environments end to end: the official SDK's own `EnvironmentWorker`, unchanged, in a process of its
own with only the gateway's URL and an environment key (tests/self_hosted_worker.py), serving sessions made through
the API on a real gateway process, the Temporal dev server and the offline model server.

- A session's `bash` and `write` calls run on the worker's machine (here its temporary workdir, never a container),
  each answered by the worker's `user.tool_result`, which the model's next turn reads.
- A worker SIGKILLed mid-call: its lease lapses, the call it held is answered once as an error whose outcome is
  unknown and never run again, and a second worker serves the session's next call.
- Two workers polling one environment with two sessions: each item is served by one worker only.
- A `user.tool_result` for a call the session did not route to a worker, or already answered, is a 400 and nothing
  is written.

The tests wait on the worker's log lines (the SDK's own loggers) and on the session's log, never on time.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import docker
import httpx
import pytest

from corral.contract.work import WorkItem
from corral.names import ENV_WORK_LEASE_SECONDS
from corral.work_queue import WorkQueues
from sandbox.sessions import session_containers
from tests.chaos._processes import RoleProcess, role_process
from tests.conftest import Stack
from tests.self_hosted_worker import CLAIMED, EXECUTING, IDLE, KEY_VARIABLE
from tests.test_gateway import Gateway, running_gateway
from tests.waits import until

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "self_hosted_worker.py"
TOOLSET: Any = [{"type": "agent_toolset_20260401"}]
LEASE_VARIABLE = ENV_WORK_LEASE_SECONDS
LEASE_SECONDS = "5"
"""The gateway's lease in the SIGKILL test: a dead worker's item lapses this long after its last heartbeat (the SDK
heartbeats every half lease)."""

Client = anthropic.AsyncAnthropic


@dataclass
class SelfHosted:
    """A self-hosted environment of a workspace on a running gateway, its key, and the workers started for it."""

    gateway: Gateway
    stack: Stack
    client: Client
    environment_id: str
    key: str
    log_dir: Path
    workers: contextlib.ExitStack

    def worker(self, name: str, workdir: Path) -> RoleProcess:
        """Start the official worker as `name`, its tools running in `workdir`; stopped when the test ends."""
        workdir.mkdir(parents=True, exist_ok=True)
        argv = [sys.executable, "-m", "tests.self_hosted_worker", "--base-url", self.gateway.url,
                "--environment", self.environment_id, "--workdir", str(workdir), "--worker-id", name]  # fmt: skip
        return self.workers.enter_context(role_process(name, argv, self.log_dir, **{KEY_VARIABLE: self.key}))

    async def session(self, steps: list[dict[str, Any]], message: str = "go") -> tuple[str, str]:
        """A session in the environment whose model plays `steps`, sent `message`: (its id, the model's name)."""
        model = self.stack.script(steps)
        agent = await self.client.beta.agents.create(name="remote", model=model, tools=TOOLSET)
        session = await self.client.beta.sessions.create(agent=agent.id, environment_id=self.environment_id)
        await self.client.beta.sessions.events.send(
            session.id, events=[{"type": "user.message", "content": [{"type": "text", "text": message}]}]
        )
        return session.id, model

    async def items(self) -> list[WorkItem]:
        """The environment's work items, read from its queue (whom each was delivered to, how it ended)."""
        return await WorkQueues(self.stack.client, task_queue=self.stack.harness_queue).items(self.environment_id)


@contextlib.asynccontextmanager
async def self_hosted(stack: Stack, log_dir: Path, **gateway_env: str) -> AsyncIterator[SelfHosted]:
    """A gateway (its environment plus `gateway_env`), a self-hosted environment made through the API, a key for
    it; the workers started for it are stopped when the block ends."""
    async with running_gateway(stack, log_dir, **gateway_env) as gateway:
        client = await gateway.client("self-hosted")
        environment = await client.beta.environments.create(name="laptop", config={"type": "self_hosted"})
        async with httpx.AsyncClient(base_url=gateway.url, headers={"x-api-key": str(client.api_key)}) as http:
            made = await http.post(f"/v1/environments/{environment.id}/keys", json={"name": "test worker"})
        assert made.status_code == 200, made.text
        assert (made.json()["type"], made.json()["environment_id"]) == ("environment_key", environment.id)
        with contextlib.ExitStack() as workers:
            yield SelfHosted(gateway, stack, client, environment.id, made.json()["key"], log_dir, workers)


def log_lines(worker: RoleProcess, marker: str) -> list[str]:
    """The worker's log lines that carry `marker`."""
    return [line for line in worker.log.read_text().splitlines() if marker in line] if worker.log.exists() else []


def executed(worker: RoleProcess) -> list[str]:
    """The tool-use ids of the calls the worker ran, in order."""
    return [re.findall(r"tool_use_id=(\S+)", line)[0] for line in log_lines(worker, EXECUTING)]


def claimed(worker: RoleProcess) -> list[str]:
    """The work ids the worker claimed (acknowledged), in order."""
    return [re.findall(r"work_id=(\S+)", line)[0] for line in log_lines(worker, CLAIMED)]


async def events_of(client: Client, session_id: str) -> list[Any]:
    return [event async for event in client.beta.sessions.events.list(session_id, limit=500)]


async def done(client: Client, session_id: str, answer: str = "done") -> list[Any]:
    """The session's log once its model said `answer` and the session is idle."""
    seen: list[Any] = []

    async def answered() -> bool:
        seen[:] = await events_of(client, session_id)
        said = any(e.type == "agent.message" and answer in text_of(e) for e in seen)
        return said and seen[-1].type == "session.status_idle"

    await until(answered, f"session {session_id} answering {answer!r} and idle", within=180)
    return seen


def text_of(event: Any) -> str:
    return "".join(getattr(block, "text", "") for block in event.content)


def answers(events: list[Any], tool_use_id: str) -> list[Any]:
    """Every event that answers the call `tool_use_id`, in log order."""
    return [e for e in events if e.type in ("agent.tool_result", "user.tool_result") and e.tool_use_id == tool_use_id]


def model_saw(stack: Stack, model: str, text: str) -> bool:
    """Whether a request the model got (a later turn) carried `text`."""
    return any(text in str(request["body"]["messages"]) for request in stack.requests(model))


def blocking(directory: Path) -> tuple[Path, Path, str]:
    """(runs, release, a `bash` command that notes each run of it in `runs`, then blocks until `release` exists)."""
    runs, release = directory / "runs", directory / "release"
    return runs, release, f"echo started >> {runs}; while [ ! -e {release} ]; do sleep 0.05; done; echo released"


def tool_result(tool_use_id: str, text: str) -> Any:
    """A `user.tool_result` as a worker sends it."""
    return {"type": "user.tool_result", "tool_use_id": tool_use_id, "content": [{"type": "text", "text": text}]}


def tool_uses(events: list[Any]) -> list[Any]:
    return [e for e in events if e.type == "agent.tool_use"]


async def test_the_official_worker_runs_bash_and_write_on_its_own_machine(
    sandbox_stack: Stack, docker_client: docker.DockerClient, tmp_path: Path
) -> None:
    """corral's own sandbox hand runs beside it, so "no container" says the session never asked it for one."""
    async with self_hosted(sandbox_stack, tmp_path) as hosted:
        workdir = tmp_path / "laptop"
        worker = hosted.worker("laptop", workdir)
        session_id, model = await hosted.session([
            {"tool_uses": [{"name": "bash", "input": {"command": "echo hi > made_by_bash.txt && pwd"}}]},
            {"tool_uses": [{"name": "write", "input": {"file_path": "notes/plan.md", "content": "# from write\n"}}]},
            {"text": "done"},
        ], "make the files")  # fmt: skip
        events = await done(hosted.client, session_id)

        assert (workdir / "made_by_bash.txt").read_text() == "hi\n"
        assert (workdir / "notes" / "plan.md").read_text() == "# from write\n"
        assert session_containers(docker_client, session_id) == [], "a self-hosted session makes no container"
        uses = tool_uses(events)
        assert [(use.name, use.evaluated_permission) for use in uses] == [("bash", "allow"), ("write", "allow")]
        flow = [e.type for e in events if e.type in ("agent.tool_use", "user.tool_result", "agent.tool_result")]
        assert flow == ["agent.tool_use", "user.tool_result"] * 2, "the worker's result is the answer, alone"
        [bash_result] = answers(events, uses[0].id)
        assert not bash_result.is_error and text_of(bash_result).strip() == os.path.realpath(workdir)
        [write_result] = answers(events, uses[1].id)
        assert not write_result.is_error and "notes/plan.md" in text_of(write_result)
        assert model_saw(hosted.stack, model, os.path.realpath(workdir)), "the model's next turn read the output"
        assert executed(worker) == [use.id for use in uses]
        [item] = await hosted.items()
        assert (item.session_id, item.delivered_to, claimed(worker)) == (session_id, "laptop", [item.id])

        # A result for a call already answered: refused, naming the call, and nothing is written.
        with pytest.raises(anthropic.BadRequestError, match=re.escape(uses[0].id)):
            await hosted.client.beta.sessions.events.send(session_id, events=[tool_result(uses[0].id, "again")])
        assert [e.id for e in await events_of(hosted.client, session_id)] == [e.id for e in events]


async def test_a_worker_killed_mid_call_loses_the_item_and_the_call_is_never_run_twice(
    stack: Stack, tmp_path: Path
) -> None:
    runs, release, command = blocking(tmp_path)
    async with self_hosted(stack, tmp_path, **{LEASE_VARIABLE: LEASE_SECONDS}) as hosted:
        first = hosted.worker("first", tmp_path / "first")
        session_id, model = await hosted.session([
            {"tool_uses": [{"name": "bash", "input": {"command": command}}]},
            {"tool_uses": [{"name": "bash", "input": {"command": "echo after > after.txt && echo second call"}}]},
            {"text": "done"},
        ])  # fmt: skip
        await until(lambda: executed(first) and runs.exists(), "the first worker running the blocking call")
        [killed_call] = executed(first)
        second = hosted.worker("second", tmp_path / "second")
        await until(lambda: log_lines(second, IDLE), "the second worker polling, with nothing to take")
        first.kill()  # SIGKILL mid-call: no stop, no result, no last heartbeat

        events = await done(hosted.client, session_id)
        release.touch()  # were the killed command still alive anywhere, it could finish now: it must not
        [lost] = answers(events, killed_call)
        assert lost.type == "agent.tool_result" and lost.is_error, "answered once, by the session, as an error"
        assert "outcome is unknown" in text_of(lost)
        assert model_saw(hosted.stack, model, "outcome is unknown"), "the model was told"
        [_, next_call] = tool_uses(events)
        [served] = answers(events, next_call.id)
        assert served.type == "user.tool_result" and "second call" in text_of(served)
        assert (tmp_path / "second" / "after.txt").read_text() == "after\n"
        assert executed(second) == [next_call.id], "the second worker never ran the killed call"
        assert runs.read_text() == "started\n", "the killed command ran once"

        items = {item.id: item for item in await hosted.items()}
        [lost_item] = claimed(first)
        [new_item] = claimed(second)
        assert items[lost_item].end_reason == "lease_lost" and items[lost_item].state == "stopped"
        assert items[new_item].delivered_to == "second" and new_item != lost_item
        with pytest.raises(anthropic.BadRequestError, match=re.escape(killed_call)):
            await hosted.client.beta.sessions.events.send(session_id, events=[tool_result(killed_call, "late")])
        assert runs.read_text() == "started\n"


async def test_two_workers_on_one_environment_never_serve_the_same_item(stack: Stack, tmp_path: Path) -> None:
    runs, release, command = blocking(tmp_path)
    async with self_hosted(stack, tmp_path) as hosted:
        workers = [hosted.worker(name, tmp_path / name) for name in ("left", "right")]
        bash = {"tool_uses": [{"name": "bash", "input": {"command": command}}]}
        steps: list[dict[str, Any]] = [bash, {"text": "done"}]
        sessions = [(await hosted.session(steps))[0] for _ in range(2)]
        # Each worker serves one item at a time: while both calls block, each is held by another worker.
        both = "started\n" * 2

        def both_running() -> bool:
            return all(executed(worker) for worker in workers) and runs.exists() and runs.read_text() == both

        await until(both_running, "both workers running a call at once")
        release.touch()
        logs = [await done(hosted.client, session_id) for session_id in sessions]

        calls = [tool_uses(events)[0].id for events in logs]
        assert sorted(executed(workers[0]) + executed(workers[1])) == sorted(calls), "each call run once, by one"
        left, right = (set(claimed(worker)) for worker in workers)
        assert len(left) == len(right) == 1 and not left & right, "each item claimed by one worker"
        items = {item.id: item for item in await hosted.items()}
        assert {items[work_id].delivered_to for work_id in left} == {"left"}
        assert {items[work_id].delivered_to for work_id in right} == {"right"}
        assert {item.session_id for item in items.values()} == set(sessions)
        for events in logs:
            assert [e.type for e in answers(events, tool_uses(events)[0].id)] == ["user.tool_result"]
        assert runs.read_text() == both


async def test_a_tool_result_for_a_call_no_worker_was_asked_for_is_refused(stack: Stack, tmp_path: Path) -> None:
    async with running_gateway(stack, tmp_path) as gateway:
        client = await gateway.client("cloud")
        model = stack.script([{"tool_uses": [{"name": "lookup", "input": {"q": "x"}}]}, {"text": "done"}])
        custom: Any = {"type": "custom", "name": "lookup", "description": "look up", "input_schema": {"type": "object"}}
        agent = await client.beta.agents.create(name="asker", model=model, tools=[custom])
        environment = await client.beta.environments.create(name="cloud")
        session = await client.beta.sessions.create(agent=agent.id, environment_id=environment.id)
        await client.beta.sessions.events.send(
            session.id, events=[{"type": "user.message", "content": [{"type": "text", "text": "look"}]}]
        )
        seen: list[Any] = []

        async def waiting() -> bool:
            seen[:] = await events_of(client, session.id)
            return seen[-1].type == "session.status_idle" and seen[-1].stop_reason.type == "requires_action"

        await until(waiting, "the session waiting for its custom tool's result")
        [call] = [e for e in seen if e.type == "agent.custom_tool_use"]
        for tool_use_id in (call.id, "sevt_nosuchcall"):
            with pytest.raises(anthropic.BadRequestError, match=r"user\.tool_result") as refused:
                await client.beta.sessions.events.send(session.id, events=[tool_result(tool_use_id, "x")])
            assert "self-hosted" in str(refused.value)
            assert [e.id for e in await events_of(client, session.id)] == [e.id for e in seen], "nothing written"
        right: Any = {"type": "user.custom_tool_result", "custom_tool_use_id": call.id,
                      "content": [{"type": "text", "text": "found"}]}  # fmt: skip
        await client.beta.sessions.events.send(session.id, events=[right])
        await done(client, session.id)


def test_the_readme_and_the_page_show_the_example_workers_lines() -> None:
    """The README's five lines are the example's own (the example is what a user runs and what the bench runs), and
    docs/self_hosted.md shows the same."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Hands anywhere", 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert len(block.splitlines()) == 5, block
    assert block in EXAMPLE.read_text(), "README.md must show examples/self_hosted_worker.py's lines as they are"
    assert block in (ROOT / "docs" / "self_hosted.md").read_text(), "docs/self_hosted.md must show them too"


async def test_the_example_worker_serves_a_session_from_its_directory(stack: Stack, tmp_path: Path) -> None:
    """examples/self_hosted_worker.py, run as the README says: the environment's id as its argument, the key and the
    gateway's URL from the environment, its tools in the directory it runs in."""
    async with self_hosted(stack, tmp_path) as hosted:
        workdir = tmp_path / "desk"
        workdir.mkdir()
        # ANTHROPIC_LOG=debug: the SDK logs each request and its answer, so a worker that does not end says where
        env = {
            **os.environ,
            KEY_VARIABLE: hosted.key,
            "ANTHROPIC_BASE_URL": hosted.gateway.url,
            "ANTHROPIC_LOG": "debug",
        }
        env.pop("ANTHROPIC_API_KEY", None)
        log = tmp_path / "example.log"
        with log.open("wb") as out:
            example = subprocess.Popen([sys.executable, str(EXAMPLE), hosted.environment_id], cwd=workdir, env=env,
                                       stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            session_id, _ = await hosted.session([
                {"tool_uses": [{"name": "bash", "input": {"command": "uname > from_the_example.txt"}}]},
                {"text": "done"},
            ])  # fmt: skip
            events = await done(hosted.client, session_id)
        finally:
            example.send_signal(signal.SIGINT)  # Ctrl-C, as the docstring says; it stops its item first
            try:
                await until(lambda: example.poll() is not None, "the example worker ending on Ctrl-C")
            except AssertionError as exc:
                tail = "\n".join(log.read_text(errors="replace").splitlines()[-40:])
                raise AssertionError(f"{exc}; the last lines of its log:\n{tail}") from None
            finally:
                example.kill()
                example.wait()
        assert (workdir / "from_the_example.txt").read_text().strip() == os.uname().sysname
        [use] = tool_uses(events)
        assert [e.type for e in answers(events, use.id)] == ["user.tool_result"]
        assert CLAIMED in log.read_text() and f"tool_use_id={use.id}" in log.read_text(), "its log says what it did"
        [item] = await hosted.items()
        assert (item.state, item.end_reason) == ("stopped", "stopped"), "Ctrl-C stopped its item on its way out"
