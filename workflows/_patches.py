"""The patches of the session loop (`workflow.patched` markers) and the results they brought: each names where a
change of behaviour begins, so that histories recorded before it replay as they ran."""

CONFIRMATIONS_PATCH = "tool-confirmations"
"""From here a session evaluates each call's permission policy, and waits for confirmation where it asks."""
MESSAGE_IDS_PATCH = "message-ids-from-request"
"""From here a response's `agent.message` and `agent.thinking` take ids made from their request's span id
(`message_id_of`), the ids their live previews carry, instead of new ones."""

REFUSAL_PATCH = "refusal-stop-reason"
"""From here a response the model refused ends the turn with stop reason `refusal` and the response's details."""
REFUSED_RESULT = "Not run: the model's response was refused."

IDLE_HAND_OVER_PATCH = "idle-hand-over"
"""From here an idle session also wakes to continue as new when updates and signals (renames, dropped messages)
have grown its run's history enough: before, only a turn's end handed over, so an idle session could grow without
bound."""

BUDGET_PATCH = "session-budget"
"""From here a session with a budget stops taking model turns once they have cost it (only sessions with a budget
ask for this patch, and none was recorded before it)."""
BUDGET_SPENT_RESULT = "Not run: the session's budget is spent."
