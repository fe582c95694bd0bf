"""Files, skills and memory stores in sessions, and dreams, end to end: the official `anthropic` SDK against a real
gateway process, the real Temporal dev server, real sandboxes on the real engine, and the offline model server
playing scripts (its requests read back to see the system prompt the agent got).

- A file uploaded and mounted is read through `bash`; one added later is there at the next call; what the agent
  writes under `/mnt/session/outputs/` is a file of the session's scope, downloadable.
- A skill uploaded with `files_from_dir` is named in the system prompt and read from `/mnt/skills/<name>/`.
- A memory store attached is read, and what the agent writes there is a new version by the session.
- A dream over two sessions writes the store it dreamed; a cancelled one writes nothing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anthropic
import pytest
from anthropic.lib import files_from_dir

from tests.conftest import Stack
from tests.test_gateway import Gateway, gateway  # noqa: F401 - the fixture
from tests.waits import until

pytestmark = pytest.mark.timeout(300)

Client = anthropic.AsyncAnthropic
TOOLSET: list[Any] = [{"type": "agent_toolset_20260401"}]


def bash(command: str) -> dict[str, Any]:
    """A script step: the agent runs `command` with the built-in bash tool."""
    return {"tool_uses": [{"name": "bash", "input": {"command": command}}]}


class Sessions:
    """The sessions a test made through the API, handed to `sandbox_stack`, which terminates them and removes their
    sandboxes once its sandbox workers have stopped (so no activity still in flight makes a container again)."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.ids: list[str] = []

    def add(self, session_id: str) -> None:
        if session_id not in self.ids:
            self.ids.append(session_id)
            self.stack.started.append(self.stack.client.get_workflow_handle(session_id))


@pytest.fixture
def made(sandbox_stack: Stack) -> Sessions:
    return Sessions(sandbox_stack)


async def start(client: Client, made: Sessions, model: str, message: str, **create: Any) -> str:
    agent_fields = create.pop("agent_fields", {})
    agent = await client.beta.agents.create(name="worker", model=model, tools=TOOLSET, **agent_fields)
    environment = await client.beta.environments.create(name="box")
    session = await client.beta.sessions.create(agent=agent.id, environment_id=environment.id, **create)
    made.add(session.id)
    await say(client, session.id, message)
    return session.id


async def say(client: Client, session_id: str, text: str) -> None:
    await client.beta.sessions.events.send(
        session_id, events=[{"type": "user.message", "content": [{"type": "text", "text": text}]}]
    )


async def turns_ended(client: Client, session_id: str, count: int) -> list[Any]:
    """The session's log once it has gone idle `count` times (each turn's end)."""
    seen: list[Any] = []

    async def ended() -> bool:
        seen[:] = [event async for event in client.beta.sessions.events.list(session_id, limit=500)]
        return sum(event.type == "session.status_idle" for event in seen) >= count

    await until(ended, f"{count} turn(s) of {session_id} ended", within=180)
    return seen


def results(events: list[Any]) -> list[str]:
    """The text of each built-in tool result, in order."""
    return [
        "".join(block.text for block in event.content or []) for event in events if event.type == "agent.tool_result"
    ]


