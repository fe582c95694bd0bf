"""The capacity figure as the READMEs quote it (`<!-- bench:capacity -->`), from the summary of the results
file `python -m bench.capacity` writes; empty until it is measured."""

from __future__ import annotations

from typing import Any

from bench._operations_figures import measured, source, summary


def _arm(name: str, arm: dict[str, Any], cores: int) -> str:
    if not arm["steps"]:
        return f"{name} not measured ({arm['stopped']})"
    alone = f"TTFT p50 {arm['ttft_alone_p50']:.3f} s alone"
    if arm["sessions_per_core"] is not None:
        return (
            f"{name} **{arm['sessions_per_core']:g} sessions per core** ({arm['sessions_at_2x']} on {cores}; {alone})"
        )
    last = arm["steps"][-1]["sessions"]
    return f"{name} at least {last / cores:g} per core, 2x not reached by {last} sessions ({alone})"


def capacity() -> str:
    if not measured("capacity"):
        return ""
    f = summary("capacity")["figures"]
    arms = [_arm(name, f[name], f["cores"]) for name in ("corral", "actant") if name in f]
    lost = sum(
        step["lost"] + step["duplicated"] for name in ("corral", "actant") if name in f for step in f[name]["steps"]
    )
    return (
        f"Latest result ({source('capacity')}): sessions each turning back to back until TTFT p50 is 2x one "
        f"session's, in the same run: {'; '.join(arms)}; {lost} lost or duplicated over every step."
    )
