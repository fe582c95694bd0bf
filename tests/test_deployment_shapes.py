"""A deployment's cron expression and time zone, checked at the edge (gateway/deployment_shapes.py), and the day of
week handed to Temporal's schedule spec (0-6, where the API takes 0-7), and a scheduled fire's ids."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from corral.contract.deployments import run_session_id, scheduled_run_id
from corral.record_ids import is_record_id, record_id_millis
from gateway.deployment_shapes import check_schedule, cron_problem, temporal_cron
from gateway.errors import ApiError


@pytest.mark.parametrize(
    "expression",
    ["* * * * *", "0 3 * * *", "*/15 9-17 * * 1-5", "0 0 1,15 * 0", "5 4 * * 7", "0 0 1-31/2 */3 0-7"],
)
def test_posix_expressions_are_taken(expression: str) -> None:
    assert cron_problem(expression) is None


@pytest.mark.parametrize(
    ("expression", "problem"),
    [
        ("* * * *", "must have 5 fields"),
        ("0 * * * * *", "must have 5 fields"),
        ("@daily", "shortcuts"),
        ("0 0 L * *", "L, W, #, ? and names"),
        ("0 0 * * 1#2", "L, W, #, ? and names"),
        ("0 0 ? * *", "L, W, #, ? and names"),
        ("0 0 * * MON", "L, W, #, ? and names"),
        ("60 * * * *", "minute field '60' is outside 0-59"),
        ("0 24 * * *", "hour field '24' is outside 0-23"),
        ("0 0 0 * *", "day of month field '0' is outside 1-31"),
        ("0 0 * 13 *", "month field '13' is outside 1-12"),
        ("0 0 * * 8", "day of week field '8' is outside 0-7"),
        ("0 0 * * 5-1", "runs backwards"),
        ("*/0 * * * *", "step of 0"),
        ("", "5-field cron expression"),
    ],
)
def test_other_expressions_are_refused_naming_the_problem(expression: str, problem: str) -> None:
    found = cron_problem(expression)
    assert found is not None and problem in found, found


@pytest.mark.parametrize(
    ("expression", "spec"),
    [
        ("0 9 * * *", "0 9 * * *"),
        ("0 9 * * 7", "0 9 * * 0"),
        ("0 9 * * 5-7", "0 9 * * 0,5,6"),
        ("0 9 * * 0-7", "0 9 * * 0,1,2,3,4,5,6"),
        ("0 9 * * */2", "0 9 * * 0,2,4,6"),
        ("0 9 * * 1,3", "0 9 * * 1,3"),
    ],
)
def test_the_day_of_week_reaches_temporal_as_0_to_6(expression: str, spec: str) -> None:
    assert temporal_cron(expression) == spec


def test_the_time_zone_is_an_iana_name() -> None:
    assert check_schedule({"type": "cron", "expression": "0  3 * * *", "timezone": "Europe/Berlin"}) == {
        "type": "cron", "expression": "0 3 * * *", "timezone": "Europe/Berlin"}  # fmt: skip
    for zone in ("Mars/Olympus", "../../etc/passwd", ""):
        with pytest.raises(ApiError, match="timezone"):
            check_schedule({"type": "cron", "expression": "0 3 * * *", "timezone": zone})


def test_a_scheduled_fire_names_one_run_and_one_session() -> None:
    at = datetime(2026, 12, 7, 3, 0, tzinfo=UTC)
    run_id = scheduled_run_id("depl_a", at)
    assert is_record_id(run_id, "drun") and record_id_millis(run_id) == int(at.timestamp() * 1000)
    assert scheduled_run_id("depl_a", at) == run_id  # a retried fire finds the same run
    assert scheduled_run_id("depl_b", at) != run_id and scheduled_run_id("depl_a", at.replace(hour=4)) != run_id
    assert run_session_id(run_id) == run_session_id(run_id) and run_session_id(run_id).startswith("sesn_")
