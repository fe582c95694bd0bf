"""The A/B benchmark's arithmetic: the order its runs alternate in, and each figure's medians and ratio, from
made-up summaries (the benchmark itself runs with `python -m bench.compare BASE`, bench/README.md)."""

from __future__ import annotations

from typing import Any

from bench.compare import compare, order, table


def figures(turns_per_second: float, temporal: float, harness: float) -> dict[str, Any]:
    """A `bench.load` summary's figures, with only what the comparison reads."""
    processes = {
        "Temporal dev server": {"cpu_ms_per_turn": temporal},
        "harness worker": {"cpu_ms_per_turn": harness},
        "model worker": {"cpu_ms_per_turn": 30.0},
        "stream relay": {"cpu_ms_per_turn": 6.0},
    }
    return {
        "turns_per_second": turns_per_second,
        "ttft_loaded_p50": 2.0,
        "ttft_loaded_p95": 4.0,
        "ttft_loaded_p99": 6.0,
        "processes": processes,
        "server_per_turn": {"frontend_rpcs_per_turn": 40.0, "persistence_requests_per_turn": 80.0},
        "history_per_turn": {"workflow tasks completed": 4.2},
        "went_wrong": {"workflow task timed out (SCHEDULE_TO_START)": 3},
        "lost": 0,
        "duplicated": 0,
    }


def test_each_round_reverses_the_one_before_so_a_drift_falls_on_both_sides() -> None:
    assert order(1) == ["base", "head"]
    assert order(3) == ["base", "head", "head", "base", "base", "head"]


def test_each_figure_has_its_runs_a_median_per_side_and_the_ratio_of_the_medians() -> None:
    runs = {
        "base": [figures(10.0, 80.0, 28.0), figures(12.0, 70.0, 24.0)],
        "head": [figures(11.0, 60.0, 21.0), figures(13.0, 50.0, 15.0)],
    }
    rows = {name: (on_base, on_head) for name, on_base, on_head in compare(runs)}
    assert rows["turns per second"] == ([10.0, 12.0], [11.0, 13.0])
    assert rows["CPU ms per turn: corral's own processes"] == ([64.0, 60.0], [57.0, 51.0])
    assert rows["harness CPU / Temporal CPU"] == ([0.35, 24.0 / 70.0], [0.35, 0.3])
    assert rows["workflow tasks timed out on schedule-to-start"] == ([3.0, 3.0], [3.0, 3.0])
    shown = {
        line.split(" | ")[0].removeprefix("| "): line for line in table(compare(runs), "a" * 40, "b" * 40).splitlines()
    }
    assert shown["CPU ms per turn: Temporal server"].endswith("| 75.0 | 60.0, 50.0 | 55.0 | 0.733 |")
    assert shown["turns per second"] == "| turns per second | 10.0, 12.0 | 11.0 | 11.0, 13.0 | 12.0 | 1.091 |"
