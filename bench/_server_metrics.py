"""What corral asks of the Temporal server per turn: the dev server's own counters, read before and after a load.

The dev server serves Prometheus metrics (`--metrics-port`). Three counters say what a turn costs it:
`service_requests` (every RPC, by service and operation: the frontend's are the round trips corral's processes
make) and `persistence_requests` (every read and write of its store). State transitions are not among them in a
form that adds up per turn; the load reads each session's own count from its description instead.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import httpx

Key = tuple[str, str]
"""(service, operation), or ("", name) for a counter without them."""


@dataclass
class Counters:
    requests: Counter[Key] = field(default_factory=Counter)
    persistence: Counter[str] = field(default_factory=Counter)

    def __sub__(self, earlier: Counters) -> Counters:
        return Counters(
            self.requests - earlier.requests,
            self.persistence - earlier.persistence,
        )


async def read(url: str) -> Counters:
    """The counters now, summed over namespaces."""
    from prometheus_client.parser import text_string_to_metric_families  # the bench extra: only a run needs it

    async with httpx.AsyncClient(timeout=30) as http:
        text = (await http.get(url)).raise_for_status().text
    counters = Counters()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = sample.labels
            if sample.name == "service_requests_total" or sample.name == "service_requests":
                counters.requests[(labels.get("service_name", ""), labels.get("operation", ""))] += int(sample.value)
            elif sample.name in ("persistence_requests_total", "persistence_requests"):
                counters.persistence[labels.get("operation", "")] += int(sample.value)
    return counters


def table(delta: Counters, turns: int, rows: int = 12) -> str:
    """Markdown: per turn, the frontend's RPCs by operation, the other services' and the store's totals."""
    per = 1 / max(turns, 1)
    frontend = Counter({op: n for (service, op), n in delta.requests.items() if service == "frontend" and n})
    inner = sum(n for (service, _), n in delta.requests.items() if service != "frontend")
    lines = [
        "| per turn | count |",
        "| :--- | ---: |",
        f"| RPCs to the frontend (corral's round trips) | {sum(frontend.values()) * per:.1f} |",
    ]
    lines += [f"| &nbsp;&nbsp;`{op}` | {n * per:.1f} |" for op, n in frontend.most_common(rows)]
    lines += [
        f"| RPCs between the server's own services (history, matching) | {inner * per:.1f} |",
        f"| persistence requests (reads and writes of the store) | {sum(delta.persistence.values()) * per:.1f} |",
    ]
    return "\n".join(lines)


def summary(delta: Counters, turns: int) -> dict[str, float]:
    per = 1 / max(turns, 1)
    frontend = sum(n for (service, _), n in delta.requests.items() if service == "frontend")
    return {
        "frontend_rpcs_per_turn": round(frontend * per, 2),
        "persistence_requests_per_turn": round(sum(delta.persistence.values()) * per, 2),
    }
