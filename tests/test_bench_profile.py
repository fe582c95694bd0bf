"""The profile's flame graph and table, from collapsed stacks as py-spy writes them: a pure rendering, no process is
sampled here (`python -m bench.load --profile` does that)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

from bench.load import profile

STACKS = """\
<module> (w.py:10);run (asyncio/runners.py:44);request_response.<locals>.app (starlette/routing.py:70) 60
<module> (w.py:10);run (asyncio/runners.py:44);a_b_&_c (x/y.py:1) 30
<module> (w.py:10);idle 10
"""


def test_a_flame_graph_of_frames_with_markup_characters_is_well_formed_svg(tmp_path: Path) -> None:
    raw = tmp_path / "harness-worker.txt"
    raw.write_text(STACKS)
    found = profile.Profile.read("harness worker", raw)
    assert found.samples == 100
    svg = tmp_path / "graph.svg"
    profile.flame_graph(found, svg, width=230)  # narrow enough that a label is cut where `<` is escaped
    titles = [t.text for t in ET.parse(svg).getroot().iter("{http://www.w3.org/2000/svg}title")]
    assert "request_response.<locals>.app (starlette.routing): 60.0%" in titles
    assert "a_b_&_c (x.y): 30.0%" in titles


def test_the_table_gives_each_frames_share_in_ms_per_turn(tmp_path: Path) -> None:
    raw = tmp_path / "model.txt"
    raw.write_text(STACKS)
    own, under = profile.Profile.read("model worker", raw).top(3)
    assert own[0] == ("request_response.<locals>.app (starlette.routing)", 60)
    assert dict(under)["run (asyncio.runners)"] == 90
    table = profile.table(profile.Profile.read("model worker", raw), seconds=10, turns=1)
    assert f"{100 * 1000 / profile.SAMPLE_RATE:.1f} ms per turn" in table
