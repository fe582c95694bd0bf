"""Published figures are true of a commit: every results file names the clean commit it was measured on, and every
figure the READMEs quote is what `bench.quote` renders from its results file (no figure typed by hand)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from bench import quote
from bench._report import RESULTS_DIR, begin_run, read_summary, write_results


def test_every_quoted_block_is_what_its_results_file_gives() -> None:
    assert quote.stale() == [], "run `python -m bench.quote` after a benchmark run, and commit both"


def test_every_results_file_names_a_clean_commit() -> None:
    files = sorted(RESULTS_DIR.glob("*.md"))
    assert files
    for path in files:
        record = read_summary(path)
        assert re.fullmatch(r"[0-9a-f]{40}", record["commit"]), f"{path.name}: no commit"
        assert record["dirty"] is False, f"{path.name} was measured on a dirty tree"
        assert "DIRTY" not in path.read_text(), path.name


def test_every_block_in_the_readmes_has_a_renderer_and_each_is_quoted() -> None:
    quoted = {m.group(2) for document in quote.DOCUMENTS for m in quote.BLOCK.finditer(document.read_text())}
    assert quoted <= set(quote.RENDER)
    assert set(quote.RENDER) <= quoted, "a renderer whose block no README carries"


def _repository(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    (root / "tracked.py").write_text("x = 1\n")
    commit = ["-c", "user.name=bench", "-c", "user.email=bench@example.invalid", "commit", "-q", "-m", "start"]
    for command in (["init", "-q"], ["add", "tracked.py"], commit):
        subprocess.run(["git", *command], cwd=root, check=True)
    return root


def test_a_dirty_tree_is_refused_before_measuring_and_marked_loudly_when_allowed(tmp_path: Path) -> None:
    root = _repository(tmp_path)
    clean = begin_run(root=root)
    assert not clean.dirty and re.fullmatch(r"[0-9a-f]{40}", clean.commit)

    (root / "tracked.py").write_text("x = 2\n")
    with pytest.raises(SystemExit, match=r"\(tracked\.py\).*--allow-dirty"):
        begin_run(root=root)
    run = begin_run(allow_dirty=True, root=root)
    path = write_results("probe", "Probe", "body", summary={"x": 1}, directory=tmp_path / "results")
    first_lines = path.read_text().splitlines()[:4]
    assert run.dirty and any("DIRTY TREE" in line and ": tracked.py." in line for line in first_lines), first_lines
    record = read_summary(path)
    assert record["dirty"] is True and record["commit"] == run.commit and record["figures"] == {"x": 1}
    assert len(record["load_start"]) == 3 and len(record["load_end"]) == 3


def test_a_results_run_of_several_benchmarks_stays_clean_while_it_writes_results(tmp_path: Path) -> None:
    root = _repository(tmp_path)
    (root / "bench" / "results").mkdir(parents=True)
    (root / "bench" / "results" / "ttft.md").write_text("written by the previous benchmark of the run\n")
    assert not begin_run(root=root).dirty


def test_a_virtualenv_in_the_checkout_is_not_a_change_but_a_new_file_is(tmp_path: Path) -> None:
    root = _repository(tmp_path)
    (root / ".venv").mkdir()
    (root / ".venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    assert not begin_run(root=root).dirty
    (root / "new_module.py").write_text("")
    with pytest.raises(SystemExit, match=r"\(new_module\.py\)"):
        begin_run(root=root)
