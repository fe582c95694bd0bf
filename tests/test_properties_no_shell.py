"""Property tests (hypothesis): shell metacharacters thrown at every field that reaches a command.

Each field is either refused at the edge, by the contract model (the Temporal start input, the update validators,
the CLI) or by the gateway's resource shapes, with the field named; or, when accepted, it reaches its command as one
whole argv element of a command that no shell parses (or, where a fixed script is run, only as one of the script's
positional arguments, never in its text). The argv builders are pure functions, tested as such.

Fields: a repository's url, repository_id, mount_path and checkout branch (the clone in the sandbox); the
environment's working_dir (mkdir) and packages (the derived image's RUN lines); a bash call's id (the output
reader); the grep tool's pattern and path (ripgrep, in the sandbox's runner).
"""

from __future__ import annotations

import json
from importlib.machinery import SourceFileLoader
from importlib.util import module_from_spec, spec_from_loader
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from corral.contract.grammar import branch_problem, workspace_path_problem
from corral.contract.proxy import GitRepositoryResource
from corral.contract.sandbox import Environment, Packages, RepositoryClone
from corral.contract.session import SessionInput
from gateway.errors import ApiError
from gateway.repositories import session_repositories
from sandbox.commands import (
    call_output_command,
    clone_commands,
    packages_dockerfile,
    working_dir_command,
)
from sandbox.errors import SandboxError, SandboxSetupError

ISSUE_PAYLOAD = '/workspace/x"; touch /tmp/pwn; echo "'
"""The mount path of issue 22: accepted before, and run in the sandbox."""
SHELLS = {"sh", "bash", "/bin/sh", "/bin/bash", "dash", "zsh"}
PROXY = "http://172.17.0.1:8391"
URL = "https://git.example.com/acme/app.git"

METACHARACTERS = [";", "|", "&", "&&", "$(id)", "${IFS}", "`id`", "'", '"', "\\", "\n", "\r", "\t", "\0", " ",
                  "<", ">", ">>", "*", "?", "[", "]", "{", "}", "(", ")", "#", "~", "!", "=", "%", "@{", "..",
                  "//", "-", "--", "-rf", "--upload-pack=touch /tmp/pwn", "é", "\u202e", "\u2028", "\ufeff", "\uff58",
                  "\x1b[31m", "/..", "/.", ".lock", "@", ":", ","]  # fmt: skip
SAFE_PIECES = ["a", "app", "x", "1", ".", "_", "-", "/", "main", "feature", "v2.0", "src"]


def hostile(prefix: str = "") -> st.SearchStrategy[str]:
    """`prefix` and then a mix of metacharacters, safe pieces and arbitrary unicode: the issue's payload among them."""
    piece = st.one_of(st.sampled_from(METACHARACTERS), st.sampled_from(SAFE_PIECES), st.text(max_size=4))
    return st.lists(piece, max_size=8).map(lambda pieces: prefix + "".join(pieces))


def _located(exc: ValidationError, *location: str | int) -> bool:
    """Whether some error of `exc` is at `location` (the field named)."""
    return any(tuple(error["loc"][: len(location)]) == location for error in exc.errors())


def _one_element(argv: list[str], value: str) -> None:
    """`value` is one whole element of `argv`, and `argv` is not a shell's."""
    assert argv[0] not in SHELLS, argv
    assert value in argv, (value, argv)


def _clone(resource: GitRepositoryResource, reference: str = "pxr_abc-DEF_123") -> RepositoryClone:
    """What the workflow hands the sandbox for a resource (workflows/_mcp.py `clones`)."""
    checkout = resource.checkout.ref() if resource.checkout else None
    return RepositoryClone(
        repository_id=resource.repository_id, reference=reference, mount_path=resource.mount(), checkout=checkout
    )


def _check_clone(resource: GitRepositoryResource) -> None:
    clone = _clone(resource)
    commands = clone_commands(clone, PROXY)
    mount = clone.mount_path
    assert workspace_path_problem(mount) is None, mount
    assert commands.present == ["test", "-d", f"{mount}/.git"]
    _one_element(commands.clone, mount)
    origin = f"{PROXY}/{clone.reference}/{clone.repository_id}"
    assert commands.clone == ["git", "clone", "--quiet", "--", origin, mount]
    if clone.checkout:
        assert commands.checkout == ["git", "-C", mount, "checkout", "--quiet", clone.checkout, "--"]
        assert not clone.checkout.startswith("-"), "a ref after which git reads no option"
    else:
        assert commands.checkout is None


