"""The overload benchmark's judgements: which turns count as served out of order, which sessions are watched, what a
waiting user is reported to have seen, and the report and summary of each level. Figures here are made up, not
timed: the benchmark itself runs with `python -m bench.overload` (bench/README.md)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections import Counter

from bench.overload import (
    ROOT,
    ROUTED_FALLBACK,
    Arm,
    Checked,
    Level,
    Step,
    WaitSeen,
    Watch,
    report,
    served_in_order,
    summary,
    watched_indices,
)

ARGS = argparse.Namespace(first_token_latency=0.3, tokens_per_second=50.0, turns=3, sample_every=1.0)


def test_turns_served_in_the_order_they_were_sent_are_never_out_of_order() -> None:
    # Five turns sent 1 s apart, each waiting 3 s: every later one waits while the earlier ones do.
    order = served_in_order([(float(i), i + 3.0) for i in range(5)], slack=0.5)
    assert order.pairs == 7  # (0,1) (0,2) (1,2) (1,3) (2,3) (2,4) (3,4): sent before the earlier was served
    assert order.overtaken == 0 and order.out_of_order == 0.0
    assert order.rank_correlation == 1.0


def test_a_later_turn_served_first_is_counted_and_turns_sent_within_the_slack_are_not_compared() -> None:
    turns = [(0.0, 5.0), (1.0, 2.0), (1.1, 6.0), (7.0, 8.0)]
    order = served_in_order(turns, slack=0.5)
    # Compared: (0,1) overtaken, (0,2) in order, (1,2)? sent 0.1 s apart: within the slack; (x,3): sent after.
    assert (order.pairs, order.overtaken) == (2, 1)
    assert order.out_of_order == 0.5
    assert served_in_order(turns, slack=2.0).pairs == 0


def test_watched_sessions_are_spread_from_the_first_to_the_last() -> None:
    assert watched_indices(100) == {0, 33, 66, 99}
    assert watched_indices(3) == {0, 1, 2}


def test_a_watched_session_is_reported_by_its_longest_wait() -> None:
    watch = Watch({"q": "activity"})
    for key, waited in (((1, 10.0), 0.5), ((1, 20.0), 4.0), ((2, 10.0), 1.0)):
        watch.waits[key] = WaitSeen(key[0], "model", "model_turn", "q", waited, ahead=int(waited), backlog=9)
    assert [(seen.session, seen.waited) for seen in watch.longest(5)] == [(1, 4.0), (2, 1.0)]
    watch.note_queue("q", 3, 2.0)
    watch.note_queue("q", 1, 5.0)
    assert (watch.backlog["q"], watch.oldest["q"]) == (3, 5.0)


def _level(factor: float, sessions: int, ttft: float) -> Level:
    step = Step("corral", sessions, wall=10.0)
    step.add_turns([9.0, ttft, ttft])
    checked = Checked()
    checked.findings["`model_turn` activity timed out (SCHEDULE_TO_START)"] = 2
    checked.findings["workflow task timed out (START_TO_CLOSE)"] = 1
    checked.findings["`model_turn` activity timed out (HEARTBEAT)"] = 3
    checked.findings["`execute` activity started again (attempt > 1)"] = 1
    checked.findings[ROUTED_FALLBACK] = 2
    checked.waits["`model_turn` activity"] = [0.1, 2.0]
    watch = Watch({"q": "activity"})
    watch.waits[(0, 1.0)] = WaitSeen(0, "model", "model_turn", "q", 12.4, ahead=31, backlog=58)
    return Level(factor, step, checked, watch, served_in_order([(0.0, 3.0), (1.0, 2.0)], 0.3), Counter())


def test_each_level_reports_ratios_to_alone_time_outs_retries_order_and_what_a_waiting_user_saw() -> None:
    arm = Arm("corral")
    arm.record(_step(1, 0.3), 2.0)
    arm.record(_step(8, 0.7), 2.0)
    levels = [_level(2, 16, 0.6), _level(10, 80, 3.0)]
    body = report(arm, 8, "measured", levels, ARGS)
    assert "**8 sessions**" in body and "| 10x | 80 |" in body
    assert "waited 12.4 s for a model worker (model_turn, queue `q`) with about 31 tasks ahead of it" in body
    figures = summary(arm, 8, "measured", levels, ARGS)
    top = figures["levels"][1]
    assert top["ttft_p50_ratio"] == 10.0 and top["sessions"] == 80
    assert (top["schedule_to_start_timeouts"], top["routed_model_turns_sent_on"]) == (2, 2)
    assert (top["start_to_close_timeouts"], top["heartbeat_timeouts"], top["activities_retried"]) == (1, 3, 1)
    assert (top["order_pairs"], top["out_of_order_share"]) == (1, 1.0)


def _step(sessions: int, ttft: float) -> Step:
    made = Step("corral", sessions, wall=10.0)
    made.add_turns([9.0, ttft, ttft])
    return made


def test_levels_that_are_not_numbers_are_refused_before_anything_starts() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "bench.overload", "--levels", "2,ten"], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 2 and "--levels" in done.stderr
