"""Hands over HTTP: an agent may declare a hand only on a task queue the operator registered for its workspace
(corral.hand_registry), checked when the agent is made or changed, when a session is made from it, and before a
session takes more events. A refusal is a 400 naming the tool's field, and nothing is written or sent.

A hand revoked while a session runs: the session takes no more events except an interrupt, so it starts no turn
that could call the hand. A turn already running when the registration changed ends as it would have (the
harness cannot read the registry: workflow code does no I/O); interrupt the session to stop it sooner.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from corral.hand_registry import hand_refusal
from corral.records import Records
from gateway.errors import ApiError, invalid


async def check_hands(
    records: Records, workspace: str, tools: Any, where: str = "tools", own_queues: Iterable[str] = ()
) -> None:
    """A 400 naming `<where>[i].task_queue` for the first hand that `workspace` may not use; `own_queues` (the
    gateway's harness and model queues, which may be named otherwise than corral's defaults) are never a hand."""
    own = set(own_queues)
    for index, tool in enumerate(tools if isinstance(tools, list) else []):
        if not isinstance(tool, dict) or tool.get("type") != "hand" or not isinstance(tool.get("task_queue"), str):
            continue
        queue = tool["task_queue"]
        if queue in own:
            problem: str | None = f"{queue!r} is a task queue of corral's own workers; a hand serves a queue of its own"
        else:
            problem = await hand_refusal(records, workspace, queue)
        if problem is not None:
            raise invalid(f"{where}[{index}].task_queue: {problem}")


async def check_session_hands(
    records: Records, workspace: str, session_id: str, memo: Mapping[str, Any], events: list[Any],
    own_queues: Iterable[str] = (),
) -> None:  # fmt: skip
    """Before a session takes `events`: a 400 when its agent (the snapshot in its memo, overrides included) has a
    hand its workspace may no longer use. A batch of interrupts only is always taken: it stops work, never starts
    any."""
    if all(isinstance(event, dict) and event.get("type") == "user.interrupt" for event in events):
        return
    agent = memo.get("agent")
    try:
        for where, tools in _session_tools(agent if isinstance(agent, dict) else {}):
            await check_hands(records, workspace, tools, where, own_queues)
    except ApiError as exc:
        raise invalid(
            f"session {session_id!r} takes no more events: {exc.message}. Interrupt it, or start a session from an "
            "agent without that hand"
        ) from exc


def _session_tools(agent: Mapping[str, Any]) -> Iterable[tuple[str, Any]]:
    """The tools of a session's agent snapshot, and of each agent its threads may run (its resolved multiagent
    config's snapshots), with the field that names them."""
    yield "agent.tools", agent.get("tools")
    multiagent = agent.get("multiagent")
    if not isinstance(multiagent, dict):
        return
    lists = {"agents": multiagent.get("agents")}
    for member in ("subagents", "workflows"):
        value = multiagent.get(member)
        lists[f"{member}.predefined_agents"] = value.get("predefined_agents") if isinstance(value, dict) else None
    for name, entries in lists.items():
        for index, entry in enumerate(entries if isinstance(entries, list) else []):
            if isinstance(entry, dict) and entry.get("type") == "agent":
                yield f"agent.multiagent.{name}[{index}].tools", entry.get("tools")
