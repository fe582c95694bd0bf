"""Pure functions of the knowledge stores' session side: mount paths, store slugs, the system prompt's part, a
dream's transcript and its reading of the dreamed store."""

from __future__ import annotations

from typing import Any

import pytest

from corral.contract.events import AgentMessage, AgentToolResult, AgentToolUse, SessionStatusIdle, UserMessage
from corral.contract.knowledge import (
    MemoryStoreMount,
    SessionKnowledge,
    SkillPin,
    knowledge_prompt,
    memory_slug,
    mount_path_problem,
    with_knowledge_prompt,
)
from corral.dreaming import MAX_TRANSCRIPT_BLOCK_CHARS, dreamed_contents, transcript


@pytest.mark.parametrize(
    ("path", "problem"),
    [
        ("/mnt/session/uploads/file_1", None),
        ("/mnt/data/q3.csv", None),
        ("/workspace/x", "under /mnt/"),
        ("/etc/passwd", "under /mnt/"),
        ("mnt/x", "under /mnt/"),
        ("/mnt/a/../etc", "no empty, '.' or '..'"),
        ("/mnt/a//b", "no empty"),
        ("/mnt/x;rm -rf /", "letters, digits"),
        ("/mnt/$(id)", "letters, digits"),
        ("/mnt/session/outputs/x", "corral manages"),
        ("/mnt/memory/notes", "corral manages"),
        ("/mnt/skills", "corral manages"),
    ],
)
def test_a_file_mount_path_is_under_mnt_in_safe_segments_and_off_corrals_own_places(
    path: str, problem: str | None
) -> None:
    found = mount_path_problem(path)
    assert (found is None) if problem is None else (found is not None and problem in found)


@pytest.mark.parametrize(
    ("name", "slug"),
    [("Notes", "notes"), ("My Team's Notes!! v2", "my-team-s-notes-v2"), ("---", "memory"), ("Ünïcode 7", "n-code-7")],
)
def test_a_store_is_mounted_under_its_name_lowercased_with_other_characters_runs_made_dashes(
    name: str, slug: str
) -> None:
    assert memory_slug(name) == slug


def test_the_system_prompt_names_each_skill_and_store_and_leaves_an_agent_without_them_alone() -> None:
    knowledge = SessionKnowledge(
        workspace="w",
        skills=[SkillPin(skill_id="skill_1", version="v1", name="pdf", description="Read PDFs.", blob_key="k")],
        memory_stores=[
            MemoryStoreMount(
                memory_store_id="memstore_1",
                name="Team",
                description="What the team knows",
                instructions="Write decisions here.",
                mount_path="/mnt/memory/team",
            ),
            MemoryStoreMount(
                memory_store_id="memstore_2", access="read_only", name="Facts", mount_path="/mnt/memory/facts"
            ),
        ],
    )
    prompt = knowledge_prompt(knowledge)
    assert "- pdf (/mnt/skills/pdf/SKILL.md): Read PDFs." in prompt
    assert "- /mnt/memory/team/ (Team; read and write): What the team knows" in prompt
    assert "Instructions: Write decisions here." in prompt
    assert "- /mnt/memory/facts/ (Facts; read only)" in prompt
    assert with_knowledge_prompt("Be brief.", knowledge) == f"Be brief.\n\n{prompt}"
    assert with_knowledge_prompt("Be brief.", SessionKnowledge(workspace="w")) == "Be brief."
    assert with_knowledge_prompt(None, None) is None


NOW = "2026-12-06T00:00:00Z"


def test_a_transcript_keeps_what_was_said_and_done_and_cuts_long_tool_output() -> None:
    events: list[Any] = [
        UserMessage.model_validate(
            {"id": "sevt_1", "created_at": NOW, "position": 1, "content": [{"type": "text", "text": "Fix the build"}]}
        ),
        AgentToolUse.model_validate(
            {"id": "sevt_2", "created_at": NOW, "position": 2, "name": "bash", "input": {"command": "make"}}
        ),
        AgentToolResult.model_validate(
            {
                "id": "sevt_3",
                "created_at": NOW,
                "position": 3,
                "tool_use_id": "sevt_2",
                "is_error": True,
                "content": [{"type": "text", "text": "x" * (MAX_TRANSCRIPT_BLOCK_CHARS + 10)}],
            }
        ),
        AgentMessage.model_validate(
            {"id": "sevt_4", "created_at": NOW, "position": 4, "content": [{"type": "text", "text": "Done."}]}
        ),
        SessionStatusIdle.model_validate(
            {"id": "sevt_5", "created_at": NOW, "position": 5, "stop_reason": {"type": "end_turn"}}
        ),
    ]
    text = transcript("sesn_1", "build", events)
    assert text.startswith("# Session sesn_1: build\n")
    assert "## User\nFix the build" in text and "## Agent\nDone." in text
    assert '### Tool call `bash`\n```json\n{"command": "make"}' in text
    assert "### Tool result (error)" in text and "[… 10 more characters cut]" in text
    assert "stopped" not in text  # an ordinary end of turn is not news


def test_the_dreamed_store_is_what_was_written_under_memory_and_nothing_else() -> None:
    contents, skipped = dreamed_contents(
        {
            "memory/people/ana.md": b"ana leads\n",
            "memory/prefs.md": "tea \u2615".encode(),
            "notes.txt": b"scratch",
            "memory/blob.bin": b"\xff\xfe",
        }
    )
    assert contents == {"/people/ana.md": "ana leads\n", "/prefs.md": "tea \u2615"}
    assert skipped == ["memory/blob.bin: not UTF-8 text"]
