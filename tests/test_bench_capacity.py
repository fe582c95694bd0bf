"""The capacity benchmark's verdict: an arm's capacity is the first step whose TTFT p50 reaches the threshold times
its own single session's, and the report and summary carry every step. Figures here are made up, not timed: the
benchmark itself runs with `python -m bench.capacity` (bench/README.md)."""

from __future__ import annotations

import argparse
import subprocess
import sys

from bench.capacity import ROOT, Arm, Step, report, summary

ARGS = argparse.Namespace(
    first_token_latency=0.3, tokens_per_second=50.0, step_seconds=8.0, min_turns=2, threshold=2.0, refine=3
)


def step(arm: str, sessions: int, ttfts: list[float | None]) -> Step:
    made = Step(arm, sessions, wall=10.0)
    made.add_turns(ttfts)
    return made


def test_the_capacity_is_the_fewest_sessions_at_twice_the_single_session_p50_narrowed_by_bisection() -> None:
    arm = Arm("corral")
    for sessions, ttft in ((1, 0.3), (8, 0.5), (16, 0.61), (32, 0.9)):
        if arm.capacity is None:
            arm.record(step("corral", sessions, [9.0, ttft, ttft, ttft]), ARGS.threshold)
    assert arm.capacity == 16
    assert [s.sessions for s in arm.steps] == [1, 8, 16]
    assert arm.ratio(arm.steps[2]) == 0.61 / 0.3
    assert arm.probe() == 12
    arm.record(step("corral", 12, [9.0, 0.59]), ARGS.threshold)
    assert arm.probe() == 14
    arm.record(step("corral", 14, [9.0, 0.6]), ARGS.threshold)
    assert arm.capacity == 14 and arm.probe() == 13


def test_a_session_s_first_turn_and_turns_with_no_text_are_left_out_of_the_ttft_but_counted_as_turns() -> None:
    made = step("actant", 1, [5.0, 0.4, None, 0.2])
    assert made.turns == 4 and made.no_text == 1
    assert sorted(made.ttfts) == [0.2, 0.4]


def test_the_summary_and_report_give_each_arm_its_capacity_or_the_step_it_got_to() -> None:
    found, not_found = Arm("corral"), Arm("actant")
    for sessions, ttft in ((1, 0.3), (8, 0.7)):
        found.record(step("corral", sessions, [1.0, ttft]), ARGS.threshold)
        not_found.record(step("actant", sessions, [1.0, 0.3 + sessions / 100]), ARGS.threshold)
    not_found.stopped = "under 2x at every step up to 8 sessions"
    figures = summary([found, not_found])
    cores = figures["cores"]
    assert figures["corral"]["sessions_at_2x"] == 8 and figures["corral"]["sessions_per_core"] == 8 / cores
    assert figures["actant"]["sessions_per_core"] is None and len(figures["actant"]["steps"]) == 2
    body = report([found, not_found], ARGS)
    assert f"**{8 / cores:g} sessions per core**" in body and "not reached" in body


def test_steps_that_do_not_start_with_one_session_are_refused_before_anything_starts() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.capacity", "--steps", "4,8"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 2 and "--steps must start at 1" in done.stderr


def test_an_arm_whose_process_failed_before_any_step_is_reported_as_not_measured() -> None:
    failed = Arm("actant")
    failed.stopped = "its process failed at 1 sessions: RuntimeError: the actant arm exited"
    assert "not measured (its process failed" in report([failed], ARGS)
    assert summary([failed])["actant"]["ttft_alone_p50"] is None
