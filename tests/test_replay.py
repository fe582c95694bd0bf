"""Recorded histories replay with today's workflow code, with no nondeterminism (DESIGN.md, invariant 7)."""

from __future__ import annotations

from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.worker import Replayer

from corral.temporal import data_converter
from workflows import SessionWorkflow

HISTORIES = sorted((Path(__file__).parent / "histories").glob("*.json"))


def test_histories_are_recorded() -> None:
    assert len(HISTORIES) >= 3, "tests/histories/ is missing its recorded histories"
    # Sessions that waited for a `user.tool_confirmation` (workflow.patched("tool-confirmations")).
    assert "tool_confirmation" in {path.stem for path in HISTORIES}


@pytest.mark.parametrize("path", HISTORIES, ids=[path.stem for path in HISTORIES])
async def test_recorded_history_replays(path: Path) -> None:
    history = WorkflowHistory.from_json(path.stem, path.read_text())
    replayer = Replayer(workflows=[SessionWorkflow], data_converter=data_converter())
    result = await replayer.replay_workflow(history, raise_on_replay_failure=True)
    assert result.replay_failure is None
