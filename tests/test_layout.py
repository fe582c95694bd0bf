"""The design card's layout, kept layered: every role and process at the top level, `corral/` the ground they all
stand on.

- Each role of the design card (`workflows`, `activities`, `workers`, `proxy`) and each process or library with a
  job of its own (`gateway`, `cli`, the Docker library `sandbox`, the stream `relay`, the offline `modelserver`, the
  compose tool `deploy`) is a top-level package named for what it is.
- `corral/` imports none of them, not even inside a function: whatever a hand author, a client or a role imports
  from `corral` comes without any role. It holds the contract, the names, the client, blobs, telemetry and
  converters, and the hand author's library (`corral.hands`).
- `workflows/` imports only the contract and the names of `corral`, and the standard library modules and
  libraries that do no I/O (the determinism rule is tested beside it, in test_invariants.py).
- `proxy/` and `sandbox/` do not import Temporal: the credential proxy and the Docker library are the two places
  that touch secrets and containers, and each can be tested and reused on its own.
- No package imports another's private module (`_name`): what crosses a package line is public. Tests are the one
  exception: a unit test may reach into the private module it tests.
Every import is absolute.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROLES = ("workflows", "activities", "workers", "proxy", "cli", "gateway", "sandbox", "relay", "modelserver", "deploy")
PACKAGES = ("corral", *ROLES, "bench", "examples")
"""Every package but `tests`: the ones the private-module rule holds for."""


def modules(package: str) -> list[Path]:
    found = sorted((ROOT / package).rglob("*.py"))
    assert found, f"no module under {package}/: this test would check nothing"
    return found


def imports(path: Path) -> list[tuple[int, str, int]]:
    """(line, module, level) of every import in the file, at any depth (function-level imports included)."""
    found: list[tuple[int, str, int]] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name, 0) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append((node.lineno, node.module or "", node.level))
    return found


def top(module: str) -> str:
    return module.split(".")[0]


def test_the_top_level_is_the_design_cards() -> None:
    for folder in (*ROLES, "corral", "tests", "bench"):
        assert (ROOT / folder / "__init__.py").is_file(), f"{folder}/ is not a package at the top level"
    for file in ("pyproject.toml", "docker-compose.yml", "README.md"):
        assert (ROOT / file).is_file()


def test_the_ground_runs_no_process_and_holds_no_docker_code() -> None:
    """A process of its own has a package of its own at the top level; Docker is `sandbox/`'s alone."""
    assert sorted(path.relative_to(ROOT) for path in (ROOT / "corral").rglob("__main__.py")) == []
    docker = [
        f"{path.relative_to(ROOT)}:{line}" for path in modules("corral") for line, module, _ in imports(path)
        if top(module) == "docker"
    ]  # fmt: skip
    assert docker == [], f"Docker code in corral/: {docker}"


@pytest.mark.parametrize("path", modules("corral"), ids=lambda path: str(path.relative_to(ROOT)))
def test_corral_imports_no_role(path: Path) -> None:
    bad = [f"line {line}: {module}" for line, module, _ in imports(path) if top(module) in ROLES]
    assert bad == [], f"{path.relative_to(ROOT)} imports a role package: {bad}"


WORKFLOW_MAY_IMPORT = {
    "__future__", "asyncio", "collections", "dataclasses", "datetime", "enum", "functools", "itertools", "typing",
    "temporalio", "pydantic", "workflows", "corral.contract", "corral.names",
}  # fmt: skip


@pytest.mark.parametrize("path", modules("workflows"), ids=lambda path: path.name)
def test_workflows_import_only_the_contract_and_names(path: Path) -> None:
    def allowed(module: str) -> bool:
        return any(module == name or module.startswith(name + ".") for name in WORKFLOW_MAY_IMPORT)

    bad = [f"line {line}: {module}" for line, module, _ in imports(path) if not allowed(module)]
    assert bad == [], f"{path.name} imports more than the contract and names: {bad}"


@pytest.mark.parametrize("path", [*modules("proxy"), *modules("sandbox")], ids=lambda path: str(path.relative_to(ROOT)))
def test_the_credential_proxy_and_the_docker_library_do_not_import_temporal(path: Path) -> None:
    bad = [f"line {line}: {module}" for line, module, _ in imports(path) if top(module) == "temporalio"]
    assert bad == [], f"{path.relative_to(ROOT)} imports Temporal: {bad}"


def package_of(path: Path) -> str:
    """The dotted package a module belongs to (`corral.hands` for corral/hands/output.py)."""
    return ".".join(path.relative_to(ROOT).parent.parts)


def private_of_another(module: str, home: str) -> bool:
    """Whether `module` names a private module (a `_name` part) that lies outside the package `home`."""
    parts = module.split(".")
    for index, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            owner = ".".join(parts[:index])
            return not (home == owner or home.startswith(owner + "."))
    return False


@pytest.mark.parametrize("package", PACKAGES)
def test_no_package_imports_another_packages_private_module(package: str) -> None:
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {module}"
        for path in modules(package)
        for line, module, _ in imports(path)
        if private_of_another(module, package_of(path))
    ]
    assert bad == [], f"private modules imported across a package line: {bad}"