async def test_a_file_is_mounted_one_added_later_is_there_and_an_output_is_a_file_of_the_session(
    sandbox_stack: Stack,
    gateway: Gateway,  # noqa: F811
    made: Sessions,
) -> None:
    client = await gateway.client("knowledge-files")
    first = await client.beta.files.upload(file=("brief.txt", b"the launch is on friday\n", "text/plain"))
    second = await client.beta.files.upload(file=("later.txt", b"and the party on saturday\n", "text/plain"))
    model = sandbox_stack.script(
        [
            bash(f"cat /mnt/session/uploads/{first.id}"),
            bash("mkdir -p /mnt/session/outputs/notes && printf 'friday\\n' > /mnt/session/outputs/notes/day.txt"),
            {"text": "The launch is on friday."},
            bash("cat /mnt/data/later.txt"),
            {"text": "And the party on saturday."},
        ]
    )
    session_id = await start(
        client, made, model, "When is the launch?", resources=[{"type": "file", "file_id": first.id}]
    )

    events = await turns_ended(client, session_id, 1)
    assert results(events)[0] == "the launch is on friday"
    [output] = [file async for file in client.beta.files.list(scope_id=session_id)]
    assert (output.filename, output.scope and output.scope.id) == ("day.txt", session_id)
    assert await (await client.beta.files.download(output.id)).read() == b"friday\n"

    added = await client.beta.sessions.resources.add(
        session_id, type="file", file_id=second.id, mount_path="/mnt/data/later.txt"
    )
    listed = [resource async for resource in client.beta.sessions.resources.list(session_id)]
    assert [(r.type, getattr(r, "file_id", None), r.mount_path) for r in listed] == [
        ("file", first.id, f"/mnt/session/uploads/{first.id}"),
        ("file", second.id, "/mnt/data/later.txt"),
    ]
    await say(client, session_id, "And the party?")
    events = await turns_ended(client, session_id, 2)
    assert results(events)[-1] == "and the party on saturday"
    # The agent could read the file and not change it.
    assert added.id.startswith("sres_")
    deleted = await client.beta.sessions.resources.delete(added.id, session_id=session_id)
    assert deleted.id == added.id
    assert [getattr(r, "file_id", None) async for r in client.beta.sessions.resources.list(session_id)] == [first.id]


async def test_a_skill_is_named_in_the_prompt_and_read_and_a_memory_written_is_a_version_by_the_session(
    sandbox_stack: Stack,
    gateway: Gateway,  # noqa: F811
    made: Sessions,
    tmp_path: Path,
) -> None:
    client = await gateway.client("knowledge-skills")
    folder = tmp_path / "haiku"
    (folder / "examples").mkdir(parents=True)
    (folder / "SKILL.md").write_text(
        "---\nname: haiku-writer\ndescription: Writes haiku about anything.\n---\nCount five, seven, five syllables.\n"
    )
    (folder / "examples" / "river.md").write_text("water runs away\n")
    skill = await client.beta.skills.create(files=files_from_dir(folder))
    store = await client.beta.memory_stores.create(name="Team Notes", description="What the team prefers")
    await client.beta.memory_stores.memories.create(store.id, path="/prefs.md", content="likes tea\n")
    model = sandbox_stack.script(
        [
            bash("cat /mnt/skills/haiku-writer/SKILL.md /mnt/memory/team-notes/prefs.md"),
            bash("printf 'ships on friday\\n' > /mnt/memory/team-notes/launch.md"),
            {"text": "Noted."},
        ]
    )
    session_id = await start(
        client,
        made,
        model,
        "Remember the launch.",
        agent_fields={"skills": [{"type": "custom", "skill_id": skill.id}]},
        resources=[{"type": "memory_store", "memory_store_id": store.id, "instructions": "Keep decisions here."}],
    )

    events = await turns_ended(client, session_id, 1)
    system = sandbox_stack.requests(model)[0]["body"].get("system")
    text = system if isinstance(system, str) else "".join(block["text"] for block in system or [])
    assert "haiku-writer (/mnt/skills/haiku-writer/SKILL.md): Writes haiku about anything." in text
    assert "/mnt/memory/team-notes/ (Team Notes; read and write): What the team prefers" in text
    assert "Keep decisions here." in text
    assert "Count five, seven, five syllables." not in text  # the body is read when needed, not given
    assert results(events)[0].endswith("Count five, seven, five syllables.\nlikes tea")

    memories = [m async for m in client.beta.memory_stores.memories.list(store.id, view="full")]
    assert {(m.path, m.content) for m in memories if m.type == "memory"} == {
        ("/prefs.md", "likes tea\n"),
        ("/launch.md", "ships on friday\n"),
    }
    [version] = [v async for v in client.beta.memory_stores.memory_versions.list(store.id, session_id=session_id)]
    assert (version.operation, version.path) == ("created", "/launch.md")
    assert version.created_by is not None and version.created_by.type == "session_actor"
    assert getattr(version.created_by, "session_id", None) == session_id
    session = await client.beta.sessions.retrieve(session_id)
    assert [(s.skill_id, s.version) for s in session.agent.skills] == [(skill.id, skill.latest_version_id)]

    async def listed_by_store() -> bool:  # sessions.list(memory_store_id=...): the sessions it is attached to
        return [s.id async for s in client.beta.sessions.list(memory_store_id=store.id)] == [session_id]

    await until(listed_by_store, "the session listed by its memory store")
    with pytest.raises(anthropic.BadRequestError, match=r"memory_store_id: .* is a skill id, not a memory store id"):
        await client.beta.sessions.list(memory_store_id=skill.id)


