"""The TTFT benchmark's peer arm: actant, a Temporal agent runtime, in a process of its own (`bench._peers`,
`bench/peers/actant_arm.py`), on the same Temporal dev server and the same model server as corral's arms.

A session is a new actant thread: its first message, then, `--think` seconds after its run completed, its next one.
Each is timed inside the peer's process, at its client: the message sent (`thread.send`, actant's signal-with-start
of the thread's workflow) -> the first `text_delta` event its in-memory publisher delivers to the thread's
subscription (opened before sending), the same point as corral's first text delta at the client. The peer's
process runs its worker and its clients together, as actant's quickstart does: its in-memory event source reaches
no other process. The model server notes when each request arrives, which splits the time in two."""

from __future__ import annotations

from typing import TYPE_CHECKING

from bench._ttft_report import PEER_ARMS, Sample, SessionSpec

if TYPE_CHECKING:
    from bench._ttft_arms import Bench

PEER = PEER_ARMS[0]
PEER_COMMAND = "ls -la"
"""The `bash` call a tool-using session's script makes on the peer: actant has no sandbox here, so its tool runs in
a fresh directory of the peer's own, with no /workspace to list."""


async def peer_session(bench: Bench, spec: SessionSpec, first: str, following: str) -> Sample:
    """One session through the peer, checked from its stored messages like corral's from its log."""
    assert bench.peer is not None
    name = bench.register(PEER, spec)
    timeout = 240 + bench.args.think
    answer = await bench.peer.request(
        "ttft", timeout, model=f"script:{name}", first=first, next=following, think=bench.args.think
    )
    if "error" in answer:
        return Sample(PEER, spec, float("nan"), name, problem=answer["error"])
    bench.peer_threads.append(answer["thread"])
    if answer["problem"]:
        return Sample(PEER, spec, float("nan"), name, problem=answer["problem"])
    sample = Sample(PEER, spec, float("nan"), name)
    for turn, stamps in ((answer["first"], sample.stamps), (answer["next"], sample.next_stamps)):
        if turn["ttft"] is None:
            sample.problem = "no text delta"
            return sample
        stamps.update(sent=turn["sent"], client=turn["client"])
        arrivals = [at for at in bench.book.arrivals.get(name, []) if at >= turn["sent"] - 0.001]
        if arrivals:
            stamps["model_request"] = min(arrivals)
    sample.ttft, sample.next_ttft = answer["first"]["ttft"], answer["next"]["ttft"]
    counts = answer["messages"]
    expected = {"user": 2, "answer": 2, "tool": 1 if spec.uses_tool else 0}
    if counts != expected:
        sample.problem = f"stored messages {counts}, expected {expected}"
    return sample


async def close_peer_threads(bench: Bench) -> None:
    """Cancel the peer threads made so far (their workflows wait for a next message), as corral's are ended. A peer
    whose process failed has had each of its sessions reported with the failure; the run goes on without it."""
    threads, bench.peer_threads = bench.peer_threads, []
    if bench.peer is None or not threads:
        return
    try:
        await bench.peer.request("close", 120, threads=threads)
    except (RuntimeError, TimeoutError) as exc:  # a failed peer fails its own sessions (reported), not the run
        print(f"could not close {len(threads)} {PEER} threads: {exc}", flush=True)
