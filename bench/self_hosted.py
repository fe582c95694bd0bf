"""A self-hosted worker's round trip against corral's own Docker hand, on the stack `corral up` starts, measured in
the same run.

Both arms are sessions made through the Managed Agents API (the gateway `corral up` starts, a key from `corral
api-key create`), whose scripted model makes K `bash true` calls (default 3) and then answers. The Docker arm's
environment is a cloud one: each call runs in the session's sandbox, timed from its `agent.tool_use` to its
`agent.tool_result`. The self-hosted arm's environment is `self_hosted`: the official SDK's worker
(examples/self_hosted_worker.py, unchanged, a process of its own holding only an environment key) claims the
session's work item and runs each call on this machine, timed from its `agent.tool_use` to the worker's
`user.tool_result`. Every time comes from the session log's `created_at`.

A session's first call is counted apart from its later ones: it includes the claim (a sandbox from the warm pool;
or a work item: the worker's next poll, which the SDK makes every 1-3 s when idle, its ack and first heartbeat).
The SDK's worker stays with a session for a minute after it goes idle, so a fresh worker serves each self-hosted
session: started and polling before the session, stopped after it. Runs alternate between the arms after one
warm-up of each (not counted); the figures are the ratios of the medians, self-hosted over Docker.

Usage: `python -m bench.self_hosted [--runs R] [--calls K] [--quick]`.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import anthropic
import httpx

from bench import _stack
from bench._report import ROOT, add_run_options, begin_run, markdown_table, median, write_results
from modelserver import Script, ScriptStep
from modelserver.scripts import ToolUseSpec

SCRIPT = "bench-self-hosted"
WORKER = ROOT / "examples" / "self_hosted_worker.py"
POLLING = "idle; polling environment_id="
"""The SDK worker's line after its first empty poll: it is up and asking for work."""
ARMS = ("self-hosted", "docker")
ANSWERS = {"self-hosted": "user.tool_result", "docker": "agent.tool_result"}