def test_the_private_module_rule_can_fail() -> None:
    assert private_of_another("workers._run", "bench")
    assert private_of_another("sandbox._x", "deploy")
    assert private_of_another("corral.hands._execute", "corral")
    assert not private_of_another("corral.hands._execute", "corral.hands")
    assert not private_of_another("workflows._log", "workflows")
    assert not private_of_another("relay.__main__", "cli")


@pytest.mark.parametrize("package", [*PACKAGES, "tests"])
def test_imports_are_absolute(package: str) -> None:
    relative = [
        f"{path.relative_to(ROOT)}:{line}" for path in modules(package) for line, _, level in imports(path) if level
    ]
    assert relative == []


def test_every_top_level_package_is_installed() -> None:
    """pyproject's package list names every role, so `pip install .` (not only -e) ships them."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    installed = project["tool"]["setuptools"]["packages"]["find"]["include"]
    typed = project["tool"]["mypy"]["files"]
    on_disk = sorted(path.parent.name for path in ROOT.glob("*/__init__.py"))
    for package in on_disk:
        assert package in (*PACKAGES, "tests"), f"{package}/ is a top-level package this test does not know"
        assert package in typed, f"{package} is missing from [tool.mypy] files"
    for package in (*ROLES, "corral"):
        assert f"{package}*" in installed, f"{package} is missing from [tool.setuptools.packages.find]"


MODULE_CEILING = 600
MODULE_LIMIT = 400
REASON = "# Over 400 lines because "
REASON_WITHIN = 5
"""How many lines at the top of a module may hold its `# Over 400 lines because …` comment."""


def is_python_program(path: Path) -> bool:
    """A file without the .py suffix that runs with python (its first line a `#!` naming python)."""
    with path.open("rb") as file:
        first = file.readline(200)
    return first.startswith(b"#!") and b"python" in first


def python_sources() -> list[Path]:
    """Every non-test Python source of the repository: the modules of every package but `tests` (bench and examples
    included), any module at the top level, and the Python programs shipped in `images/`."""
    found = [path for package in PACKAGES for path in modules(package)] + sorted(ROOT.glob("*.py"))
    found += [path for path in sorted((ROOT / "images").rglob("*")) if path.is_file() and is_python_program(path)]
    return found


def says_why(lines: list[str]) -> bool:
    """Whether one of the first lines is a `# Over 400 lines because …` comment giving a reason of four words or
    more."""
    return any(
        line.startswith(REASON) and len(line.removeprefix(REASON).split()) >= 4 for line in lines[:REASON_WITHIN]
    )


def size_problem(name: str, text: str) -> str | None:
    """What the module size rule finds wrong with a module of this text, or None."""
    count = len(text.splitlines())
    if count > MODULE_CEILING:
        return f"{name}: {count} lines, over the hard ceiling of {MODULE_CEILING}"
    if count > MODULE_LIMIT and not says_why(text.splitlines()):
        return (
            f"{name}: {count} lines, over {MODULE_LIMIT} with no `{REASON}…` comment in its first {REASON_WITHIN} lines"
        )
    return None


def test_no_module_is_over_the_ceiling_or_over_400_lines_without_saying_why() -> None:
    """Small modules, one job each. Every non-test Python source of the repository (see `python_sources`) is
    measured in lines (as `str.splitlines` counts them):

    - over 600 lines fails, whatever the module says: 600 is a hard ceiling;
    - over 400 lines fails unless one of its first five lines is a comment that starts `# Over 400 lines because `
      and gives the reason in at least four more words (a module that passes 400 is split by job, or says there
      why it is not);
    - 400 lines or fewer passes.
    Every module that breaks the rule is listed in the failure, one line each.
    """
    sources = python_sources()
    names = {str(path.relative_to(ROOT)) for path in sources}
    assert {"workflows/session.py", "bench/load.py", "images/sandbox/tools/corral-runner"} <= names, (
        "the scan misses modules it must measure"
    )
    problems = [size_problem(str(path.relative_to(ROOT)), path.read_text()) for path in sources]
    found = [problem for problem in problems if problem is not None]
    assert found == [], "modules over the size rule:\n" + "\n".join(found)


def test_the_module_size_rule_can_fail() -> None:
    why = "# Over 400 lines because one state machine reads best as a whole\n"
    body = "x = 1\n"
    assert size_problem("m.py", body * 400) is None
    assert "over 400" in str(size_problem("m.py", body * 401))
    assert size_problem("m.py", why + body * 400) is None
    assert size_problem("m", "#!/usr/bin/python3\n" + why + body * 400) is None
    assert "over 400" in str(size_problem("m.py", body * REASON_WITHIN + why + body * 400)), "too far down"
    assert "over 400" in str(size_problem("m.py", "# Over 400 lines because big\n" + body * 400)), "no reason"
    in_a_docstring = '"""# Over 400 lines because it is long and whole."""\n'
    assert "over 400" in str(size_problem("m.py", in_a_docstring + body * 400)), "a comment, not a docstring"
    assert "hard ceiling" in str(size_problem("m.py", why + body * 600)), "a reason does not lift the ceiling"
