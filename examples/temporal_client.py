"""Drive a corral session from your own service with nothing but `temporalio` and plain JSON.

corral's workflow type, task queue, signal, update and query names are public and stable, and every input and
answer is a JSON object, so a service needs no corral import to start a session and talk to it. Run

    corral up                              # Temporal, the workers, the offline model if ANTHROPIC_API_KEY is unset
    python examples/temporal_client.py     # options: --address HOST:PORT, --model claude-sonnet-4-6 (with a key)

corral's workers use temporalio's pydantic data converter; the default converter used here writes the same
`json/plain` payloads, so the two interoperate. What plain JSON gives up is checking before sending: a wrong field
in the start input stalls the session's first workflow task and one in a signal drops the signal (both only in the
worker log), while the `send_events` update rejects a bad event with a readable error. The session stays open:
`corral events SESSION_ID` shows its log. examples/temporal_client_typed.py does the same with corral's models.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import uuid

from temporalio.client import Client, WorkflowHandle, WorkflowUpdateRPCTimeoutOrCancelledError

# corral's public names (corral/names.py); they change only with a migration note.
SESSION_WORKFLOW, HARNESS_TASK_QUEUE = "SessionWorkflow", "corral-harness"
OFFLINE_MODEL = "corral-offline-stand-in"


async def reply_after(handle: WorkflowHandle, event_id: str) -> str:
    """Poll the `events` query until the session is idle after our event; the agent's last message by then."""
    after, seen, reply = 0, False, ""
    while True:
        query = {"after": after, "types": ["user.message", "agent.message", "session.status_idle"]}
        page = await handle.query("events", query)  # {"events": [...], "has_more": bool, "next_after": int}
        for event in page["events"]:
            seen = seen or event["id"] == event_id
            if seen and event["type"] == "agent.message":
                reply = "".join(block["text"] for block in event["content"] if block["type"] == "text")
            elif seen and event["type"] == "session.status_idle":
                return reply
        after = page["next_after"]
        if not page["has_more"]:
            await asyncio.sleep(0.2)


async def converse(client: Client, model: str) -> str:
    session_id = "sesn_" + uuid.uuid4().hex[:26]  # the session id is the workflow id
    agent = {"model": model, "tools": [{"type": "corral_utility"}]}  # built-in `get_time` and `calculate`
    handle = await client.start_workflow(
        SESSION_WORKFLOW, {"agent": agent}, id=session_id, task_queue=HARNESS_TASK_QUEUE
    )
    print(f"session {session_id}")
    # A signal is fire-and-forget; its client id makes a resend harmless.
    await handle.signal("user_message", {"content": "hello from a plain Temporal client", "id": uuid.uuid4().hex})
    # An update returns once the session has accepted the events (a malformed one is rejected here), with their ids.
    events = [{"type": "user.message", "content": "please calculate 6*7"}]
    sent = await handle.execute_update("send_events", {"events": events})  # {"event_ids": [...]}
    return await reply_after(handle, sent["event_ids"][0])


async def main() -> int:
    parser = argparse.ArgumentParser(description="Talk to a corral session with only temporalio and JSON.")
    parser.add_argument("--address", default=os.environ.get("CORRAL_TEMPORAL_ADDRESS", "127.0.0.1:7233"))
    parser.add_argument("--model", default=OFFLINE_MODEL, help=f"default: {OFFLINE_MODEL} (offline `corral up`)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the reply (default: 60)")
    args = parser.parse_args()
    try:
        client = await Client.connect(args.address, namespace=os.environ.get("CORRAL_TEMPORAL_NAMESPACE", "default"))
    except RuntimeError:  # what temporalio raises when nothing answers at the address
        print(f"cannot reach Temporal at {args.address} — run `corral up` first", file=sys.stderr)
        return 1
    try:
        reply = await asyncio.wait_for(converse(client, args.model), args.timeout)
    except (TimeoutError, WorkflowUpdateRPCTimeoutOrCancelledError):  # the update's RPC turns a cancel into this
        print(f"no reply within {args.timeout:g} s — are corral's workers running? (`corral up`)", file=sys.stderr)
        return 1
    print(f"agent: {reply}")
    return 0


if __name__ == "__main__":
    code = asyncio.run(main())
    sys.stdout.flush()
    sys.stderr.flush()
    # Skip interpreter teardown: the client's Rust threads can abort it, exit code 134 (temporalio/sdk-python#300).
    os._exit(code)
