"""One OpenBao dev server for the whole test run, shared by every proxy test module.

Each test module wraps `shared_dev_vault()` in its own session-scoped fixture; the cache here makes them one
server (started on first use, stopped at interpreter exit by `start_dev_vault`'s exit hook), on ports outside the
kernel's ephemeral range (`tests/ports.py`)."""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

from proxy.devvault import DevVault, start_dev_vault
from tests.ports import free_port_pair


@functools.cache
def shared_dev_vault() -> DevVault:
    return start_dev_vault(Path(tempfile.mkdtemp(prefix="corral-devvault-")), port=free_port_pair())


def scan_for(secrets: list[str], *texts: str) -> list[str]:
    """The secrets that appear in any of the texts (an empty list is the only passing answer)."""
    return [secret for secret in secrets if any(secret in text for text in texts)]
