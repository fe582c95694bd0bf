"""Workflows: the harness. Only `SessionWorkflow` for now."""

from corral.workflows.session import SessionWorkflow

__all__ = ["SessionWorkflow"]
