"""Session administration: what the `update_session` update changes about a session besides its log (a title, a
metadata patch, a new budget, archiving) and what it refuses. Pure functions of the session's state, so the
workflow's handler stays small; the handler itself writes `session.deleted` and the memo, in the same order as
before."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from temporalio.exceptions import ApplicationError

from corral.contract.session import SessionBudget, SessionInput, UpdateSessionInput
from corral.names import (
    ARCHIVED,
    BUDGET_CREATE_ONLY,
    BUDGET_NOT_RAISED,
    BUSY,
    DELETING,
    HANDING_OVER,
    WORKING_STATUSES,
    SessionStatus,
)


def apply_update(
    session: SessionInput, input: UpdateSessionInput, archived_at: datetime | None, now: Callable[[], datetime]
) -> tuple[SessionInput, datetime | None, dict[str, Any]]:
    """The session's input with the new title, metadata and budget, when it was archived, and the memo to write
    (what the session's API view shows)."""
    metadata = dict(session.metadata)
    for key, value in input.metadata.items():
        if value is None:
            metadata.pop(key, None)
        else:
            metadata[key] = value
    title = input.title if input.title_set else session.title
    budget = session.budget
    if input.budget_set:  # a new limit at the price the session was made with
        budget = input.budget and input.budget.model_copy(update={"price": budget and budget.price})
    session = session.model_copy(update={"title": title, "metadata": metadata, "budget": budget})
    if input.archive and archived_at is None:
        archived_at = now()
    memo: dict[str, Any] = {"title": title, "metadata": metadata, "archived_at": archived_at}
    if input.budget_set:
        memo["budget"] = None if budget is None else budget.model_dump(mode="json", exclude={"price"})
    return session, archived_at, memo


def validate_update(
    input: UpdateSessionInput,
    *,
    status: SessionStatus,
    deleting: bool,
    archived: bool,
    handing_over: bool,
    budget: SessionBudget | None,
    list_cost: Callable[[], int | None],
) -> None:
    """Refuse, before anything reaches history, an update the session cannot take in its present state."""
    if handing_over:  # what it changes is carried into the next run: it is sent again there
        raise ApplicationError("the session is continuing as new: send again", type=HANDING_OVER)
    if input.delete and status in WORKING_STATUSES:
        raise ApplicationError(
            f"the session is {status}: interrupt it first (send user.interrupt), then delete it once it is idle",
            type=BUSY,
        )
    if deleting and not input.delete:
        raise ApplicationError("the session is being deleted: it can no longer change", type=DELETING)
    if input.budget_set and budget is None:
        raise ApplicationError(
            "the session has no budget: a budget is set when a session is created, and one removed cannot be set again",
            type=BUDGET_CREATE_ONLY,
        )
    if input.budget is not None:
        spent = list_cost() or 0
        if input.budget.limit_cents <= spent:
            raise ApplicationError(
                f"the session has already spent {spent} cents at list price: a new max_list_cost must be more",
                type=BUDGET_NOT_RAISED,
            )
    if archived and (input.title_set or input.metadata or input.budget_set):
        raise ApplicationError("the session is archived: it can no longer change", type=ARCHIVED)
