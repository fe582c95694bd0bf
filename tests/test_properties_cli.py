"""Property tests (hypothesis) of the `corral` CLI: whatever a user types (garbage ids, negative and huge numbers,
NUL characters, unicode, text that is not UTF-8, files that are missing, empty, binary, not JSON, nested a thousand
deep), every command that takes input exits 0, or 1 or 2 with an error message: never a Python traceback.

Run in process through typer's CliRunner, twice: with nothing listening at the Temporal address (and no Vault), and
against the real Temporal dev server with a real session served by real workers.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner, Result

from cli.main import app
from corral.contract.events import EVENT_TYPES
from corral.contract.threads import primary_thread_id
from tests.conftest import Stack, wait_for_idle
from tests.ports import free_port

runner = CliRunner()


def nested(depth: int) -> Any:
    value: Any = {}
    for _ in range(depth):
        value = {"a": value}
    return value


HOSTILE_FILES: dict[str, bytes | None] = {
    "missing.json": None,
    "empty.json": b"",
    "binary.json": b"\x00\xff\xfe\x80 not utf-8",
    "not-json.json": b"{agent: ",
    "array.json": b"[1, 2]",
    "nul.json": b'{"agent": {"model": "m\\u0000"}, "title": "\\u0000"}',
    "surrogate.json": b'{"agent": {"model": "m", "system": "lone \\ud800"}}',
    "surrogate-key.json": b'{"agent": {"model": "m"}, "metadata": {"\\udcff": "v"}}',
    "deep.json": json.dumps({"agent": {"model": "m", "tools": [{"type": "custom", "name": "t",
                                                                "input_schema": nested(300)}]}}).encode(),
    "too-deep.json": b"[" * 5000 + b"]" * 5000,
    "bad-field.json": b'{"agent": {"model": "m", "max_tokens": -1}, "colour": "red"}',
    "huge-int.json": b'{"agent": {"model": "m", "max_tokens": 1' + b"0" * 400 + b"}}",
    "nan.json": b'{"agent": {"model": "m", "tools": [{"type": "custom", "name": "t", "input_schema": {"x": NaN}}]}}',
    "agent.json": b'{"model": "m", "system": "fine"}',
    "valid.json": b'{"agent": {"model": "m"}, "title": "t"}',
    "big.json": json.dumps({"agent": {"model": "m", "system": "x" * 3_000_000}}).encode(),
    "token.txt": b"secret-canary-token\n",
    "blank-token.txt": b"\n\n",
}  # fmt: skip


@pytest.fixture(scope="module")
def hostile_files(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hostile")
    for name, data in HOSTILE_FILES.items():
        if data is not None:
            (folder / name).write_bytes(data)
    (folder / "a-directory").mkdir()
    return folder


TEXT = st.one_of(
    st.text(max_size=20),
    st.sampled_from(["", " ", "-", "--", "\x00", "a\x00b", "\udcff", "x\ud800y", "\u202e\x1b[2J", "💥" * 3, "é"]),
    st.just("x" * 100_000),
)
NUMBERS = st.one_of(
    st.integers(min_value=-(10**30), max_value=10**30).map(str),
    st.sampled_from(["0", "-1", "1e9", "0x10", "NaN", "inf", "", "1" + "0" * 400, " 5", "٣"]),
)


def session_ids(real: list[str]) -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(real or ["sesn_nothing"]), TEXT, TEXT.map(lambda tail: "sesn_" + tail))


def thread_ids(real: list[str]) -> st.SearchStrategy[str]:
    primaries = [primary_thread_id(session) for session in real] or ["sthr_" + "0" * 32]
    return st.one_of(st.sampled_from(primaries), TEXT, TEXT.map(lambda tail: "sthr_" + tail))


def files(folder: Path) -> st.SearchStrategy[str]:
    names = [*HOSTILE_FILES, "a-directory", "no/such/dir/out.jsonl"]
    return st.one_of(st.sampled_from(names).map(lambda name: str(folder / name)), st.sampled_from(["-", "", "\x00"]))


def commands(real: list[str], folder: Path, *, follow: bool) -> st.SearchStrategy[list[str]]:
    """Argument lists for every command that takes user input (never `tail --forever` or `start --follow`: those
    wait for more on purpose)."""
    ids, numbers, paths, threads = session_ids(real), NUMBERS, files(folder), thread_ids(real)
    types = st.lists(st.one_of(st.sampled_from(sorted(EVENT_TYPES)), TEXT), max_size=3)
    flag = st.booleans()

    def option(name: str, values: st.SearchStrategy[str]) -> st.SearchStrategy[list[str]]:
        return st.one_of(st.just([]), values.map(lambda value: [name, value]))

    def join(*parts: st.SearchStrategy[list[str]]) -> st.SearchStrategy[list[str]]:
        return st.tuples(*parts).map(lambda lists: [arg for part in lists for arg in part])

    def one(values: st.SearchStrategy[str]) -> st.SearchStrategy[list[str]]:
        return values.map(lambda value: [value])

    events = join(
        st.just(["events"]),
        one(ids),
        option("--after", numbers),
        option("--limit", numbers),
        types.map(lambda ts: [arg for t in ts for arg in ("--type", t)]),
        flag.map(lambda on: ["--json"] if on else []),
        option("--thread", threads),
    )
    return st.one_of(
        join(
            st.just(["start"]),
            st.one_of(st.just([]), one(TEXT)),
            option("--model", TEXT),
            option("--system", TEXT),
            option("--title", TEXT),
            option("--input", paths),
            option("--vault", TEXT),
            st.one_of(st.just([]), join(option("--repo", TEXT), option("--repo-token-file", paths))),
        ),
        join(st.just(["send"]), one(ids), one(TEXT), st.just(["--follow"] if follow else [])),
        join(st.just(["interrupt"]), one(ids)),
        events,
        join(
            st.just(["tail"]),
            one(ids),
            option("--after", st.sampled_from(["0", "-1", "x", "1" + "0" * 40])),
            option("--thread", threads),
        ),
        join(st.just(["threads"]), one(st.one_of(ids, threads)), flag.map(lambda on: ["--json"] if on else [])),
        join(st.just(["runs"]), one(st.one_of(ids, threads)), flag.map(lambda on: ["--json"] if on else [])),
        join(st.just(["ls"]), option("--limit", numbers), option("--status", TEXT)),
        join(st.just(["context"]), one(ids), option("--last", numbers)),
        join(st.just(["fork"]), one(ids), option("--at", numbers), option("--agent", paths)),
        join(st.just(["export"]), one(ids), option("--output", paths)),
        join(st.just(["output"]), one(ids), one(TEXT), option("--output", paths)),
        join(st.just(["vault", "create"]), one(TEXT)),
        join(st.just(["vault", "ls"]), st.one_of(st.just([]), one(TEXT))),
        join(
            st.just(["vault", "add-credential"]),
            one(TEXT),
            option("--mcp-server-url", TEXT),
            option("--kind", st.sampled_from(["static_bearer", "mcp_oauth", "x"])),
            option("--token-file", paths),
            option("--expires-at", TEXT),
        ),
    )


def check(result: Result, argv: list[str]) -> None:
    """Exit 0, or 1 or 2 with a message that says it is an error; never a traceback."""
    shown = f"corral {' '.join(repr(arg)[:80] for arg in argv)}\n{result.output[-3000:]}"
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"{type(result.exception).__name__}: {result.exception!s:.500}\n{shown}") from (
            result.exception
        )
    assert "Traceback" not in result.output, shown
    assert result.exit_code in (0, 1, 2), shown
    if result.exit_code:
        assert "error" in result.output.lower(), shown


@contextlib.contextmanager
def environment(vault_port: int) -> Iterator[dict[str, str]]:
    """Nothing answers at the Vault address: vault commands and `--repo` meet a Vault that is down."""
    yield {"VAULT_ADDR": f"http://127.0.0.1:{vault_port}", "VAULT_TOKEN": "canary-not-a-token"}


NOT_UTF8 = "\udcff"
"""What Python makes of an argument that is not valid UTF-8 (`corral send S $'\\xff'`)."""


@example(argv=["send", "sesn_x", NOT_UTF8]).via("text that is not UTF-8")
@example(argv=["start", "--input", "surrogate.json"]).via("a start input with a lone surrogate escape")
@example(argv=["start", "--input", "deep.json"]).via("an input schema nested 300 deep")
@example(argv=["start", "--input", "binary.json"]).via("an input file that is not UTF-8")
@example(argv=["start", "--input", "too-deep.json"]).via("JSON nested past Python's recursion limit")
@example(argv=["fork", "sesn_x", "--at", "1", "--agent", "binary.json"]).via("an agent file that is not UTF-8")
@example(argv=["events", "sesn_x", "--after", "1" + "0" * 30]).via("an integer past 64 bits")
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(argv=st.data())
def test_with_nothing_running_every_command_exits_with_a_message(
    argv: Any, hostile_files: Path, tmp_path: Path
) -> None:
    """No Temporal at the address, no Vault: each command says so (or what else is wrong with its input)."""
    if isinstance(argv, list):  # an explicit example: file names are relative to the hostile files' folder
        args = [str(hostile_files / arg) if arg in HOSTILE_FILES else arg for arg in argv]
    else:
        args = argv.draw(commands([], hostile_files, follow=False), label="argv")
    with environment(free_port()) as env:
        address = f"127.0.0.1:{free_port()}"
        result = runner.invoke(app, ["--state-dir", str(tmp_path / "state"), "--address", address, *args], env=env)
    check(result, args)


async def test_against_a_running_session_every_command_answers_or_exits_with_a_message(
    stack: Stack, hostile_files: Path, tmp_path: Path
) -> None:
    """The real server, a real idle session served by real workers: commands that name it answer (a send is
    answered by the model); every other input is refused with a message."""
    model = stack.script([{"text": "fine"}], loop=True)
    handle = await stack.start(model, message="hello")
    await wait_for_idle(handle)
    address = stack.client.service_client.config.target_host
    started: list[str] = []

    @example(argv=["send", handle.id, NOT_UTF8]).via("text that is not UTF-8, to a real session")
    @example(argv=["fork", handle.id, "--at", "1", "--agent", "deep.json"]).via("an agent nested 300 deep")
    @example(argv=["fork", handle.id, "--at", "1" + "0" * 30]).via("a position past 64 bits")
    @example(argv=["events", handle.id, "--after", "1" + "0" * 30, "--limit", "1" + "0" * 30]).via("huge numbers")
    @example(argv=["start", "--input", "big.json"]).via("a 3 MB system prompt")
    @example(argv=["export", handle.id, "--output", "-"]).via("`-o -` wrote a file named '-'")
    @settings(max_examples=100, deadline=None)
    @given(argv=st.data())
    def each(argv: Any) -> None:
        if isinstance(argv, list):  # an explicit example
            args = [str(hostile_files / arg) if arg in HOSTILE_FILES else arg for arg in argv]
        else:
            args = argv.draw(commands([handle.id], hostile_files, follow=True), label="argv")
        with environment(free_port()) as env:
            argv = ["--state-dir", str(tmp_path / "state"), "--address", address, *args]
            result = runner.invoke(app, argv, env=env)
        assert not Path("-").exists(), "`-o -` writes to stdout, not to a file named '-'"
        if args[0] in ("start", "fork") and result.exit_code == 0:
            started.extend(line.strip() for line in result.stdout.splitlines() if line.startswith("sesn_"))
        check(result, args)

    try:
        # In a thread: this event loop runs the workers that answer the CLI.
        await asyncio.to_thread(each)
    finally:
        for session_id in started:
            with contextlib.suppress(Exception):
                await stack.client.get_workflow_handle(session_id).terminate("test finished")