class Bench:
    """The API objects both arms share: a client with a fresh key, one agent, a cloud and a self-hosted
    environment, and the self-hosted one's key."""

    def __init__(self, stack: _stack.Stack, calls: int) -> None:
        self.stack = stack
        self.api_url = f"http://127.0.0.1:{stack.ports['--api-port']}"
        key = stack.corral("api-key", "create", "--workspace", "bench").stdout.strip()
        self.client = anthropic.Anthropic(base_url=self.api_url, api_key=key, max_retries=3)
        steps = [ScriptStep(tool_uses=[ToolUseSpec(name="bash", input={"command": "true"})])] * calls
        script = Script(steps=[*steps, ScriptStep(text="done")])
        put = httpx.put(f"{stack.model_url}/_corral/scripts/{SCRIPT}", json=script.model_dump(mode="json"), timeout=30)
        put.raise_for_status()
        toolset: Any = [{"type": "agent_toolset_20260401"}]
        self.agent = self.client.beta.agents.create(name="bench", model=f"script:{SCRIPT}", tools=toolset)
        self.environments = {
            "docker": self.client.beta.environments.create(name="bench-docker").id,
            "self-hosted": self.client.beta.environments.create(name="bench-laptop", config={"type": "self_hosted"}).id,
        }
        made = httpx.post(f"{self.api_url}/v1/environments/{self.environments['self-hosted']}/keys",
                          headers={"x-api-key": key}, json={"name": "bench"}, timeout=30)  # fmt: skip
        made.raise_for_status()
        self.environment_key: str = made.json()["key"]

    def session(self, arm: str, calls: int, timeout: float = 300) -> tuple[str, list[Any]]:
        """One session of `arm` to its end: its id and its log."""
        session = self.client.beta.sessions.create(agent=self.agent.id, environment_id=self.environments[arm])
        message: Any = {"type": "user.message", "content": [{"type": "text", "text": f"{calls} x bash true"}]}
        self.client.beta.sessions.events.send(session.id, events=[message])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            events = list(self.client.beta.sessions.events.list(session.id, limit=500))
            if any(e.type == "agent.message" for e in events) and events[-1].type == "session.status_idle":
                return session.id, events
            time.sleep(0.2)
        raise RuntimeError(f"{arm}: session {session.id} not done within {timeout:g} s")

    @contextmanager
    def worker(self, workdir: Path) -> Iterator[None]:
        """The example worker, running in `workdir` and polling, for the block; then stopped as Ctrl-C stops it."""
        workdir.mkdir(parents=True, exist_ok=True)
        log = workdir.parent / f"{workdir.name}.log"
        env = {**self.stack.env, "ANTHROPIC_ENVIRONMENT_KEY": self.environment_key, "ANTHROPIC_BASE_URL": self.api_url}
        with log.open("wb") as out:
            process = subprocess.Popen([sys.executable, str(WORKER), self.environments["self-hosted"]], cwd=workdir,
                                       env=env, stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while POLLING not in log.read_text():
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the self-hosted worker is not polling: {log.read_text()}")
                time.sleep(0.05)
            yield
        finally:
            process.send_signal(signal.SIGINT)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def round_trips(arm: str, events: list[Any], calls: int) -> list[float]:
    """Seconds from each `agent.tool_use` to its answer, in call order; a session that did not do its work raises."""
    uses = [e for e in events if e.type == "agent.tool_use"]
    answered = {e.tool_use_id: e for e in events if e.type in ("agent.tool_result", "user.tool_result")}
    wrong = [use.id for use in uses if use.id not in answered or answered[use.id].type != ANSWERS[arm]
             or answered[use.id].is_error]  # fmt: skip
    if len(uses) != calls or wrong:
        raise RuntimeError(f"{arm}: {len(uses)} calls, not {calls}, or not answered by {ANSWERS[arm]}: {wrong}")
    return [(when(answered[use.id].created_at) - when(use.created_at)).total_seconds() for use in uses]


def when(created_at: datetime | str) -> datetime:
    """An event's `created_at` (the SDK's types give some events a string, some a datetime)."""
    return created_at if isinstance(created_at, datetime) else datetime.fromisoformat(created_at)


def measure(runs: int, calls: int) -> dict[str, dict[str, list[float]]]:
    """By arm, the counted round trips of first calls and of later calls."""
    samples: dict[str, dict[str, list[float]]] = {arm: {"first": [], "later": []} for arm in ARMS}
    stack = _stack.up()
    try:
        bench = Bench(stack, calls)
        with tempfile.TemporaryDirectory(prefix="bench-self-hosted-") as scratch:
            for run in range(runs + 1):  # the first run of each arm warms up and is not counted
                for arm in ARMS if run % 2 == 0 else ARMS[::-1]:
                    if arm == "self-hosted":
                        with bench.worker(Path(scratch) / f"worker-{run}"):
                            session_id, events = bench.session(arm, calls)
                    else:
                        session_id, events = bench.session(arm, calls)
                    took = round_trips(arm, events, calls)
                    if run:
                        samples[arm]["first"].append(took[0])
                        samples[arm]["later"] += took[1:]
                    shown = ", ".join(f"{seconds * 1000:.0f}" for seconds in took)
                    print(f"run {run}/{runs} {arm}: {shown} ms ({session_id})", flush=True)
    finally:
        _stack.down(stack)
    return samples


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="counted sessions per arm (default 5), after a warm-up")
    parser.add_argument("--calls", type=int, default=3, help="`bash true` calls per session (default 3)")
    parser.add_argument("--quick", action="store_true", help="1 counted session per arm of 2 calls")
    parser.add_argument("--output", default=None, help="results file name in bench/results/")
    add_run_options(parser)
    args = parser.parse_args()
    runs, calls = (1, 2) if args.quick else (args.runs, args.calls)
    if calls < 2:
        parser.error("--calls must be at least 2: a session's first call is counted apart")
    begin_run(args.allow_dirty)
    samples = measure(runs, calls)
    rows, summary = [], {"runs": runs, "calls": calls}
    for kind, label in (("first", "a session's first call (claim + `bash true`)"),
                        ("later", "a later call (`bash true` on hands the session holds)")):  # fmt: skip
        hosted, docker = median(samples["self-hosted"][kind]), median(samples["docker"][kind])
        rows.append([label, len(samples["self-hosted"][kind]), f"{hosted * 1000:.1f} ms", f"{docker * 1000:.1f} ms",
                     f"{hosted / docker:.2f}x"])  # fmt: skip
        summary |= {f"{kind}_self_hosted_p50": hosted, f"{kind}_docker_p50": docker, f"{kind}_ratio": hosted / docker}
    body = "\n".join(
        [
            f"{runs} sessions per arm on `corral up`'s stack, {calls} `bash true` calls each, alternating, after one "
            "warm-up of each. A call is timed from its `agent.tool_use` to its answer in the session log "
            "(`created_at`): the self-hosted worker's `user.tool_result` (the official SDK's `EnvironmentWorker`, "
            "examples/self_hosted_worker.py, on this machine) or the Docker hand's `agent.tool_result`.",
            "",
            markdown_table(["call", "calls per arm", "self-hosted p50", "Docker hand p50", "ratio"], rows),
            "",
            "A first call includes the claim: the warm pool's container, or the work item (the worker's next poll, "
            "which the SDK makes every 1-3 s while idle, its ack and its first heartbeat). A later call is the round "
            "trip itself: the session log to the worker's event stream, the tool, the result posted back.",
        ]
    )
    print(body)
    name = args.output or ("self_hosted-quick" if args.quick else "self_hosted")
    title = "Self-hosted worker vs corral's Docker hand: a `bash true` round trip"
    print(f"written to {write_results(name, title, body, summary=summary)}")


if __name__ == "__main__":
    main()
