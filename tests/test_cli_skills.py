"""`corral skills` in process (typer's runner) on the run's knowledge database and blob store: a folder made a
skill, a version added, both listed, the latest downloaded as the zip the API gives, a bad folder refused with the
library's message and exit code 2, a version and the skill deleted, and another workspace's skill not found."""

from __future__ import annotations

import io
import re
import uuid
import zipfile
from pathlib import Path

from typer.testing import CliRunner

from cli.main import app
from tests.conftest import unique

runner = CliRunner()
EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "skills" / "csv-summary"


def invoke(state_dir: Path, *args: str) -> tuple[int, str]:
    result = runner.invoke(app, ["--state-dir", str(state_dir), "skills", *args])
    return result.exit_code, result.output


def test_a_skill_from_a_folder_through_its_versions_to_its_deletion(tmp_path: Path) -> None:
    workspace = unique("cli-skills")
    code, output = invoke(tmp_path, "create", str(EXAMPLE), "-w", workspace, "--display-name", "CSV summaries")
    assert code == 0, output
    skill_id = re.findall(r"^(skill_\w+)$", output, re.MULTILINE)[0]  # stdout is captured: the id alone on a line
    assert f"made skill {skill_id} (CSV summaries)" in output

    changed = tmp_path / "copy" / "csv-summary"
    (changed / "scripts").mkdir(parents=True)
    (changed / "SKILL.md").write_bytes((EXAMPLE / "SKILL.md").read_bytes() + b"\n4. Keep it short.\n")
    (changed / "scripts" / "summarize.py").write_text("print('v2')\n")
    code, output = invoke(tmp_path, "add-version", skill_id, str(changed), "-w", workspace)
    assert code == 0, output
    second = re.findall(r"^(skillver_\w+)$", output, re.MULTILINE)[0]
    assert f"added version {second}" in output

    code, output = invoke(tmp_path, "ls", "-w", workspace)
    assert code == 0 and skill_id in output and "csv-summary" in output and second in output, output
    code, output = invoke(tmp_path, "versions", skill_id, "-w", workspace)
    assert code == 0 and output.count("skillver_") == 2 and output.index(second) < output.rindex("skillver_"), output

    target = tmp_path / "latest.zip"
    code, output = invoke(tmp_path, "download", skill_id, "-w", workspace, "-o", str(target))
    assert code == 0, output
    with zipfile.ZipFile(io.BytesIO(target.read_bytes())) as archive:
        assert sorted(archive.namelist()) == ["csv-summary/SKILL.md", "csv-summary/scripts/summarize.py"]
        assert archive.read("csv-summary/scripts/summarize.py") == b"print('v2')\n"
    code, output = invoke(tmp_path, "download", skill_id, "-w", workspace, "-o", str(target))
    assert code == 1 and "exists" in output

    code, output = invoke(tmp_path, "ls", "-w", unique("cli-other"))
    assert code == 0 and skill_id not in output
    code, output = invoke(tmp_path, "versions", skill_id, "-w", unique("cli-other"))
    assert code == 1 and f"skill {skill_id!r} was not found" in output

    code, output = invoke(tmp_path, "rm", skill_id, "-w", workspace, "--version", second)
    assert code == 0 and f"deleted version {second}" in output, output
    code, output = invoke(tmp_path, "rm", skill_id, "-w", workspace, "--version", "latest")
    assert code == 1 and "only version" in output, output
    code, output = invoke(tmp_path, "rm", skill_id, "-w", workspace)
    assert code == 0 and "deleted skill" in output
    code, output = invoke(tmp_path, "ls", "-w", workspace)
    assert code == 0 and "no skills" in output


def test_a_bad_folder_is_refused_with_the_librarys_message(tmp_path: Path) -> None:
    folder = tmp_path / "broken"
    folder.mkdir()
    (folder / "SKILL.md").write_text("no frontmatter here\n")
    code, output = invoke(tmp_path, "create", str(folder), "-w", unique("cli-bad"))
    assert code == 2 and "must start with YAML frontmatter" in output, output
    code, output = invoke(tmp_path, "create", str(tmp_path / "missing"), "-w", unique("cli-bad"))
    assert code == 1 and "is not a directory" in output, output
    code, output = invoke(tmp_path, "add-version", f"skill_{uuid.uuid4().hex[:26]}", str(EXAMPLE), "-w", "w")
    assert code == 1 and "was not found" in output, output
