"""Every file or folder the docs name is in the tree: the Markdown pages, Python docstrings and comments, and the
comments of the Dockerfiles, the compose file and the scripts. A reference that outlives a move sends a newcomer
looking for a file that is gone.

What counts as a reference to the repository, so that nothing else is checked:

- a path whose first segment is a top-level entry of the repository (`sandbox/engine.py`, `images/sandbox/`,
  `.ci/run`): it must exist as written (a `*` in it is a glob, which must match something);
- otherwise, a name ending in `.py`, `.md`, `.yml`, `.yaml` or `.toml`, with or without folders before it
  (`session.py` in a table of `workflows/`, `contract/pricing.py`): some tracked file's path must end with it;
- a Markdown link's target (`[x](../bench/README.md)`), resolved from the page's folder, must exist;
- a backticked dotted name of a top-level package (`corral.client.fork_session`, `sandbox.prepare`): its modules
  must exist and each name after them must be an attribute, unless the code writes that name as a string (a
  Docker label such as `corral.scope` is a name, not a module).

Paths inside a sandbox or on a user's machine (`/workspace/app/README.md`, `~/.corral/...`, `.corral/blobs/`,
`$s/log`), placeholders (`sessions/<id>/log/`) and URLs are not repository paths: a path that starts after `/`,
`~`, `$` or `.` of something else, or inside a URL, is left alone, and so are Markdown code blocks in a language
other than the shell's or Python's (the paths of an HCL policy are Vault's). `NOT_IN_THE_TREE` lists the
few names that mean a file outside it on purpose.
"""

from __future__ import annotations

import ast
import functools
import io
import re
import subprocess
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENDINGS = (".py", ".md", ".yml", ".yaml", ".toml")
URL = re.compile(r"\b[a-z][a-z0-9+.-]*://\S+")
PATH = re.compile(r"(?<![\w/.~$*<>{}@:=-])[\w.*-]*[\w*](?:/[\w.*-]*)*/?")
LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")
BACKTICKED = re.compile(r"`([^`\n]+)`")
DOTTED = re.compile(r"([a-z_]\w*(?:\.\w+)+)(?:\(.*\))?")
FENCE = re.compile(r"^```(\w*)[^\n]*\n.*?^```$", re.DOTALL | re.MULTILINE)
CHECKED_FENCES = ("", "sh", "bash", "console", "python", "text")
NOT_IN_THE_TREE = {
    "load-quick.md": "the results file `python -m bench.load --quick` writes (bench/README.md)",
    "capacity-quick.md": "the results file `python -m bench.capacity --quick` writes (bench/README.md)",
    "prometheus.yml": "the reader's own Prometheus configuration (README.md, docs/observability.md)",
}


