"""Webhook signing secrets, and the signed POST of one delivery: a plain library (no Temporal import).

A secret is `whsec_` and the base64 of 32 random bytes (the Standard Webhooks form the SDK's `unwrap` takes). It is
kept in Vault beside the credentials (`proxy.layout.webhook_secret_path`): the gateway writes it when an endpoint is
made or its secret rotated, through its write-only login, and shows it once; only the proxy, which sends, reads it.
A rotation replaces it: the previous secret signs nothing after it (no grace period), so a receiver updates its key
when it rotates, and a leaked secret stops working at once.

`WebhookSender.send` signs with the `standardwebhooks` library (`webhook-id` is the event id on every attempt, so a
receiver de-duplicates; `webhook-timestamp` is the attempt's time, which a receiver checks against replays) and
POSTs the event's payload. A 2xx is delivered; any other answer or no answer is a failure whose reason names the
status or the error's kind, never the body (a receiver may echo what it got) and never the secret.
"""

from __future__ import annotations

import base64
import json
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import httpx
from pydantic import SecretStr
from standardwebhooks.webhooks import Webhook

from proxy._kv import KvStore, safe_segment
from proxy.layout import webhook_secret_path

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32
SEND_TIMEOUT = httpx.Timeout(30.0, connect=10.0)
"""A receiver that has not answered in 30 s has failed this attempt; the next one comes after the back-off."""
USER_AGENT = "corral-webhooks/1"


def new_webhook_secret() -> SecretStr:
    """A fresh signing secret."""
    return SecretStr(SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode())


class WebhookSecretScope:
    """Webhook endpoints' signing secrets; mixed into `VaultStore`, which supplies `_kv`."""

    _kv: KvStore

    def store_webhook_secret(self, endpoint_id: str, secret: SecretStr) -> None:
        """Write (or replace: a rotation) an endpoint's secret. A writer that cannot read it back may call this."""
        path = webhook_secret_path(safe_segment(endpoint_id, "a webhook endpoint id"))
        self._kv.write(path, {"secret": secret.get_secret_value()})

    def destroy_webhook_secret(self, endpoint_id: str) -> None:
        """Destroy an endpoint's secret, every stored version of it (its endpoint was deleted). Idempotent."""
        self._kv.delete(webhook_secret_path(safe_segment(endpoint_id, "a webhook endpoint id")))

    def _webhook_secret(self, endpoint_id: str) -> SecretStr | None:
        """INTERNAL (for `WebhookSender`): the secret, or None when there is none."""
        found = self._kv.read(webhook_secret_path(safe_segment(endpoint_id, "a webhook endpoint id")))
        secret = None if found is None else found[0].get("secret")
        return SecretStr(secret) if isinstance(secret, str) and secret else None


@dataclass(frozen=True)
class SendOutcome:
    """One attempt's result: delivered, or the HTTP status (None when no answer came) and a reason."""

    delivered: bool
    status: int | None = None
    error: str | None = None


def signed_request(secret: SecretStr, event_id: str, payload: dict[str, Any],
                   at: datetime | None = None) -> tuple[bytes, dict[str, str]]:  # fmt: skip
    """The body and headers of one delivery, signed as Standard Webhooks says (also what the bench's baseline
    sends directly)."""
    body = json.dumps(payload, separators=(",", ":")).encode()
    moment = at or datetime.now(UTC)
    signature = Webhook(secret.get_secret_value()).sign(event_id, moment, body)
    headers = {
        "content-type": "application/json",
        "user-agent": USER_AGENT,
        "webhook-id": event_id,
        "webhook-timestamp": str(int(moment.timestamp())),
        "webhook-signature": signature,
    }
    return body, headers


class WebhookSender:
    """Signs and sends deliveries with the secrets in `secrets` (the proxy's `VaultStore`), over one HTTP pool."""

    def __init__(self, secrets: WebhookSecretScope, http: httpx.AsyncClient | None = None) -> None:
        self._secrets = secrets
        self._http = http or httpx.AsyncClient(timeout=SEND_TIMEOUT, follow_redirects=False)

    def secret_of(self, endpoint_id: str) -> SecretStr | None:
        """Blocking (hvac): call it off the event loop."""
        return self._secrets._webhook_secret(endpoint_id)

    async def send(self, secret: SecretStr, url: str, event_id: str, payload: dict[str, Any]) -> SendOutcome:
        body, headers = signed_request(secret, event_id, payload)
        try:
            response = await self._http.post(url, content=body, headers=headers)
        except httpx.TimeoutException as exc:
            return SendOutcome(False, None, f"no answer in time ({type(exc).__name__})")
        except httpx.HTTPError as exc:
            return SendOutcome(False, None, f"could not connect ({type(exc).__name__})")
        if 200 <= response.status_code < 300:
            return SendOutcome(True, response.status_code)
        return SendOutcome(False, response.status_code, f"the endpoint answered HTTP {response.status_code}")

    async def aclose(self) -> None:
        await self._http.aclose()
