"""What the Temporal Web UI shows for a session as its current details: a pure function of the session's own
answer to the `session` query, so the two cannot disagree."""

from __future__ import annotations

from corral.contract.session import SessionInfo


def web_ui_details(info: SessionInfo, static: tuple[str, str]) -> str:
    """The status, the run, the model, turns, events, queue, tokens and (with a budget) spending. A run after the
    first has no static summary (continue-as-new sets none), so its details begin with it (`static`)."""
    reason = f" ({info.stop_reason})" if info.stop_reason else ""
    run = f" · run {info.run} (positions {info.archived_through + 1}-)" if info.run > 1 else ""
    summary = "" if info.run == 1 else "{}\n\n{}\n\n".format(*static)
    usage = info.usage
    spent = "" if info.budget is None else f" · spent {info.list_cost} of {info.budget.limit_cents} cents (list price)"
    waiting = f" · waiting for a self-hosted worker ({info.awaiting_worker} call(s))" if info.awaiting_worker else ""
    return (
        f"{summary}**{info.status}**{reason}{waiting}{run} · model `{info.model}` · "
        f"{info.turns} model turns · "
        f"{info.last_position} events · {info.queued_user_events} queued · "
        f"{usage.input_tokens} in / {usage.output_tokens} out tokens · cache "
        f"{usage.cache_read_input_tokens} read / {usage.cache_creation_input_tokens} written" + spent
    )
