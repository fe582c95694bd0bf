"""Build the `execute` activity of a hand from a table of tool functions."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from temporalio import activity

from corral.contract.activities import ExecuteInput
from corral.hands.errors import tool_error
from corral.hands.heartbeat import heartbeating
from corral.hands.output import cut_output
from corral.names import ACTIVITY_EXECUTE

ToolFunction = Callable[[dict[str, Any]], str | Awaitable[str]]


def make_execute_activity(tools: Mapping[str, ToolFunction]) -> Callable[[ExecuteInput], Awaitable[str]]:
    """The `execute` activity for these tools: unknown names and tool exceptions become `ToolError`s."""
    table = dict(tools)

    @activity.defn(name=ACTIVITY_EXECUTE)
    async def execute(input: ExecuteInput) -> str:
        function = table.get(input.name)
        if function is None:
            raise tool_error(f"unknown tool {input.name!r}; this hand serves: {', '.join(sorted(table))}")
        async with heartbeating():
            try:
                output = function(input.input)
                if inspect.isawaitable(output):
                    output = await output
            except (ValueError, TypeError, KeyError, ArithmeticError) as exc:
                raise tool_error(f"{input.name}: {exc}") from exc
        return cut_output(str(output))

    return execute
