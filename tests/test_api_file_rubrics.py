"""A `user.define_outcome` whose rubric is an uploaded file, over the API with the official SDK: the gateway resolves
it to the file's text (gateway/file_rubrics.py), in `events.send` and in a session's `initial_events`, the stored
event shows a text rubric, and the grader judges by it. A file that cannot be a rubric is refused before anything
is written: another workspace's (404), not UTF-8 (400), too large (400)."""

from __future__ import annotations

import uuid

import anthropic
import pytest
from anthropic.types.beta.sessions.beta_managed_agents_user_define_outcome_event_params import (
    BetaManagedAgentsUserDefineOutcomeEventParams as OutcomeParams,
)

from corral.contract.user_events import MAX_RUBRIC_CHARS
from tests.conftest import Stack
from tests.test_api_outcomes import new_session, settled, story, verdict
from tests.test_gateway import Gateway, gateway  # noqa: F401 - the fixture

pytestmark = pytest.mark.timeout(300)


def file_outcome(file_id: str) -> OutcomeParams:
    return {"type": "user.define_outcome", "description": "Write a haiku about rivers.",
            "rubric": {"type": "file", "file_id": file_id}}  # fmt: skip


async def test_a_file_rubric_is_resolved_to_its_text_and_graded(stack: Stack, gateway: Gateway) -> None:  # noqa: F811
    client = await gateway.client("file-rubric")
    rubric = f"Three lines; mentions water. ({uuid.uuid4().hex})"
    uploaded = await client.beta.files.upload(file=("rubric.md", rubric.encode()))
    model = stack.script([{"text": "Water runs / rivers carry it / the sea waits."}, verdict("satisfied", "Fine.")])
    session_id = await new_session(client, model)
    [defined] = (await client.beta.sessions.events.send(session_id, events=[file_outcome(uploaded.id)])).data or []
    assert defined.type == "user.define_outcome"
    assert (defined.rubric.type, getattr(defined.rubric, "content", None)) == ("text", rubric)
    session, events = await settled(client, session_id)
    assert story(events)[-1] == "span.outcome_evaluation_end:satisfied"
    graded = [r for r in stack.requests(model) if r["step"] == 1]
    assert graded and rubric in str(graded[-1]["body"]), "the grader was shown the file's text"

    first = stack.script([{"text": "Rivers."}, verdict("satisfied", "Fine.")])
    started = await new_session(client, first, initial_events=[file_outcome(uploaded.id)])
    session, events = await settled(client, started)
    [listed] = [e for e in events if e.type == "user.define_outcome"]
    assert getattr(listed.rubric, "content", None) == rubric
    assert [e.result for e in session.outcome_evaluations] == ["satisfied"]


async def test_a_file_that_cannot_be_a_rubric_is_refused_and_nothing_is_written(
    stack: Stack,
    gateway: Gateway,  # noqa: F811
) -> None:
    client, other = await gateway.client("file-rubric-bad"), await gateway.client("file-rubric-other")
    theirs = await other.beta.files.upload(file=("rubric.md", b"Three lines."))
    binary = await client.beta.files.upload(file=("rubric.bin", b"\xff\xfe\x00rubric"))
    huge = await client.beta.files.upload(file=("rubric.txt", b"x" * (MAX_RUBRIC_CHARS + 1)))
    blank = await client.beta.files.upload(file=("blank.txt", b"  \n"))
    session_id = await new_session(client, stack.script([{"text": "ok"}]))
    refusals: list[tuple[str, type[anthropic.APIStatusError], str]] = [
        (theirs.id, anthropic.NotFoundError, "was not found"),
        ("file_nosuchfile", anthropic.NotFoundError, "was not found"),
        (binary.id, anthropic.BadRequestError, r"events\[0\]\.rubric\.file_id: .* is not UTF-8 text"),
        (huge.id, anthropic.BadRequestError, rf"events\[0\]\.rubric\.file_id: .* at most {MAX_RUBRIC_CHARS} bytes"),
        (blank.id, anthropic.BadRequestError, "is empty"),
        (session_id, anthropic.BadRequestError, r"rubric\.file_id: .* is a session id, not a file id"),
    ]
    for file_id, error, why in refusals:
        with pytest.raises(error, match=why):
            await client.beta.sessions.events.send(session_id, events=[file_outcome(file_id)])
        with pytest.raises(error, match=why.replace("events", "initial_events", 1)):
            await new_session(client, stack.script([{"text": "ok"}]), initial_events=[file_outcome(file_id)])
    assert [e async for e in client.beta.sessions.events.list(session_id)] == [], "nothing was written"
    assert [s.id async for s in client.beta.sessions.list()] == [session_id], "no refused session was made"
