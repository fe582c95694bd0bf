"""The work activity: a session in a self-hosted environment asks its environment's queue for hands. A
signal-with-start (corral.work_queue), so the queue runs from the first request whoever made the environment; it is
idempotent (a session with a live item gets no second one), so a retry is harmless."""

from __future__ import annotations

from temporalio import activity
from temporalio.client import Client

from corral.contract.work import ACTIVITY_REQUEST_WORK, RequestWorkInput, WorkRequest
from corral.work_queue import WorkQueues


class WorkActivities:
    """Holds the Temporal client, made once per worker."""

    def __init__(self, temporal: Client) -> None:
        self._temporal = temporal

    @activity.defn(name=ACTIVITY_REQUEST_WORK)
    async def request_work(self, input: RequestWorkInput) -> None:
        request = WorkRequest(session_id=input.session_id, workspace=input.environment.workspace)
        await WorkQueues(self._temporal, input.task_queue).request(input.environment.environment_id, request)
