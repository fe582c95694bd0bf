"""Worker processes, one per role (harness, model, hands), plus an all-in-one for local use."""

from workers._reaper import closed_sessions, reaping

__all__ = ["closed_sessions", "reaping"]
