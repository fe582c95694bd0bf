"""No workflow lists failure exception types, as workflows/__init__.py explains: a bug in workflow code suspends
the workflow task until a deploy fixes it, and never fails a session.

A static scan of every non-test module, because the setting can be passed to `@workflow.defn`, to `Worker` or to
`Replayer`, and any one of them would quietly change what a bug does to running sessions.
"""

from __future__ import annotations

import ast
from pathlib import Path

import workflows

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("corral", "workflows", "activities", "workers", "proxy", "gateway", "cli", "bench", "examples")
SETTINGS = {"failure_exception_types", "workflow_failure_exception_types"}


def failure_settings(source: str, filename: str) -> list[str]:
    """`file:line` of every call that passes one of the failure-exception settings."""
    return [
        f"{filename}:{node.lineno}: {keyword.arg}" for node in ast.walk(ast.parse(source, filename))
        if isinstance(node, ast.Call) for keyword in node.keywords if keyword.arg in SETTINGS
    ]  # fmt: skip


def test_no_workflow_fails_on_an_exception_type() -> None:
    paths = [path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]
    assert len(paths) > 100, "too few modules: this test would check nothing"
    found = [hit for path in paths for hit in failure_settings(path.read_text(), str(path.relative_to(ROOT)))]
    assert found == [], f"a failure exception type is set (see workflows/__init__.py for why none may be): {found}"


def test_the_scan_finds_the_setting() -> None:
    """The scan can fail: it finds the setting on a workflow and on a worker."""
    source = (
        "@workflow.defn(failure_exception_types=[KeyError])\nclass W: ...\n"
        "Worker(workflow_failure_exception_types=[])\n"
    )
    assert len(failure_settings(source, "sample.py")) == 2


def test_the_reason_is_written_where_the_workflows_are() -> None:
    assert workflows.__doc__ is not None and "workflow_failure_exception_types" in workflows.__doc__
