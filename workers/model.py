"""`corral-model`: runs model turns on `corral-model` and on a queue of its own, with `ANTHROPIC_API_KEY` /
`ANTHROPIC_BASE_URL` from its own environment only (and `CORRAL_STREAM_URL` / `CORRAL_STREAM_TOKEN` for live text
deltas)."""

import asyncio

import anthropic
from temporalio.client import Client
from temporalio.worker import Worker

from activities.model import warm_http_client, warm_up
from relay import StreamPublisher
from workers.roles import model_workers
from workers.run import connect_to_temporal, run_until_stopped, run_worker
from workers.settings import ModelSettings, ModelWorkerSettings

_warming: set[asyncio.Task[bool]] = set()
"""Warm-up requests in flight (asyncio keeps only a weak reference to a task)."""


def model_role(client: Client, settings: ModelSettings) -> list[Worker]:
    """The model workers as configured: the API client and the stream relay made from the settings. Call it with
    the event loop running: it opens the API client's first connection in the background, so the first turn does
    not (a model API that does not answer yet does not stop the worker from starting)."""
    # The SDK's own retries are off: Temporal owns retries.
    model = anthropic.AsyncAnthropic(
        api_key=settings.api_key, base_url=settings.base_url, max_retries=0, http_client=warm_http_client()
    )
    warming = asyncio.get_running_loop().create_task(warm_up(model))
    _warming.add(warming)
    warming.add_done_callback(_warming.discard)
    stream = StreamPublisher(settings.stream_url, token=settings.stream_token) if settings.stream_url else None
    return model_workers(
        client, model, settings.task_queue, stream=stream, stall_timeout_seconds=settings.stall_timeout_seconds
    )


async def _serve(settings: ModelWorkerSettings) -> None:
    client = await connect_to_temporal(settings.temporal)
    await run_until_stopped(model_role(client, settings.model))


def main() -> None:
    run_worker("corral-model", ModelWorkerSettings.from_environment, _serve)


if __name__ == "__main__":
    main()
