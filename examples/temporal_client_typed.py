"""The flow of examples/temporal_client.py with corral's typed models and client helpers instead of plain JSON.

Inputs are validated before anything reaches Temporal, and events come back as pydantic models. Run

    corral up                                    # Temporal, the workers, the offline model without ANTHROPIC_API_KEY
    python examples/temporal_client_typed.py     # options: --address HOST:PORT, --model NAME
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import uuid

from temporalio.client import Client, WorkflowUpdateRPCTimeoutOrCancelledError

from corral.client import read_events, send_text, start_session, wait_for_idle
from corral.contract.events import AgentMessage
from corral.contract.session import AgentConfig, SessionInput, UserMessageSignal, UtilityToolset
from corral.names import SIGNAL_USER_MESSAGE
from corral.temporal import connect, temporal_address

OFFLINE_MODEL = "corral-offline-stand-in"


async def converse(client: Client, model: str, timeout: float) -> str:
    handle = await start_session(client, SessionInput(agent=AgentConfig(model=model, tools=[UtilityToolset()])))
    print(f"session {handle.id}")
    await handle.signal(
        SIGNAL_USER_MESSAGE, UserMessageSignal(content="hello from a typed client", id=uuid.uuid4().hex)
    )
    event_id = await send_text(handle, "please calculate 6*7")  # the `send_events` update
    position = next(e.position for e in await read_events(handle, types=["user.message"]) if e.id == event_id)
    events = await wait_for_idle(handle, after=position, within_seconds=timeout)
    reply = [e for e in events if isinstance(e, AgentMessage)][-1]
    return "".join(block.text for block in reply.content)


async def main() -> int:
    parser = argparse.ArgumentParser(description="Talk to a corral session with corral's typed client helpers.")
    parser.add_argument("--address", default=temporal_address(), help="default: CORRAL_TEMPORAL_ADDRESS or local")
    parser.add_argument("--model", default=OFFLINE_MODEL, help=f"default: {OFFLINE_MODEL} (offline `corral up`)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the reply (default: 60)")
    args = parser.parse_args()
    try:
        client = await connect(args.address)  # the pydantic data converter, like every corral process
    except RuntimeError:  # what temporalio raises when nothing answers at the address
        print(f"cannot reach Temporal at {args.address} — run `corral up` first", file=sys.stderr)
        return 1
    try:
        reply = await asyncio.wait_for(converse(client, args.model, args.timeout), args.timeout)
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
