"""The suite's own rules, checked on its source: a test never skips, never sleeps for a fixed time to let something
happen (a pause inside a poll loop is fine), and never hands a server a port the kernel could give away meanwhile.
Each was broken once: a second-engine test skipped without dockerd, chaos tests slept "until the fault landed",
and a port from the ephemeral range was taken between `corral down` and `corral up`."""

from __future__ import annotations

import ast
import socket
from pathlib import Path

import pytest

from tests.ports import closed_port, ephemeral_range, free_port, free_port_pair

TESTS = Path(__file__).resolve().parent
SOURCES = sorted(path for path in TESTS.rglob("*.py") if "histories" not in path.parts)
SKIPS = {"skip", "skipif", "importorskip", "xfail"}
LOOPS = (ast.For, ast.AsyncFor, ast.While)


def where(path: Path, node: ast.AST) -> str:
    shown = path.relative_to(TESTS.parent) if path.is_relative_to(TESTS.parent) else path
    return f"{shown}:{getattr(node, 'lineno', '?')}"


def tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text(), filename=str(path))


def test_no_test_skips() -> None:
    """Something a test needs that is absent is installed, or the test fails saying what is missing."""
    found = [
        where(path, node)
        for path in SOURCES
        for node in ast.walk(tree(path))
        if isinstance(node, ast.Attribute) and node.attr in SKIPS and "pytest" in ast.unparse(node.value)
    ]
    assert found == []


def _fixed_sleeps(path: Path) -> list[str]:
    """`asyncio.sleep(n)` or `time.sleep(n)` with a constant n > 0 outside any loop."""
    found: list[str] = []

    def visit(node: ast.AST, in_loop: bool) -> None:
        if (
            isinstance(node, ast.Call)
            and ast.unparse(node.func) in ("asyncio.sleep", "time.sleep")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, int | float)
            and node.args[0].value > 0
            and not in_loop
        ):
            found.append(where(path, node))
        for child in ast.iter_child_nodes(node):
            visit(child, in_loop or isinstance(node, LOOPS))

    visit(tree(path), False)
    return found


def test_no_test_sleeps_to_let_something_happen() -> None:
    """A test waits for what it can observe (`tests/waits.py`): a fixed sleep passes on a fast machine without the
    fault landing where the test says, and fails on a loaded one."""
    assert [place for path in SOURCES for place in _fixed_sleeps(path)] == []


def test_the_sleep_rule_tells_a_poll_from_a_fixed_sleep(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import asyncio\n"
        "async def f(ready):\n"
        "    while not ready():\n"
        "        await asyncio.sleep(0.1)\n"
        "    await asyncio.sleep(0)\n"
        "    await asyncio.sleep(0.3)  # the fault has probably landed\n"
    )
    assert [place.rsplit(":", 1)[1] for place in _fixed_sleeps(sample.resolve())] == ["6"]


def test_only_the_ports_helper_binds_port_zero() -> None:
    """A port the kernel picked (bind to port 0) lies in its ephemeral range, where any outgoing connection may take
    it before the server it was meant for binds it: tests take ports from `tests/ports.py`."""
    found = [
        where(path, node)
        for path in SOURCES
        if path.name != "ports.py"
        for node in ast.walk(tree(path))
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "bind"
        and node.args
        and isinstance(node.args[0], ast.Tuple)
        and len(node.args[0].elts) == 2
        and isinstance(node.args[0].elts[1], ast.Constant)
        and node.args[0].elts[1].value == 0
    ]
    assert found == []


def test_free_ports_lie_below_the_ephemeral_range_and_are_free() -> None:
    low, _ = ephemeral_range()
    ports = [free_port() for _ in range(50)]
    assert all(port < low for port in ports), ports
    assert len(set(ports)) == len(ports), "a port is handed out once per process"
    for port in ports[:5]:
        with socket.socket() as server:
            server.bind(("127.0.0.1", port))  # nothing holds it
    pair = free_port_pair()
    assert pair + 1 < low
    for port in (pair, pair + 1):
        with socket.socket() as server:
            server.bind(("127.0.0.1", port))


def test_a_closed_port_refuses_connections_while_it_is_held() -> None:
    with closed_port() as port:
        with socket.socket() as client, pytest.raises(ConnectionRefusedError):
            client.connect(("127.0.0.1", port))
        with socket.socket() as other, pytest.raises(OSError):
            other.bind(("127.0.0.1", port))  # no other server can start listening there meanwhile