@functools.cache
def tracked() -> tuple[str, ...]:
    listing = ["git", "ls-files", "--cached", "--others", "--exclude-standard"]  # a new page counts before its commit
    listed = subprocess.run(listing, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    files = tuple(line for line in listed.splitlines() if line)
    assert files, "git ls-files listed nothing: this test would check nothing"
    return files


@functools.cache
def top_level() -> frozenset[str]:
    return frozenset(path.split("/")[0] for path in tracked() if "/" in path)


@functools.cache
def literal_names() -> frozenset[str]:
    """Every dotted name the code writes as a string (labels, loggers), which prose may quote as a name."""
    names: set[str] = set()
    for path in tracked():
        if path.endswith(".py") and not path.startswith("tests/"):
            for node in ast.walk(ast.parse((ROOT / path).read_text())):
                if isinstance(node, ast.Constant) and isinstance(node.value, str) and DOTTED.fullmatch(node.value):
                    names.add(node.value)
    return frozenset(names)


@functools.cache
def packages() -> frozenset[str]:
    return frozenset(name for name in top_level() if (ROOT / name / "__init__.py").is_file())


def broken_path(token: str, root: Path = ROOT) -> bool | None:
    """Whether `token` names a repository path that does not exist; None when it is not a repository path."""
    token = re.sub(r"^(\.\./)+", "", token.rstrip("."))  # a link from docs/ to the rest of the tree
    if token in NOT_IN_THE_TREE:
        return None
    first = token.split("/")[0]
    if "/" in token and first in top_level():
        if "*" in token:
            return not any(root.glob(token.rstrip("/")))
        return not (root / token).exists()
    if token.endswith(ENDINGS) and "*" not in token and not token.startswith("."):
        return not any(path == token or path.endswith("/" + token) for path in tracked())
    return None


def broken_dotted(name: str) -> bool | None:
    """Whether a dotted `package.module.attribute` of this repository names nothing; None when it is not ours."""
    parts = name.split(".")
    if parts[0] not in packages() or parts[-1] in ("py", "md", "yml", "toml", "json") or name in literal_names():
        return None
    depth = 1
    while depth < len(parts):
        folder = ROOT.joinpath(*parts[:depth])
        if (folder / parts[depth]).is_dir() or (folder / f"{parts[depth]}.py").is_file():
            depth += 1
        else:
            break
    module = ROOT.joinpath(*parts[:depth])
    source = module / "__init__.py" if module.is_dir() else module.with_suffix(".py")
    body = ast.parse(source.read_text()).body
    for attribute in parts[depth:]:  # read, not imported: a module's names and a class's, at any depth
        defined = {name: node for node in body for name in defined_names(node)}
        if attribute not in defined:
            return True
        body = getattr(defined[attribute], "body", [])
    return False


def defined_names(node: ast.stmt) -> list[str]:
    """The names a statement of a module or class body binds: definitions, assignments, imports."""
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.name]
    if isinstance(node, ast.Assign):
        return [target.id for target in node.targets if isinstance(target, ast.Name)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
        return [node.target.id]
    if isinstance(node, ast.Import | ast.ImportFrom):
        return [(alias.asname or alias.name).split(".")[0] for alias in node.names]
    if isinstance(node, ast.If | ast.Try):  # TYPE_CHECKING blocks, optional imports
        return [name for child in [*node.body, *node.orelse] for name in defined_names(child)]
    return []


def unchecked_fences_blanked(markdown: str) -> str:
    """The page with every code block in another language than the shell's or Python's blanked, lines kept."""

    def blank(match: re.Match[str]) -> str:
        return match.group() if match.group(1) in CHECKED_FENCES else "\n" * match.group().count("\n")

    return FENCE.sub(blank, markdown)


def references(text: str) -> Iterator[tuple[int, str]]:
    """(line offset, reference) of every broken repository reference in `text`."""
    for offset, line in enumerate(text.splitlines()):
        line = URL.sub(" ", line)
        for match in PATH.finditer(line):
            if broken_path(match.group()):
                yield offset, match.group().rstrip(".")
        for span in BACKTICKED.findall(line):
            dotted = DOTTED.fullmatch(span.strip())
            if dotted and broken_dotted(dotted.group(1)):
                yield offset, dotted.group(1)


def broken_links(markdown: str, folder: Path) -> list[str]:
    """The targets of the page's links to the tree that lead nowhere from the page's folder."""
    targets = [target for target in LINK.findall(markdown) if not URL.match(target) and ":" not in target]
    return [target for target in targets if not (folder / target).exists()]


def python_prose(source: str) -> Iterator[tuple[int, str]]:
    """(first line, text) of every docstring (any string statement) and comment of a Python source."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            yield node.lineno, node.value.value
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def shell_comments(source: str) -> Iterator[tuple[int, str]]:
    """(line, text) of every `#` comment of a Dockerfile, YAML file or shell script."""
    for number, line in enumerate(source.splitlines(), start=1):
        comment = re.search(r"(?:^|\s)(#.*)", line)
        if comment:
            yield number, comment.group(1)


def is_python(path: str) -> bool:
    if path.endswith(".py"):
        return True
    first = (ROOT / path).read_text(errors="replace").split("\n", 1)[0]
    return first.startswith("#!") and "python" in first


def prose_files() -> list[str]:
    """Every tracked file whose prose is checked (recorded histories and results data are not prose)."""
    skip = ("tests/histories/",)
    return [
        path
        for path in tracked()
        if not path.startswith(skip)
        and (ROOT / path).is_file()
        and (
            path.endswith((".md", ".py", ".yml", ".yaml", ".toml"))
            or Path(path).name.startswith(("Dockerfile", ".env"))
            or path in ("run-tests", ".ci/run")
            or is_python(path)
        )
    ]


def broken_in(path: str) -> list[str]:
    source = (ROOT / path).read_text()
    found: list[str] = []
    if path.endswith(".md"):
        found += [f"{path}:{1 + offset}: {ref}" for offset, ref in references(unchecked_fences_blanked(source))]
        found += [f"{path}: link {target}" for target in broken_links(source, (ROOT / path).parent)]
        return found
    prose = python_prose(source) if is_python(path) else shell_comments(source)
    for line, text in prose:
        found += [f"{path}:{line + offset}: {ref}" for offset, ref in references(text)]
    return found


@pytest.mark.parametrize("path", prose_files())
def test_every_path_the_prose_names_exists(path: str) -> None:
    assert broken_in(path) == [], "a reference to a file or folder that is not in the tree"


def test_the_check_finds_a_missing_file_and_leaves_other_paths_alone() -> None:
    text = "\n".join(
        [
            "See DESIGN.md, invariant 2, and `corral/sandbox/engine.py`; the relay is in corral/streaming/.",
            "Run `python -m bench.nothing_here` and read `tests/test_gateway*.py` and `tests/nothing*.py`.",
            "Kept: /workspace/app/README.md, ~/.corral/stream.token, .corral/blobs/, $s/log, sessions/<id>/log/,",
            "https://example.com/docs/x.py, `sandbox/engine.py`, session.py, images/sandbox/, .ci/run.",
        ]
    )
    found = [reference for _, reference in references(text)]
    assert found == ["DESIGN.md", "corral/sandbox/engine.py", "corral/streaming/", "tests/nothing*.py"]
    page = '```hcl\npath "corral/data/*" {}\n```\n```sh\ncat corral/nothing.py\n```\n'
    assert [reference for _, reference in references(unchecked_fences_blanked(page))] == ["corral/nothing.py"]
    assert broken_links(
        "[ok](../bench/README.md) [gone](../operations.md) [web](https://x.example/a.md)", ROOT / "docs"
    ) == ["../operations.md"]
    assert broken_dotted("corral.client.fork_session") is False
    assert broken_dotted("corral.client.no_such_function") is True
    assert broken_dotted("workflow.patched") is None
    assert broken_dotted("corral.scope") is None, "a Docker label the code writes"


def test_the_readmes_development_table_names_every_top_level_package() -> None:
    """The table a newcomer reads for the layout lists exactly the packages `tests/test_layout.py` knows."""
    from tests.test_layout import PACKAGES

    development = (ROOT / "README.md").read_text().split("\n## Development", 1)[1].split("\n## ", 1)[0]
    named = re.findall(r"^\s*\| `(\w+)/` \|", development, flags=re.MULTILINE)
    assert sorted(named) == sorted({*PACKAGES, "tests"})
    assert {path.parent.name for path in ROOT.glob("*/__init__.py")} <= set(named)


def test_the_readme_links_every_page_of_docs() -> None:
    """The README is the front door: a page no link leads to is a page no newcomer finds."""
    linked = set(LINK.findall((ROOT / "README.md").read_text()))
    pages = {f"docs/{path.name}" for path in (ROOT / "docs").glob("*.md")}
    assert pages, "no page in docs/"
    assert pages - linked == set()