async def memories_of(client: Client, store_id: str) -> dict[str, str | None]:
    found = [m async for m in client.beta.memory_stores.memories.list(store_id, view="full")]
    return {m.path: m.content for m in found if m.type == "memory"}


async def test_a_dream_over_two_sessions_writes_a_new_store_and_a_cancelled_one_writes_nothing(
    sandbox_stack: Stack,
    gateway: Gateway,  # noqa: F811
    made: Sessions,
) -> None:
    client = await gateway.client("knowledge-dreams")
    store = await client.beta.memory_stores.create(name="People")
    await client.beta.memory_stores.memories.create(store.id, path="/people/ana.md", content="ana: engineer\n")
    await client.beta.memory_stores.memories.create(store.id, path="/people/old.md", content="left in 2020\n")
    told = []
    for fact in ("Ana leads the launch now.", "Bo joined as designer."):
        model = sandbox_stack.script([{"text": f"Noted: {fact}"}])
        session_id = await start(client, made, model, fact)
        await turns_ended(client, session_id, 1)
        told.append(session_id)
    dreamer = sandbox_stack.script(
        [
            bash("ls /mnt/session/uploads && cat /mnt/session/uploads/*.md | grep -c 'Noted:'"),
            bash(
                "mkdir -p /mnt/session/outputs/memory/people && cd /mnt/session/outputs/memory/people && "
                "printf 'ana: leads the launch\\n' > ana.md && printf 'bo: designer\\n' > bo.md"
            ),
            {"text": "The store is reorganised."},
        ]
    )

    dream = await client.beta.dreams.create(
        inputs=[{"type": "memory_store", "memory_store_id": store.id}, {"type": "sessions", "session_ids": told}],
        model=dreamer,
        instructions="One file per person.",
    )
    assert dream.status == "pending" and dream.id.startswith("drm_")

    async def ended() -> bool:
        nonlocal dream
        dream = await client.beta.dreams.retrieve(dream.id)
        if dream.session_id:
            made.add(dream.session_id)
        return dream.status in ("completed", "failed", "canceled")

    await until(ended, "the dream ended", within=180)
    assert dream.status == "completed", dream.error
    [output] = dream.outputs
    assert output.memory_store_id != store.id
    assert await memories_of(client, output.memory_store_id) == {
        "/people/ana.md": "ana: leads the launch\n",
        "/people/bo.md": "bo: designer\n",
    }
    assert await memories_of(client, store.id) == {
        "/people/ana.md": "ana: engineer\n",
        "/people/old.md": "left in 2020\n",
    }
    assert dream.session_id is not None
    log = [event async for event in client.beta.sessions.events.list(dream.session_id, limit=500)]
    *listing, counted = results(log)[0].split("\n")  # the transcripts, then how many said "Noted:"
    assert sorted(listing) == sorted(f"{session_id}.md" for session_id in told) and counted == "2"
    assert dream.usage.output_tokens > 0

    slow = sandbox_stack.script([bash("sleep 120"), {"text": "never"}])
    cancelled = await client.beta.dreams.create(
        inputs=[{"type": "memory_store", "memory_store_id": store.id}, {"type": "sessions", "session_ids": told}],
        model=slow,
        output_behavior={"type": "update_existing", "memory_store_id": store.id},
    )

    async def working() -> bool:
        seen = await client.beta.dreams.retrieve(cancelled.id)
        if not seen.session_id:
            return False
        made.add(seen.session_id)
        try:
            return "agent.tool_use" in [e.type async for e in client.beta.sessions.events.list(seen.session_id)]
        except anthropic.NotFoundError:  # the dream has named its session, and is starting it
            return False

    await until(working, "the dream's session at work", within=120)
    assert (await client.beta.dreams.cancel(cancelled.id)).status in ("running", "canceled")
    await until(lambda: _status(client, cancelled.id, "canceled"), "the dream canceled", within=60)
    assert await memories_of(client, store.id) == {
        "/people/ana.md": "ana: engineer\n",
        "/people/old.md": "left in 2020\n",
    }
    with pytest.raises(anthropic.BadRequestError, match="cannot be canceled"):
        await client.beta.dreams.cancel(dream.id)
    archived = await client.beta.dreams.archive(dream.id)
    assert archived.archived_at is not None
    listed = [d.id async for d in client.beta.dreams.list()]
    assert cancelled.id in listed and dream.id not in listed
    assert dream.id in [d.id async for d in client.beta.dreams.list(include_archived=True)]


