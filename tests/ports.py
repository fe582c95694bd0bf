"""Ports for the servers tests start in other processes, chosen below the kernel's ephemeral range.

A port the kernel handed out for `bind(("127.0.0.1", 0))` lies in the ephemeral range
(`/proc/sys/net/ipv4/ip_local_port_range`, 32768-60999 by default), the range it also takes the source port of every
outgoing connection from. Between choosing such a port and a server binding it (or between `corral down` and
`corral up`), any process's outgoing connection may take it. Below the range only listeners compete, so a port
checked free here stays free until our server binds it. The choice is random, so runs by different people on one
machine rarely pick the same port; one process never hands out a port twice.

A server in the test process itself binds port 0 and reports its port (`corral.serving.ServerThread`); `closed_port`
gives a port on which nothing can listen while the test holds it.
"""

from __future__ import annotations

import random
import socket
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

LOWEST = 20000
"""Below this lie well-known defaults (Temporal 7233, the UI 8233, OpenBao 8200, ...)."""
HIGHEST = 32000
_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_given: set[int] = set()


def ephemeral_range() -> tuple[int, int]:
    """The kernel's range for ports it picks itself (outgoing connections, `bind` to port 0)."""
    low, high = _RANGE_FILE.read_text().split()
    return int(low), int(high)


def candidate_ports() -> range:
    """Where `free_port` looks: from `LOWEST` up to `HIGHEST` or the ephemeral range's start, whichever is lower."""
    low, _ = ephemeral_range()
    top = min(HIGHEST, low - 1)
    if top - LOWEST < 1000:
        raise AssertionError(
            f"the kernel's ephemeral port range starts at {low} ({_RANGE_FILE}): tests need ports {LOWEST}-{HIGHEST} "
            "outside it; set net.ipv4.ip_local_port_range to start at 32768 or above"
        )
    return range(LOWEST, top + 1)


def is_free(port: int) -> bool:
    """Nothing is bound to `port` on any IPv4 address (a wildcard bind conflicts with every listener on it)."""
    with socket.socket() as probe:
        try:
            probe.bind(("0.0.0.0", port))
        except OSError:
            return False
    return True


def free_port() -> int:
    """A port outside the ephemeral range that nothing is bound to now and that this process has not handed out."""
    candidates = candidate_ports()
    for _ in range(500):
        port = random.choice(candidates)
        if port not in _given and is_free(port):
            _given.add(port)
            return port
    raise AssertionError(f"no free port in {candidates.start}-{candidates.stop - 1} after 500 tries")


def free_port_pair() -> int:
    """A free port whose successor is free too (OpenBao's dev server binds its cluster listener on port + 1)."""
    for _ in range(500):
        port = free_port()
        if port + 1 in candidate_ports() and port + 1 not in _given and is_free(port + 1):
            _given.add(port + 1)
            return port
    raise AssertionError("no pair of free ports outside the ephemeral range after 500 tries")


@contextmanager
def closed_port() -> Iterator[int]:
    """A port bound (not listening) by the test for as long as the block runs: a connection to it is refused, and
    no other process can start listening there meanwhile."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        yield int(held.getsockname()[1])


@contextmanager
def listening_ephemeral_port() -> Iterator[int]:
    """A port the kernel picked from its ephemeral range, listened on by the test for as long as the block runs:
    what a user meets when another process holds a port they named (`corral up`'s taken-port message)."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield int(held.getsockname()[1])
