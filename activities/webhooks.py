"""The webhook activity of the model workers: hand a session's events to the endpoints that want them
(corral.webhooks `emit`). The model workers hold the knowledge database, where endpoints are; the proxy sends."""

from __future__ import annotations

from temporalio import activity
from temporalio.client import Client

from corral.contract.webhooks import EmitWebhooks
from corral.knowledge_db import KnowledgeDB, open_knowledge_db
from corral.names import ACTIVITY_EMIT_WEBHOOKS, PROXY_TASK_QUEUE
from corral.webhooks import Webhooks


class WebhookActivities:
    def __init__(self, client: Client, db: KnowledgeDB | None = None, proxy_queue: str = PROXY_TASK_QUEUE) -> None:
        self._webhooks = Webhooks(client, db or open_knowledge_db(), proxy_queue=proxy_queue)

    @activity.defn(name=ACTIVITY_EMIT_WEBHOOKS)
    async def emit_webhooks(self, input: EmitWebhooks) -> int:
        """Start the deliveries the events are owed (each once: a retry starts none twice); how many there are."""
        return len(await self._webhooks.emit(input.events, task_queue=input.task_queue))