def _gateway_refuses(resource: dict[str, Any], field: str) -> bool:
    """Whether the gateway's resource shape refuses `resource` naming `resources[0].<field>` (with a 400)."""
    try:
        shape = {key: value for key, value in resource.items() if key != "repository_id"}  # the gateway sets it
        session_repositories([{**shape, "authorization_token": "t0k"}])
    except ApiError as exc:
        assert exc.status == 400, exc
        assert str(exc).startswith(f"resources[0].{field}"), (field, str(exc))
        return True
    return False


@settings(max_examples=300, deadline=None)
@given(hostile("/workspace/"))
@example(ISSUE_PAYLOAD)
@example("/workspace/a\nb")
@example("/workspace/a\0b")
@example("/workspace/../etc")
@example("/workspace/-rf")
@example("/workspace/$(touch /tmp/pwn)")
@example("/workspace/`id`")
@example("/workspace/ok.dir/sub-1_2")
def test_mount_path_is_refused_naming_it_or_one_argv_element(mount_path: str) -> None:
    resource = {"type": "github_repository", "url": URL, "repository_id": "repo1", "mount_path": mount_path}
    try:
        checked = GitRepositoryResource.model_validate(resource)
    except ValidationError as exc:
        assert _located(exc, "mount_path"), exc
        assert _gateway_refuses(resource, "mount_path")
        with pytest.raises(ValidationError, match=r"resources\.0\.mount_path"):
            SessionInput.model_validate({"agent": {"model": "m"}, "resources": [resource]})
        with pytest.raises(SandboxSetupError, match="mount_path"):  # nor would the sandbox run it, were it recorded
            clone_commands(RepositoryClone(repository_id="repo1", reference="pxr_x", mount_path=mount_path), PROXY)
        return
    assert not _gateway_refuses(resource, "mount_path")
    assert checked.mount() == mount_path
    _check_clone(checked)


@settings(max_examples=300, deadline=None)
@given(hostile())
@example("main")
@example("feature/x-1.0")
@example("--orphan")
@example("-b")
@example("main; touch /tmp/pwn")
@example("a..b")
@example("@{-1}")
@example("x.lock")
@example("x/")
@example("$(id)")
def test_branch_is_refused_naming_it_or_one_argv_element(name: str) -> None:
    resource = {"type": "github_repository", "url": URL, "repository_id": "repo1",
                "checkout": {"type": "branch", "name": name}}  # fmt: skip
    try:
        checked = GitRepositoryResource.model_validate(resource)
    except ValidationError as exc:
        assert _located(exc, "checkout", "name"), exc
        assert _gateway_refuses(resource, "checkout.name")
        with pytest.raises(SandboxSetupError, match="checkout"):
            clone_commands(RepositoryClone(repository_id="r", reference="pxr_x", mount_path="/workspace/a",
                                           checkout=name), PROXY)  # fmt: skip
        return
    assert branch_problem(name) is None
    _check_clone(checked)


@settings(max_examples=300, deadline=None)
@given(st.one_of(hostile("https://git.example.com/"), hostile("http://127.0.0.1:8080/"), hostile()))
@example("https://git.example.com/a/b.git")
@example("http://127.0.0.1:9/app.git")
@example("https://git.example.com/..")
@example("https://git.example.com/a/$(id)")
@example("https://user:pw@git.example.com/a.git")
@example("-https://git.example.com/a.git")
@example("https://git.example.com/a.git?x=1")
@example("https://git.example.com/a b.git")
@example("https://git.example.com/a%20b.git")
@example("http://git.example.com/a.git")
@example("ext::sh -c touch% /tmp/pwn")
@example("file:///etc")
def test_url_is_refused_naming_it_or_makes_a_safe_clone(url: str) -> None:
    resource = {"type": "github_repository", "url": url, "repository_id": "repo1"}
    try:
        checked = GitRepositoryResource.model_validate(resource)
    except ValidationError as exc:
        assert _located(exc, "url"), exc
        assert _gateway_refuses(resource, "url")
        return
    assert url.startswith(("https://", "http://")) and all("\x21" <= c <= "\x7e" for c in url), url
    assert not any(c in url for c in "\"'`$;|&<>\\ "), url
    _check_clone(checked)  # the default mount comes from the url: it is safe too


