"""corral's offline model server: a Messages-API-compatible deterministic stand-in, not a real model."""

from modelserver.app import create_app
from modelserver.scripts import Script, ScriptStep
from modelserver.server import ModelServerThread

__all__ = ["ModelServerThread", "Script", "ScriptStep", "create_app"]
