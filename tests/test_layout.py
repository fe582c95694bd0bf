"""The design card's layout, kept layered: the roles at the top level, `corral/` the ground they all stand on.

- `corral/` imports no role package (`workflows`, `activities`, `workers`, `proxy`, `cli`), not even inside a
  function: whatever a hand author, a client or a role imports from `corral` comes without any role.
- `workflows/` imports only the contract and the names of `corral`, and the standard library modules and
  libraries that do no I/O (DESIGN.md invariant 1 is tested beside it, in test_invariants.py).
- `proxy/` does not import Temporal, so the credential proxy can be tested and reused on its own.
Every import is absolute.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ROLES = ("workflows", "activities", "workers", "proxy", "cli", "gateway")


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


@pytest.mark.parametrize("path", modules("proxy"), ids=lambda path: path.name)
def test_the_credential_proxy_does_not_import_temporal(path: Path) -> None:
    bad = [f"line {line}: {module}" for line, module, _ in imports(path) if top(module) == "temporalio"]
    assert bad == [], f"{path.name} imports Temporal: {bad}"


@pytest.mark.parametrize("package", ["corral", *ROLES, "tests", "bench", "examples"])
def test_imports_are_absolute(package: str) -> None:
    relative = [
        f"{path.relative_to(ROOT)}:{line}" for path in modules(package) for line, _, level in imports(path) if level
    ]
    assert relative == []


def test_every_top_level_package_is_installed() -> None:
    """pyproject's package list names every role, so `pip install .` (not only -e) ships them."""
    text = (ROOT / "pyproject.toml").read_text()
    for package in (*ROLES, "corral"):
        assert f'"{package}*"' in text, f"{package} is missing from [tool.setuptools.packages.find]"