@settings(max_examples=200, deadline=None)
@given(st.one_of(hostile(), st.sampled_from(["repo1", "a" * 65, "-x", "a b", "a;b", "é"])))
def test_repository_id_is_refused_naming_it_or_one_argv_element(repository_id: str) -> None:
    resource = {"type": "github_repository", "url": URL, "repository_id": repository_id}
    try:
        checked = GitRepositoryResource.model_validate(resource)
    except ValidationError as exc:
        assert _located(exc, "repository_id"), exc
        return
    _check_clone(checked)


@settings(max_examples=300, deadline=None)
@given(st.one_of(hostile("/workspace/"), hostile("/workspace"), hostile()))
@example("/workspace")
@example("/workspace/project")
@example("/workspace/../etc")
@example('/workspace/x"; touch /tmp/pwn; echo "')
def test_working_dir_is_refused_naming_it_or_one_argv_element(working_dir: str) -> None:
    try:
        environment = Environment.model_validate({"working_dir": working_dir})
    except ValidationError as exc:
        assert _located(exc, "working_dir"), exc
        return
    assert workspace_path_problem(environment.working_dir, root_allowed=True) is None
    argv = working_dir_command(environment.working_dir)
    _one_element(argv, working_dir)
    assert argv == ["mkdir", "-p", "--", working_dir]


def _run_lines(dockerfile: str) -> list[list[str]]:
    """Every RUN line of the Dockerfile, which must each be in exec form (a JSON argv)."""
    runs = [line.removeprefix("RUN ") for line in dockerfile.splitlines() if line.startswith("RUN")]
    return [json.loads(run) for run in runs]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(["apt", "pip"]), st.lists(st.one_of(hostile(), hostile("jq")), min_size=1, max_size=3))
@example("apt", ["jq; rm -rf /"])
@example("apt", ["jq>/etc/x"])
@example("pip", ["requests>=2.0", "x<3"])
@example("pip", ["$(touch /tmp/pwn)"])
def test_package_names_are_refused_naming_them_or_positional_arguments(kind: str, names: list[str]) -> None:
    try:
        environment = Environment.model_validate({"packages": {kind: names}})
    except ValidationError as exc:
        assert _located(exc, "packages", kind), exc
        return
    dockerfile = packages_dockerfile("corral-sandbox:test", environment.packages)
    runs = _run_lines(dockerfile)
    assert len(runs) == (1 if kind == "apt" else 2)
    fixed = _run_lines(packages_dockerfile("corral-sandbox:test", Packages(pip=["x"])))
    for argv, reference in zip(runs, fixed, strict=False):
        assert argv[:4] == reference[:4], "the same fixed script, whatever the names"
    assert runs[-1][4:] == sorted(set(names)), "each name is one positional argument"


@settings(max_examples=300, deadline=None)
@given(st.one_of(hostile(), hostile("toolu_")))
@example("toolu_01ABC")
@example("../../etc/passwd")
@example("x; touch /tmp/pwn")
@example("$(id)")
def test_call_id_is_refused_or_the_fixed_scripts_argument(call_id: str) -> None:
    try:
        argv = call_output_command(call_id)
    except SandboxError:
        assert call_id in ("", ".", "..") or "/" in call_id or "\0" in call_id
        return
    assert argv[:2] == ["sh", "-c"] and argv[2] == call_output_command("fixed")[2], "the script is fixed text"
    assert argv[3:] == ["output", call_id]


def _runner() -> ModuleType:
    """The sandbox's resident runner (images/sandbox/tools/corral-runner), loaded as a module for its pure parts."""
    path = Path(__file__).resolve().parents[1] / "images" / "sandbox" / "tools" / "corral-runner"
    loader = SourceFileLoader("corral_runner", str(path))
    spec = spec_from_loader("corral_runner", loader)
    assert spec is not None
    module = module_from_spec(spec)
    loader.exec_module(module)
    return module


RUNNER = _runner()


@settings(max_examples=300, deadline=None)
@given(hostile(), st.one_of(hostile(), hostile("/")))
@example("-e", "--pre=sh")
@example("--pre=touch /tmp/pwn", "-x")
def test_grep_pattern_and_path_are_one_argv_element_each(pattern: str, path: str) -> None:
    base = RUNNER.resolve(path or ".", Path("/workspace"))
    argv = RUNNER.grep_command(pattern, base)
    assert argv[0] == "rg"
    assert argv[argv.index("-e") + 1] == pattern, "the pattern follows -e: never an option"
    assert argv[-2:] == ["--", str(base)], "the path follows --: never an option"
