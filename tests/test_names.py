"""Every name once: a known name (an id prefix, a task queue, a search attribute, an error type, a `CORRAL_`
environment variable, the session statuses) is spelled in its home module and imported everywhere else.

A name written out as a literal a second time drifts: one copy is renamed, the other still matches nothing, and
nothing fails until a session does. So this test collects the names from their homes and scans the string
constants of every non-test module (docstrings and `__all__` aside) for one of them.

- Homes: `corral/names.py` (task queues, id prefixes, environment variables, the session's search attributes and
  update error types, the statuses: `SessionStatus`, whose `Literal` is their one spelling),
  `corral/contract/records.py` (the records' search attributes and error types),
  `corral/contract/errors.py` and `corral/contract/proxy.py` (the error types activities raise to workflows),
  and `corral/contract/search_attributes.py` (every search attribute's typed key, built once).
- An id prefix is also caught at the head of an f-string (`f"sesn_{suffix}"` makes an id without the constant),
  and a search attribute inside any string (a visibility query).
- The statuses: two or more of them together (a set, a tuple, a `Literal`, an enum) are the vocabulary spelled
  again. One status as a value is left to mypy, which checks it wherever it is typed `SessionStatus` ("running"
  is also a Docker container's state, so a scan for the word alone would flag the sandbox).
- A `CORRAL_` environment variable that is not in `corral/names.py` may be spelled in one module (its reader);
  spelled in two, it must get a home there.
- `EXEMPT` lists the few literals that share a name's text but mean something else, each with its reason.
- `tests/` is exempt: a test spells an id, a status or an error type out on purpose, to pin the wire format a
  client sees (a renamed constant must fail that test, not silently change the format with it).
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Final, get_args

import pytest

from corral.contract import records
from corral.names import (
    ARCHIVED,
    BUDGET_CREATE_ONLY,
    BUDGET_NOT_RAISED,
    BUSY,
    DELETING,
    FORMER_ERROR_TYPES,
    SESSION_STATUSES,
    SessionStatus,
    refusal_type,
)

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (
    "corral", "workflows", "activities", "workers", "proxy", "gateway", "cli", "sandbox", "relay", "modelserver",
    "deploy", "bench", "examples",
)  # fmt: skip
HOMES: Final = {
    ROOT / "corral" / "names.py",
    ROOT / "corral" / "contract" / "records.py",
    ROOT / "corral" / "contract" / "errors.py",
    ROOT / "corral" / "contract" / "proxy.py",
    ROOT / "corral" / "contract" / "search_attributes.py",
}
ENV_NAME = re.compile(r"^CORRAL_[A-Z0-9_]+$")


def constants(path: Path) -> dict[str, str]:
    """The module-level `NAME = "value"` (or `NAME: Final = "value"`) string constants of a home module."""
    found: dict[str, str] = {}
    for node in ast.parse(path.read_text(), str(path)).body:
        target, value = None, None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant) and isinstance(value.value, str):
            found[target.id] = value.value
    return found


def known_names() -> dict[str, str]:
    """Every known name but the statuses, mapped to what it is (for the failure message)."""
    known: dict[str, str] = {}
    for constant, value in constants(ROOT / "corral" / "names.py").items():
        if constant.endswith("_TASK_QUEUE"):
            known[value] = f"a task queue ({constant})"
        elif constant.startswith("ENV_"):
            known[value] = f"an environment variable ({constant})"
        elif constant.startswith("SEARCH_ATTRIBUTE_"):
            known[value] = f"a search attribute ({constant})"
        elif constant.endswith("_ID_PREFIX") and value.endswith("_"):
            known[value] = f"an id prefix ({constant})"
        elif constant in ERROR_TYPE_CONSTANTS:
            known[value] = f"an error type ({constant})"
    for constant, value in constants(ROOT / "corral" / "contract" / "records.py").items():
        if constant.startswith("SEARCH_ATTRIBUTE_"):
            known[value] = f"a search attribute ({constant})"
        elif constant in ERROR_TYPE_CONSTANTS:
            known[value] = f"an error type ({constant})"
    for module in ("errors.py", "proxy.py"):
        for constant, value in constants(ROOT / "corral" / "contract" / module).items():
            if constant in ERROR_TYPE_CONSTANTS:
                known[value] = f"an error type ({constant})"
    return known


ERROR_TYPE_CONSTANTS: Final = {
    # corral/names.py: a session's update refused
    "ARCHIVED", "DELETING", "BUSY", "BUDGET_CREATE_ONLY", "BUDGET_NOT_RAISED", "HANDING_OVER",
    # corral/contract/records.py: a record's update or query refused
    "VERSION_CONFLICT", "DELETED", "NO_SUCH_VERSION",
    # corral/contract/errors.py and corral/contract/proxy.py: raised by activities, read by workflows
    "MODEL_RETRYABLE", "MODEL_FATAL", "TOOL_ERROR", "SANDBOX_GONE", "SANDBOX_UNAVAILABLE", "MCP_CONNECTION_FAILED",
    "MCP_AUTHENTICATION_FAILED", "PROXY_REJECTED", "VAULT_NOT_FOUND", "CREDENTIAL_NOT_FOUND", "VAULT_UNAVAILABLE",
}  # fmt: skip
"""The constants that name an `ApplicationError.type`, in the modules that are their homes."""

EXEMPT: Final = {
    ("workers/harness.py", "corral-harness"): "the program's name (its console script), which the queue shares",
    ("workers/model.py", "corral-model"): "the program's name (its console script), which the queue shares",
    ("workers/proxy.py", "corral-proxy"): "the program's name (its console script), which the queue shares",
    ("workers/sandbox.py", "corral-sandbox"): "the program's name (its console script), which the queue shares",
    ("sandbox/image.py", "corral-sandbox"): "the sandbox image's repository, which the queue's word shares",
    ("cli/harness.py", "corral-harness"): "the default Worker Deployment's name (docker-compose.yml's), not a queue",
}
"""(module, literal) pairs that spell a known name's text but mean something else, and why."""

