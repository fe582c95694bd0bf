"""Workflows: the harness. Only `SessionWorkflow` for now."""

from workflows.session import SessionWorkflow

__all__ = ["SessionWorkflow"]
