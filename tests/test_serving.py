"""corral's HTTP servers keep an idle connection longer than any client of theirs does, so a client never sends a
request on a connection its server is closing (corral/serving.py `KEEP_ALIVE_SECONDS`)."""

from __future__ import annotations

import re
from pathlib import Path

import anthropic
import httpx
from starlette.applications import Starlette

from activities.model import KEEPALIVE_SECONDS
from corral.serving import KEEP_ALIVE_SECONDS, ServerThread

ROOT = Path(__file__).resolve().parents[1]
SERVERS = ("gateway/__main__.py", "relay/__main__.py", "modelserver/__main__.py", "corral/serving.py")


def test_a_server_keeps_an_idle_connection_longer_than_its_clients_do() -> None:
    server = ServerThread(Starlette())
    server.start()
    try:
        assert server._server is not None
        kept = server._server.config.timeout_keep_alive
    finally:
        server.stop()
    clients = {
        "the model worker's pool to the model (activities/model.py)": KEEPALIVE_SECONDS,
        "httpx's default": httpx.Limits().keepalive_expiry,
        "the anthropic SDK's default": anthropic.DEFAULT_CONNECTION_LIMITS.keepalive_expiry or 5.0,
    }
    assert kept == KEEP_ALIVE_SECONDS
    assert all(kept > seconds for seconds in clients.values() if seconds is not None), (kept, clients)


def test_every_server_of_corral_takes_its_configuration_from_one_place() -> None:
    for path in SERVERS:
        text = (ROOT / path).read_text()
        assert "uvicorn_config(" in text, f"{path} does not build its server with corral.serving.uvicorn_config"
        outside = [m.group(0) for m in re.finditer(r"uvicorn\.(Config|run)\(", text)]
        assert outside == ([] if path != "corral/serving.py" else ["uvicorn.Config("]), (path, outside)
