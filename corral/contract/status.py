"""A session's status: the one spelling of the vocabulary that the workflow sets, the search attribute
`CorralStatus` holds, the API shows and the CLI filters by.

Its own module, below `session.py` and `carry.py`, so that both (and every reader) import it from one place.
"""

from __future__ import annotations

from typing import Final, Literal, get_args

SessionStatus = Literal["idle", "running", "rescheduling", "terminated"]
SESSION_STATUSES: Final = frozenset(get_args(SessionStatus))
"""Every status, derived from the `Literal` so the values are written once."""
WORKING_STATUSES: Final[frozenset[SessionStatus]] = frozenset({"running", "rescheduling"})
"""The statuses of a session at work (a turn in progress, or waiting to retry one): it is not deleted then."""
