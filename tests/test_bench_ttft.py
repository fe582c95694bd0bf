"""The TTFT benchmark's report, summary and quoted block with a peer arm beside corral's, and without one
(`--no-peers`); and the peer process's protocol, which carries one request per session in flight at once. Figures
here are made up, not timed: the benchmark itself runs with `python -m bench.ttft` (bench/README.md)."""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import quote
from bench.ttft import ARMS, PEER, PeerProcess, Sample, SessionSpec, report, summary

ARGS = argparse.Namespace(
    first_token_latency=0.3,
    tokens_per_second=50.0,
    sessions=4,
    concurrency=2,
    max_pause=0.5,
    rounds=2,
    preamble=True,
    first_message="update-with-start",
    think=1.0,
    one_process=False,
    model_workers=2,
    model_routing=True,
    repo_mb=0,
)
FIRST = {"direct": 0.30, "coupled": 2.0, "decoupled": 0.33, "actant": 0.32}
"""Each arm's made-up first-message TTFT; the next message's is 10 ms more."""


def samples(arms: tuple[str, ...]) -> dict[str, list[Sample]]:
    made: dict[str, list[Sample]] = {}
    for arm in arms:
        made[arm] = []
        for index in range(4):
            ttft = FIRST[arm] + index / 1000
            sample = Sample(arm, SessionSpec(index, index % 2 == 1), ttft, f"{arm}-{index}")
            sample.next_ttft = ttft + 0.01
            sent = 1000.0 + index
            sample.stamps = {"sent": sent, "model_request": sent + 0.02, "client": sent + ttft}
            sample.next_stamps = {"sent": sent + 5, "model_request": sent + 5.02, "client": sent + 5 + ttft + 0.01}
            made[arm].append(sample)
    made[arms[-1]][0].problem = "no text delta"
    return made


def test_the_peer_arm_gets_its_rows_its_ratios_to_the_bare_call_and_who_is_ahead() -> None:
    measured = samples((*ARMS, PEER))
    body = report(ARGS, measured, {"coupled": 4, "decoupled": 2})
    assert f"| {PEER} | 3 (1 failed) |" in body
    assert f"| new session: {PEER} / direct | 1.07 |" in body
    assert f"| new session: corral ahead of {PEER} (p50 / p95) | no | no |" in body
    assert f"Where the time goes, {PEER} arm, the first message" in body
    assert f"- {PEER} #0: no text delta" in body
    figures = summary(ARGS, measured, {"coupled": 4, "decoupled": 2})
    assert figures["peers"] == [PEER]
    peer = figures["arms"][PEER]
    assert peer["sessions"] == 3 and peer["failed"] == 1 and peer["sandboxes"] is None
    assert peer["p50"] == pytest.approx(0.322) and peer["next_p50"] == pytest.approx(0.332)
    assert figures["arms"]["decoupled"]["sandboxes"] == 2 and figures["arms"]["direct"]["sandboxes"] is None


def test_without_peers_the_report_and_summary_hold_corral_s_arms_only() -> None:
    measured = samples(ARMS)
    body = report(ARGS, measured, {"coupled": 4, "decoupled": 2})
    assert "Beside" not in body and f"| {PEER} |" not in body
    figures = summary(ARGS, measured, {"coupled": 4, "decoupled": 2})
    assert figures["peers"] == [] and set(figures["arms"]) == set(ARMS)


def _quoted(monkeypatch: pytest.MonkeyPatch, figures: dict[str, Any]) -> str:
    monkeypatch.setattr(quote, "summary", lambda name: {"figures": figures, "command": "python -m bench.ttft"})
    monkeypatch.setattr(quote, "source", lambda name: f"`{name}`")
    return quote.ttft()


def test_the_quoted_block_gives_the_peer_beside_corral_and_is_unchanged_without_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with_peer = summary(ARGS, samples((*ARMS, PEER)), {"coupled": 4, "decoupled": 2})
    block = _quoted(monkeypatch, with_peer)
    assert f"| {PEER} (a peer Temporal runtime" in block
    assert f"**Beside {PEER}** in the same run" in block and "(goal: ahead at both, not met)" in block
    sentence = quote.ttft_new_session()
    assert sentence.startswith("A new session's first token") and "1.10x the bare call" in sentence
    assert f"; {PEER}'s in the same run 1.07x" in sentence and "(goal: corral ahead at both, not met)" in sentence

    without = summary(ARGS, samples(ARMS), {"coupled": 4, "decoupled": 2})
    del without["peers"]  # a results file from before the peer arm
    block = _quoted(monkeypatch, without)
    assert PEER not in block and "**Decoupled against direct**" in block
    assert PEER not in quote.ttft_new_session()


# A stand-in peer speaking the protocol: answers `echo` with its text, once the request whose text is `after` (if
# any) has been answered, so a request's answer can be made to overtake an earlier one's; exits on `exit`.
STAND_IN = """
import asyncio, json, sys

async def main():
    print(json.dumps({"ready": True}), flush=True)
    loop = asyncio.get_running_loop()
    answered, tasks = {}, set()

    async def answer(request):
        after = request.get("after")
        if after is not None:
            await answered.setdefault(after, asyncio.Event()).wait()
        print(json.dumps({"id": request["id"], "echo": request["text"]}), flush=True)
        answered.setdefault(request["text"], asyncio.Event()).set()

    while line := await loop.run_in_executor(None, sys.stdin.readline):
        request = json.loads(line)
        if request["command"] == "exit":
            sys.exit(3)
        task = asyncio.create_task(answer(request))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

asyncio.run(main())
"""


async def test_a_peer_answers_requests_in_flight_together_each_to_its_own_and_a_dead_peer_fails_them(
    tmp_path: Path,
) -> None:
    script = tmp_path / "stand_in_arm.py"
    script.write_text(STAND_IN)
    log = tmp_path / "stand-in.log"
    peer = await PeerProcess.launch("stand-in", Path(sys.executable), log, script=script)
    try:
        slow = asyncio.create_task(peer.request("echo", 60, text="slow", after="fast"))
        fast = asyncio.create_task(peer.request("echo", 60, text="fast"))  # sent second (tasks run in order)
        finished: list[str] = []

        def note(task: asyncio.Task[dict[str, Any]]) -> None:
            finished.append("slow" if task is slow else "fast")

        slow.add_done_callback(note)
        fast.add_done_callback(note)
        answers = await asyncio.gather(slow, fast)
        assert [a["echo"] for a in answers] == ["slow", "fast"]  # each request got its own answer
        assert finished == ["fast", "slow"]  # the later request's answer came first
        waiting = asyncio.create_task(peer.request("echo", 60, text="never", after="nothing"))
        with pytest.raises(RuntimeError, match="stand-in arm"):
            await peer.request("exit", 60)
        with pytest.raises(RuntimeError, match=re.escape(str(log))):
            await waiting
    finally:
        await peer.stop()