EXEMPT_MODULES: Final = {
    "examples/temporal_client.py": "shows a client that imports only temporalio: it spells corral's public names",
    "deploy/openbao_entrypoint.py": "runs inside the OpenBao image, where corral is not installed (stdlib only)",
}


def docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring nodes: every string that stands alone as a statement (a module's, a class's or a
    function's docstring, and an attribute's docstring after it)."""
    return {
        id(node.value) for node in ast.walk(tree)
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
    }  # fmt: skip


def literals(tree: ast.AST) -> Iterator[tuple[int, str, bool]]:
    """(line, text, at the head of an f-string) of every string constant that is not a docstring, nor a name in
    `__all__` or in the keys of a package's lazy `HOMES` table (`proxy/__init__.py`): a class's name that an error
    type shares."""
    skip = docstrings(tree) | {
        id(item) for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets)
        for item in ast.walk(node.value)
    } | {
        id(key) for node in ast.walk(tree)
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == "HOMES"
        and isinstance(node.value, ast.Dict)
        for key in node.value.keys if key is not None
    }  # fmt: skip
    heads = {
        id(node.values[0]) for node in ast.walk(tree)
        if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant)
    }  # fmt: skip
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            yield node.lineno, node.value, id(node) in heads


def status_vocabularies(tree: ast.AST) -> Iterator[tuple[int, list[str]]]:
    """(line, statuses) of every set, list, tuple, `Literal[...]` or enum class that holds two statuses or more:
    the vocabulary spelled again. One status as a value (`self._set_status("idle")`) is left to mypy, which checks
    it against `SessionStatus` where it is typed so."""
    for node in ast.walk(tree):
        items: list[ast.expr] = []
        if isinstance(node, ast.Set | ast.List | ast.Tuple):
            items = list(node.elts)
        elif isinstance(node, ast.ClassDef):
            items = [statement.value for statement in node.body if isinstance(statement, ast.Assign)]
        found = [
            item.value for item in items
            if isinstance(item, ast.Constant) and isinstance(item.value, str) and item.value in SESSION_STATUSES
        ]  # fmt: skip
        if len(found) > 1 and isinstance(node, ast.stmt | ast.expr):
            yield node.lineno, found


def built_keys(tree: ast.AST) -> Iterator[int]:
    """Lines that build a search attribute's key from its name: `SearchAttributeKey.for_keyword(SEARCH_ATTRIBUTE_X)`."""
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "for_keyword"
            and any(isinstance(arg, ast.Name) and arg.id.startswith("SEARCH_ATTRIBUTE_") for arg in node.args)
        ):  # fmt: skip
            yield node.lineno


def misspelled(source: str, filename: str, known: dict[str, str]) -> list[str]:
    """`file:line` and what it is, for every literal in `source` that spells a known name."""
    tree = ast.parse(source, filename)
    prefixes = [name for name, what in known.items() if what.startswith("an id prefix")]
    attributes = re.compile(
        r"\b(" + "|".join(name for name, what in known.items() if what.startswith("a search attribute")) + r")\b"
    )
    found = []
    for line, text, head in literals(tree):
        if (filename, text) in EXEMPT:
            continue
        if text in known:
            found.append(f"{filename}:{line}: {text!r} is {known[text]}")
        elif head and (prefix := next((p for p in prefixes if text.startswith(p)), None)):
            found.append(f"{filename}:{line}: f-string {text!r}... is {known[prefix]}")
        elif match := attributes.search(text):
            found.append(f"{filename}:{line}: {text!r} names {known[match.group(1)]}")
    for line, statuses in status_vocabularies(tree):
        found.append(f"{filename}:{line}: {statuses} spells the session statuses (corral.names.SessionStatus)")
    for line in built_keys(tree):
        found.append(f"{filename}:{line}: a search attribute key built again (corral.contract.search_attributes)")
    return found


