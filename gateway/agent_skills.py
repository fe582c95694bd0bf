"""The skills an agent lists (`skills: [{type: "custom", skill_id, version?}]` on agent create and update): their
shape, checked where the agent's body is made, and their existence in the workspace, checked before it is saved.

Only custom skills: corral ships no Anthropic skills, so an `anthropic` one is refused rather than silently dropped.
A skill without a version runs at its latest when a session starts (the session pins it: `corral.skills`), and the
agent shows it as `latest`.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from corral.contract.agent import MAX_AGENT_SKILLS, AgentSkillRef
from corral.errors import SkillNotFound
from corral.skills import LATEST, Skills
from gateway.errors import ApiError, invalid
from gateway.owned import id_of


def skills_body(value: Any) -> list[dict[str, Any]]:
    """The stored form of an agent's `skills` (a full replacement; null or [] clears them): 400 naming the entry."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid("skills must be a list of {type: 'custom', skill_id, version?}")
    if len(value) > MAX_AGENT_SKILLS:
        raise invalid(f"skills: an agent lists at most {MAX_AGENT_SKILLS} skills, not {len(value)}")
    stored: list[dict[str, Any]] = []
    for index, entry in enumerate(value):
        where = f"skills[{index}]"
        if isinstance(entry, dict) and entry.get("type") == "anthropic":
            raise invalid(f"{where}: corral has no Anthropic skills; upload the skill's folder (POST /v1/skills) "
                          "and list it as {type: 'custom', skill_id}")  # fmt: skip
        if not isinstance(entry, dict) or entry.get("type") != "custom":
            raise invalid(f"{where} must be {{type: 'custom', skill_id, version?}}")
        id_of(entry.get("skill_id"), f"{where}.skill_id", "skill")
        version = entry.get("version")
        if version is not None and version != LATEST:
            id_of(version, f"{where}.version", "skill version")
        try:
            ref = AgentSkillRef.model_validate({**entry, "version": None if version == LATEST else version})
        except ValidationError as exc:
            raise invalid(f"{where}: {exc.errors()[0]['msg']}") from exc
        stored.append(ref.model_dump(mode="json"))
    ids = [entry["skill_id"] for entry in stored]
    repeated = sorted({skill_id for skill_id in ids if ids.count(skill_id) > 1})
    if repeated:
        raise invalid(f"skills: each skill is listed once; repeated: {', '.join(repeated)}")
    return stored


def skills_view(body: dict[str, Any]) -> list[dict[str, Any]]:
    """An agent's skills as the API shows them: every one with a version (`latest` where none is pinned)."""
    return [{"type": entry.get("type", "custom"), "skill_id": entry["skill_id"],
             "version": entry.get("version") or LATEST} for entry in body.get("skills") or []]  # fmt: skip


def check_skills_exist(skills: Skills, workspace: str, stored: list[dict[str, Any]]) -> None:
    """Each listed skill (and version, when pinned) is one of `workspace`'s: else a 404 naming the entry. Blocking
    (the knowledge database): run it through `KnowledgeDB.run`."""
    for index, entry in enumerate(stored):
        try:
            skills.version(workspace, entry["skill_id"], entry.get("version"))
        except SkillNotFound as exc:
            code = f"{exc.kind.replace(' ', '_')}_not_found"
            raise ApiError(404, f"skills[{index}]: {exc}", error_code=code) from exc
