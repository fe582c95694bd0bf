"""The model's view of the log, kept within the agent's budget: elide old tool results, then summarise older turns.

The rules are pure (corral.contract.context); this module holds the session's state of them (the elision watermark)
and runs the one step that needs the model: a summary, asked through the model-turn activity and recorded as an
`agent.thread_context_compacted` event in the conversation. Deterministic: no I/O but that activity.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from temporalio import workflow
from temporalio.exceptions import ActivityError

with workflow.unsafe.imports_passed_through():
    from corral.contract.activities import ModelTextOutput, ModelTurnInput, ModelTurnResult
    from corral.contract.context import ContextView, compaction_end, default_budget, describe_view, max_block_chars
    from corral.contract.events import AgentThreadContextCompacted
    from corral.contract.session import AgentConfig
    from workflows._log import SessionLog

CallModel = Callable[[ModelTurnInput, str], Awaitable[ModelTurnResult]]
"""(turn input, activity summary) -> the model-turn activity's result; raises ActivityError."""
Report = Callable[[str], None]
"""A message for a `session.error` (retrying) that the session goes on after."""


class SessionContext:
    """The elision watermark and the budget of one session; summaries live in the log itself."""

    def __init__(self, log: SessionLog, agent: AgentConfig) -> None:
        self._log = log
        self.watermark = 0
        """Large tool results before this log position are elided."""
        self.budget = agent.context_budget_tokens or default_budget(agent.model, agent.max_tokens)
        self.max_block_chars = log.max_block_chars = max_block_chars(self.budget)
        self._fixed_chars = len(agent.model_dump_json())
        self.carried_unseen: int | None = None
        """From a hand-over, until the new run's first model turn: what the model had not seen then."""

    def unseen(self, delta_start: int) -> int:
        """The first log position the model has not seen yet (never elided or summarised away)."""
        entries = self._log.conversation_entries(delta_start, len(self._log.conversation))
        first = entries[0].position if entries else self._log.last_position + 1
        return first if self.carried_unseen is None else min(first, self.carried_unseen)

    def over_budget(self) -> bool:
        return self._log.estimate(self.watermark, self._fixed_chars) > self.budget

    async def fit(self, turn: ModelTurnInput, call_model: CallModel, report: Report) -> ModelTurnResult | None:
        """Before a turn: elide what the budget needs, and summarise when eliding is not enough. The summary's
        result (for its usage), if one was made."""
        keep_after = self.unseen(turn.delta_start)
        self.watermark = self._log.fit_view(self.watermark, self.budget, self._fixed_chars, keep_after)
        if not self.over_budget():
            return None
        return await self._summarise(turn, call_model, report)

    async def shrink(
        self, turn: ModelTurnInput, call_model: CallModel, report: Report
    ) -> tuple[bool, ModelTurnResult | None]:
        """After the model said the prompt is too long: elide everything that may be, else summarise. Whether the
        next request is smaller, and the summary's result if one was made."""
        elided = self._log.elide_all(self.watermark, self.unseen(turn.delta_start))
        if elided > self.watermark:
            self.watermark = elided
            return True, None
        result = await self._summarise(turn, call_model, report)
        return result is not None, result

    async def _summarise(self, turn: ModelTurnInput, call_model: CallModel, report: Report) -> ModelTurnResult | None:
        entries = self._log.conversation_entries(0, len(self._log.conversation))
        end = compaction_end(entries)
        if end is None:
            return None
        ask = turn.model_copy(update={"summarize_through": end, "elide_before": self.watermark, "stream_id": None})
        try:
            result = await call_model(ask, f"compact the context (summarise positions 1-{end})")
        except ActivityError as err:
            report(f"the context could not be summarised: {err.cause or err}")
            return None
        summary = "".join(block.text for block in result.content if isinstance(block, ModelTextOutput)).strip()
        if not summary:
            report("the context could not be summarised: the model wrote an empty summary")
            return None
        compacted = self._log.append(AgentThreadContextCompacted, summary=summary, start_position=1, end_position=end)
        self._log.add_to_conversation(compacted)
        return result

    def describe(self) -> ContextView:
        entries = self._log.conversation_entries(0, len(self._log.conversation))
        return describe_view(entries, self.watermark, self.budget, self._fixed_chars, self._log.size)
