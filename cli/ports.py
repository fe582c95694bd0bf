"""The ports `corral up` listens on: a warning for one the kernel may hand out to any outgoing connection, and a
"port taken" error that names the port, the option that moves it and, when this user may see it, what holds it.

Linux gives each outgoing TCP connection a local port from `net.ipv4.ip_local_port_range` (32768-60999 by
default). A server port chosen in that range is free until some process's connection happens to take it, e.g.
between `corral down` and `corral up`: so it is a warning, not a refusal, and the cure is a port below the range.
"""

from __future__ import annotations

from pathlib import Path

from cli.context import CliError

PORT_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
_TCP_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
_STATES = {"01": "an open connection", "06": "a closing connection (TIME_WAIT)", "0A": "a listening server"}


def ephemeral_range() -> tuple[int, int] | None:
    """The kernel's range of ports for outgoing connections, None where it cannot be read (not Linux)."""
    try:
        low, high = PORT_RANGE_FILE.read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return None


def ephemeral_warning(port: int, option: str) -> str | None:
    """What to tell a user whose chosen `port` lies in the ephemeral range; None when it does not."""
    found = ephemeral_range()
    if found is None or not found[0] <= port <= found[1]:
        return None
    return (
        f"port {port} ({option}) lies in the kernel's range for outgoing connections ({found[0]}-{found[1]}, "
        f"{PORT_RANGE_FILE}): any process's connection may take it while the stack is down, and the next "
        f"`corral up` then finds it taken; a port below {found[0]} avoids that"
    )


def taken(port: int, what: str, option: str) -> CliError:
    """The error for a port something else holds: the port, what should listen there, the option, the holder."""
    holder = port_holder(port)
    held = f" by {holder}" if holder else " by another program"
    hint = f"stop that program, or choose another port with {option}"
    found = ephemeral_range()
    if found is not None and found[0] <= port <= found[1]:
        hint += f", below {found[0]}: a port in the kernel's range for outgoing connections can be taken by any"
    return CliError(f"port {port} ({what}, set by {option}) is already in use{held}", hint=hint)


def port_holder(port: int) -> str | None:
    """Who holds local TCP `port`: "pid N (command), <a listening server / an open connection>" for a process of
    this user, "a socket of uid N (...)" for one whose /proc entries are hidden, None when none is found."""
    sockets: dict[str, tuple[str, str]] = {}  # inode -> (state, uid)
    for table in _TCP_TABLES:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and int(fields[1].rsplit(":", 1)[1], 16) == port:
                sockets[fields[9]] = (fields[3], fields[7])
    if not sockets:
        return None
    for inode, (state, _) in sockets.items():
        if inode != "0" and (pid := _pid_of(inode)) is not None:
            return f"pid {pid} ({_command(pid)}), {_STATES.get(state, 'a socket')}"
    state, uid = next(iter(sockets.values()))
    return f"a socket of uid {uid} ({_STATES.get(state, 'state ' + state)})"


def _pid_of(inode: str) -> int | None:
    target = f"socket:[{inode}]"
    for process in Path("/proc").iterdir():
        if not process.name.isdigit():
            continue
        try:
            for descriptor in (process / "fd").iterdir():
                if str(descriptor.readlink()) == target:
                    return int(process.name)
        except OSError:
            continue  # another user's process, or one that just exited
    return None


def _command(pid: int) -> str:
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return "?"
    return " ".join(part.decode(errors="replace") for part in argv if part)[:120]
