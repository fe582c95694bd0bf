"""Agents (`/v1/agents`): versioned records; an update may name the version it changes, and an agent is archived,
never deleted (as upstream). An agent's hands must be registered for its workspace (`gateway/hands.py`), and the
skills it lists must be its workspace's (`gateway/agent_skills.py`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from starlette.routing import Route

from corral.records import RecordView
from corral.skills import Skills
from gateway.agent_skills import check_skills_exist
from gateway.hands import check_hands
from gateway.http import Authed
from gateway.multiagent import pin_multiagent
from gateway.records import RecordResource
from gateway.shapes import agent_body, agent_view

if TYPE_CHECKING:
    from gateway.app import Gateway


class Agents(RecordResource):
    kind = "agent"
    webhook_kind = "agent"
    plural = "agents"
    versioned = True
    created_at_bounds = ("created_at[gte]", "created_at[lte]")
    """As the SDK sends them (`agents.list(created_at_gte=...)`)."""

    def make_body(self, request: dict[str, Any], current: dict[str, Any] | None = None) -> dict[str, Any]:
        return agent_body(request, current)

    def show(self, record: RecordView) -> dict[str, Any]:
        return agent_view(record.id, record.version, record.body, record.created_at, record.updated_at,
                          record.archived_at)  # fmt: skip

    async def settle(self, workspace: str, made: dict[str, Any], current: RecordView | None) -> dict[str, Any]:
        """The agents a changed `multiagent` names, checked and pinned (an unchanged one was when it was saved)."""
        stored = current.body.get("multiagent") if current is not None else None
        if made.get("multiagent") == stored:
            return made
        own_id = current.id if current is not None else None
        return {**made, "multiagent": await pin_multiagent(self.gateway.records, workspace, made["multiagent"], own_id)}

    async def check(self, workspace: str, made: dict[str, Any]) -> None:
        await check_hands(self.gateway.records, workspace, made.get("tools"), own_queues=self.gateway.own_queues())
        if made.get("skills"):
            skills = Skills(self.gateway.knowledge, self.gateway.blobs)
            await self.gateway.knowledge.run(check_skills_exist, skills, workspace, made["skills"])


def agent_routes(gateway: Gateway, authed: Authed) -> list[Route]:
    return Agents(gateway).routes(authed)
