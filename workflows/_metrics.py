"""The session's own metrics, counted through the workflow's meter."""

from __future__ import annotations

from temporalio import workflow


def count(name: str, description: str, **attributes: str) -> None:
    """One more of a corral metric, through the workflow's meter: no command, no I/O, and nothing while a task is
    replayed, so replays and determinism are untouched (a no-op unless the worker's runtime exports metrics)."""
    workflow.metric_meter().create_counter(name, description).add(1, attributes)
