"""The log activities: read a page of a session's log (a fork copies its source this way) and archive a run's
events before the session continues as new. They read the session through its queries and write blobs; they never
call the model, so they share no state with the model turn."""

from __future__ import annotations

import asyncio

from temporalio import activity
from temporalio.client import Client

from corral.archive import write_chunks
from corral.blobs import BlobStore, open_blob_store
from corral.contract.activities import ArchiveLogInput, ReadLogInput
from corral.contract.context import json_size
from corral.contract.events import SessionEvent
from corral.contract.session import MAX_QUERY_BYTES, EventPage, EventsQuery
from corral.names import ACTIVITY_ARCHIVE_LOG, ACTIVITY_READ_LOG, QUERY_EVENTS
from corral.reading import event_pages


class LogActivities:
    """Holds the Temporal client (to query the session) and the blob store (the archive); both made once per worker."""

    def __init__(self, temporal: Client, blobs: BlobStore | None = None) -> None:
        self._temporal = temporal
        self._blobs = blobs or open_blob_store()

    @activity.defn(name=ACTIVITY_READ_LOG)
    async def read_log(self, input: ReadLogInput) -> EventPage:
        """A page of a session's log, from whichever run or archive holds it (a fork copies its source this way)."""
        handle = self._temporal.get_workflow_handle(input.session_id)
        events: list[SessionEvent] = []
        budget = MAX_QUERY_BYTES  # an activity result stays far under Temporal's payload limit
        async for page in event_pages(handle, after=input.after, before=input.before, blobs=self._blobs):
            for event in page:
                budget -= json_size(event)
                if events and budget < 0:
                    return EventPage(events=events, has_more=True, next_after=events[-1].position)
                events.append(event)
            if len(events) >= 1000:
                return EventPage(events=events, has_more=True, next_after=events[-1].position)
        return EventPage(events=events, has_more=False, next_after=events[-1].position if events else input.after)

    @activity.defn(name=ACTIVITY_ARCHIVE_LOG)
    async def archive_log(self, input: ArchiveLogInput) -> list[int]:
        """Write a run's events `after+1 .. through` to the archive before the session continues as new; they are
        read through that run's `events` query. The first positions of the chunks written."""
        handle = self._temporal.get_workflow_handle(input.session_id, run_id=input.run_id)
        events: list[SessionEvent] = []
        after = input.after
        while after < input.through:
            query = EventsQuery(after=after, before=input.through + 1, limit=1000)
            page = await handle.query(QUERY_EVENTS, query, result_type=EventPage)
            if not page.events or page.events[0].position != after + 1:
                raise RuntimeError(f"{input.session_id} returned no event at position {after + 1}")
            events.extend(page.events)
            after = page.events[-1].position
            activity.heartbeat(after)
        return await asyncio.to_thread(write_chunks, self._blobs, input.session_id, events)
