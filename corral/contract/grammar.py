"""Narrow grammars for the strings that reach a command: mount paths, working directories, branch names and
repository URLs.

Commands take argv, never a shell string (sandbox/containers.py), so these grammars are a second fence,
not the only one: they refuse at the edge (the contract models, hence the HTTP API, the CLI and a Temporal client's
start) what no real repository or directory needs, such as quotes, `;`, `$`, whitespace, control characters, a
leading `-` or a `..` segment, so such a value never reaches a command at all. Each check returns the problem as a
sentence, or None.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit

WORKSPACE = "/workspace"
MAX_PATH_CHARS = 1024
MAX_SEGMENT_CHARS = 255
"""NAME_MAX of Linux file systems."""
MAX_BRANCH_CHARS = 255
MAX_URL_CHARS = 2048

_SEGMENT = re.compile(r"[A-Za-z0-9._-]+")
_BRANCH = re.compile(r"[A-Za-z0-9._/-]+")
_URL_PATH_SEGMENT = re.compile(r"[A-Za-z0-9._~%+-]+")
_HOST_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def segment_problem(segment: str) -> str | None:
    """Why `segment` is not a safe file name (letters, digits, `.`, `_`, `-`; not `.` or `..`), or None."""
    if not _SEGMENT.fullmatch(segment):
        return f"{segment!r} may hold only letters, digits, '.', '_' and '-'"
    if segment in (".", ".."):
        return f"{segment!r} is not a directory name"
    if len(segment) > MAX_SEGMENT_CHARS:
        return f"a path segment is at most {MAX_SEGMENT_CHARS} characters"
    return None


def workspace_path_problem(path: str, *, root_allowed: bool = False) -> str | None:
    """Why `path` is not `/workspace/` followed by safe segments (or `/workspace` itself, if `root_allowed`)."""
    if root_allowed and path == WORKSPACE:
        return None
    where = "/workspace or below it" if root_allowed else "below /workspace/"
    if not path.startswith(WORKSPACE + "/"):
        return f"must be {where} (the session's persistent volume)"
    if len(path) > MAX_PATH_CHARS:
        return f"is at most {MAX_PATH_CHARS} characters"
    for segment in path[len(WORKSPACE) + 1 :].split("/"):
        problem = segment_problem(segment) if segment else "empty segments ('//', a trailing '/') are not allowed"
        if problem is not None:
            return f"must be {where}, in segments of letters, digits, '.', '_' and '-': {problem}"
    return None


def branch_problem(name: str) -> str | None:
    """Why `name` is not a branch name corral passes to git: git's check-ref-format rules, in a safe charset."""
    if not name or len(name) > MAX_BRANCH_CHARS:
        return f"a branch name is 1 to {MAX_BRANCH_CHARS} characters"
    if not _BRANCH.fullmatch(name):
        return "a branch name may hold only letters, digits, '.', '_', '-' and '/'"
    if name.startswith("-"):
        return "a branch name must not start with '-'"
    if ".." in name or "//" in name or name.startswith("/") or name.endswith(("/", ".")):
        return "a branch name has no '..' or '//', and does not start with '/' or end with '/' or '.'"
    if any(part.startswith(".") or part.endswith(".lock") for part in name.split("/")):
        return "no part of a branch name starts with '.' or ends with '.lock'"
    return None


def _local_host(host: str) -> bool:
    """A host reached on this machine or a private network: loopback, private or link-local addresses,
    `localhost`, or a single-label name (such as a compose service)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host == "localhost" or "." not in host
    return address.is_loopback or address.is_private or address.is_link_local


def _host_problem(host: str) -> str | None:
    try:
        ipaddress.ip_address(host)
        return None
    except ValueError:
        pass
    labels = host.rstrip(".").split(".")
    if len(host) > 253 or not all(_HOST_LABEL.fullmatch(label) for label in labels):
        return f"{host!r} is not a host name"
    return None


def repository_url_problem(url: str) -> str | None:
    """Why `url` is not a repository URL corral clones: https (http only to a local or private host, whose
    traffic stays off the internet: the git proxy sends the token to it), no credentials, no query, and a path of
    plain segments."""
    if len(url) > MAX_URL_CHARS:
        return f"a repository url is at most {MAX_URL_CHARS} characters"
    if not all("\x21" <= char <= "\x7e" for char in url):
        return "a repository url holds no whitespace, control or non-ASCII characters (percent-encode them)"
    try:
        parts = urlsplit(url)
        host, _ = parts.hostname, parts.port  # the port is parsed here: a bad one raises
    except ValueError as exc:
        return f"not a url: {exc}"
    if parts.scheme not in ("https", "http") or not url.startswith(f"{parts.scheme}://"):
        return "a repository url starts with https://"
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        return "a repository url has no credentials in it: the token goes in authorization_token"
    if not host:
        return "a repository url names a host"
    problem = _host_problem(host)
    if problem is not None:
        return problem
    if parts.scheme == "http" and not _local_host(host):
        return (
            "a repository url on another network is https:// (http:// only to localhost, a private address or a "
            "single-label host): the git proxy sends the token to it"
        )
    if parts.query or parts.fragment or url.endswith(("?", "#")):
        return "a repository url has no query or fragment"
    segments = parts.path.removesuffix("/").split("/")[1:]
    if not segments or not all(_URL_PATH_SEGMENT.fullmatch(s) and s not in (".", "..") for s in segments):
        return "a repository url's path is one or more segments of letters, digits and '.', '_', '~', '%', '+', '-'"
    return None


def default_mount_name(url: str, fallback: str) -> str:
    """The directory a repository is cloned into when no mount path is given: the URL's last segment without
    `.git` when it is a safe file name, else `fallback` (the repository's id)."""
    name = url.rstrip("/").rsplit("/", 1)[-1].removesuffix(".git")
    return name if name and segment_problem(name) is None else fallback