async def _status(client: Client, dream_id: str, status: str) -> bool:
    return (await client.beta.dreams.retrieve(dream_id)).status == status


async def test_a_dream_refuses_bad_input_and_another_workspaces_ids(stack: Stack, gateway: Gateway) -> None:  # noqa: F811
    mine, theirs = await gateway.client("dream-mine"), await gateway.client("dream-theirs")
    store = await mine.beta.memory_stores.create(name="Mine")
    model = stack.script([{"text": "ok"}])
    agent = await mine.beta.agents.create(name="a", model=model)
    environment = await mine.beta.environments.create(name="e")
    session = await mine.beta.sessions.create(agent=agent.id, environment_id=environment.id)
    their_store = await theirs.beta.memory_stores.create(name="Theirs")

    def inputs(store_id: str, *session_ids: str) -> list[Any]:
        return [
            {"type": "memory_store", "memory_store_id": store_id},
            {"type": "sessions", "session_ids": list(session_ids)},
        ]

    refused: list[tuple[list[Any], dict[str, Any], str]] = [
        (inputs(store.id), {}, "1 to 100 sessions"),
        (inputs(store.id, session.id, session.id), {}, "twice"),
        ([inputs(store.id, session.id)[0]], {}, "exactly one"),
        (inputs(session.id, session.id), {}, "memory store id"),
        (inputs(store.id, session.id), {"instructions": ""}, "instructions must be 1 to 4096"),
        (
            inputs(store.id, session.id),
            {"output_behavior": {"type": "update_existing", "memory_store_id": their_store.id}},
            "must be the input memory store",
        ),
    ]
    for given, extra, message in refused:
        with pytest.raises(anthropic.BadRequestError, match=message):
            await mine.beta.dreams.create(inputs=given, model=model, **extra)
    for given in (inputs(their_store.id, session.id),):
        with pytest.raises(anthropic.NotFoundError):
            await mine.beta.dreams.create(inputs=given, model=model)
    with pytest.raises(anthropic.NotFoundError):  # my session, their store; their session, their store
        await theirs.beta.dreams.create(inputs=inputs(their_store.id, session.id), model=model)
    dream = await mine.beta.dreams.create(inputs=inputs(store.id, session.id), model=model)
    for call in (theirs.beta.dreams.retrieve, theirs.beta.dreams.cancel, theirs.beta.dreams.archive):
        with pytest.raises(anthropic.NotFoundError):
            await call(dream.id)
    with pytest.raises(anthropic.BadRequestError, match="is a memory store id, not a dream id"):
        await mine.beta.dreams.retrieve(store.id)
    assert dream.id not in [d.id async for d in theirs.beta.dreams.list(include_archived=True)]
    assert dream.id in [d.id async for d in mine.beta.dreams.list()]
    with pytest.raises(anthropic.BadRequestError, match="only an ended dream can be archived"):
        await mine.beta.dreams.archive(dream.id)
    await mine.beta.dreams.cancel(dream.id)