def sources() -> list[Path]:
    found = [path for package in PACKAGES for path in sorted((ROOT / package).rglob("*.py"))]
    assert len(found) > 100, "too few modules: this test would check nothing"
    return [path for path in found if path not in HOMES and str(path.relative_to(ROOT)) not in EXEMPT_MODULES]


def test_the_homes_hold_every_kind_of_name() -> None:
    kinds = {what.split(" (")[0] for what in known_names().values()}
    assert kinds == {"a task queue", "an environment variable", "a search attribute", "an id prefix", "an error type"}
    constants_named = {what.split(" (")[1].rstrip(")") for what in known_names().values()}
    assert ERROR_TYPE_CONSTANTS <= constants_named, "an error type constant the test looks for is not in its home"
    assert SESSION_STATUSES == frozenset(get_args(SessionStatus)) and len(SESSION_STATUSES) == 4


def test_no_known_name_is_spelled_outside_its_home() -> None:
    known = known_names()
    found = []
    for path in sources():
        found += misspelled(path.read_text(), str(path.relative_to(ROOT)), known)
    assert found == [], "known names spelled outside their homes (import the constant):\n" + "\n".join(found)


def test_a_corral_environment_variable_read_in_two_modules_has_a_home() -> None:
    spelled: dict[str, set[str]] = defaultdict(set)
    for path in sources():
        for _, text, _ in literals(ast.parse(path.read_text(), str(path))):
            if ENV_NAME.match(text):
                spelled[text].add(str(path.relative_to(ROOT)))
    shared = {name: sorted(paths) for name, paths in spelled.items() if len(paths) > 1}
    assert shared == {}, f"spelled in several modules (give each a home in corral/names.py): {shared}"


@pytest.mark.parametrize(
    "source",
    [
        'ID = "sesn_"\n',
        'def f(x):\n    return f"sesn_{x}"\n',
        'QUEUE = "corral-model"\n',
        'KEY = "CorralWorkspace"\n',
        "QUERY = f\"CorralWorkspace = '{1}'\"\n",
        'ENV = "CORRAL_TEMPORAL_ADDRESS"\n',
        'KIND = "ModelFatalError"\n',
        'KIND = "SessionBusy"\n',
        'STATUSES = {"idle", "running"}\n',
        'Status = Literal["idle", "running", "rescheduling", "terminated"]\n',
        'class Status(StrEnum):\n    idle = "idle"\n    running = "running"\n',
        "KEY = SearchAttributeKey.for_keyword(SEARCH_ATTRIBUTE_STATUS)\n",
    ],
)
def test_the_scan_flags_a_known_name(source: str) -> None:
    """The scan can fail: each of these spells a known name outside its home."""
    assert misspelled(source, "sample.py", known_names()) != []


def test_the_scan_leaves_docstrings_and_other_words_alone() -> None:
    source = (
        '"""sesn_ and corral-model are named here."""\nX = "sesn"\nY = f"{1}sesn_x"\n'
        'def f():\n    """CorralStatus and idle, running."""\n    return set_status("idle")\n'
    )
    assert misspelled(source, "sample.py", known_names()) == []


def test_every_error_type_is_one_style() -> None:
    """Temporal's convention: an error type is a CamelCase name (`ModelFatalError`, `SessionBusy`)."""
    types = {name: what for name, what in known_names().items() if what.startswith("an error type")}
    assert [name for name in types if not re.fullmatch(r"[A-Z][A-Za-z]+", name)] == []


def test_a_former_error_type_is_read_as_its_name_now() -> None:
    """A harness build still pinned to running sessions raises the snake_case types of before: readers accept them."""
    assert refusal_type("busy") == BUSY and refusal_type(BUSY) == BUSY and refusal_type(None) is None
    assert set(FORMER_ERROR_TYPES.values()) == {ARCHIVED, DELETING, BUSY, BUDGET_CREATE_ONLY, BUDGET_NOT_RAISED}
    assert set(records.FORMER_ERROR_TYPES.values()) == {
        records.VERSION_CONFLICT, records.ARCHIVED, records.DELETED, records.NO_SUCH_VERSION,
    }  # fmt: skip
    assert all(re.fullmatch(r"[a-z_]+", former) for former in [*FORMER_ERROR_TYPES, *records.FORMER_ERROR_TYPES])
