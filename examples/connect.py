"""How the SDK examples reach corral's API: `CORRAL_API_URL` (default: the gateway `corral up` starts),
`CORRAL_API_KEY` (from `corral api-key create`) and `CORRAL_MODEL` (default: the offline stand-in;
claude-sonnet-4-6 when `corral up` had ANTHROPIC_API_KEY)."""

import os

import anthropic

MODEL = os.environ.get("CORRAL_MODEL", "corral-offline-stand-in")


def connect() -> anthropic.Anthropic:
    """The official SDK's client, pointed at corral's gateway."""
    api_url = os.environ.get("CORRAL_API_URL", "http://127.0.0.1:8780")
    return anthropic.Anthropic(base_url=api_url, api_key=os.environ["CORRAL_API_KEY"])
