"""corral's offline model server: a Messages-API-compatible deterministic stand-in, not a real model."""

from corral.modelserver.app import create_app
from corral.modelserver.scripts import Script, ScriptStep
from corral.modelserver.server import ModelServerThread

__all__ = ["ModelServerThread", "Script", "ScriptStep", "create_app"]
