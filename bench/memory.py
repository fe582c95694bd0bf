"""Whether listing a memory store stays as fast at 100,000 memories as at 1,000: each query's latency on a store
of 100,000 over the same query on a store of 1,000, in one run (goal: a ratio close to 1.0, flat).

Both stores have the same shape: 100 top directories of 10 subdirectories each (`/d7/s3/f123.md`), so every
directory holds 100 times more files in the large store. The queries are the ones a client and a session's sync
make: the first page of everything, the next pages by cursor, a directory's first page (`path_prefix`), and
directory views (`depth` 1 and 2), whose roll-ups are computed by a skip-scan of the `(store_id, path)` index
(corral/memory_listing.py). They run through the library (corral.memory_stores, on a knowledge database of the
run's own), and through the HTTP API with the official SDK on the stack `corral up` starts (`--no-api` skips it).
Run from the repository root:

    python -m bench.memory [--large 100000] [--repeat 30] [--no-api]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench._report import add_run_options, begin_run, markdown_table, write_results
from corral.knowledge_db import KnowledgeDB
from corral.memory_records import user_actor
from corral.memory_stores import MemoryStores

SMALL = 1_000
WORKSPACE = "bench"
GOAL_RATIO = 1.5
"""What "flat" means on a shared machine: a query on the large store takes at most this much longer."""

Query = dict[str, Any]
QUERIES: dict[str, Query] = {
    "first page of everything (limit 100)": {"limit": 100},
    "fifth page of everything (cursor)": {"limit": 100, "pages": 5},
    "a directory's first page (path_prefix=/d42/, limit 10)": {"path_prefix": "/d42/", "limit": 10},
    "top directories (depth=1: 100 roll-ups)": {"depth": 1, "limit": 100},
    "a directory's view (path_prefix=/d42/, depth=1)": {"path_prefix": "/d42/", "depth": 1, "limit": 100},
    "the whole tree two levels deep (depth=2, limit 100)": {"depth": 2, "limit": 100},
    "first page with content (view=full, 20)": {"limit": 20, "full": True},
}


def memories(count: int) -> list[tuple[str, str]]:
    return [(f"/d{n % 100}/s{n // 100 % 10}/f{n}.md", f"memory {n}: " + "x" * 80) for n in range(count)]


def populate(stores: MemoryStores, store_id: str, count: int) -> float:
    started = time.perf_counter()
    batch = 20_000
    items = memories(count)
    for start in range(0, count, batch):
        stores.import_memories(WORKSPACE, store_id, items[start : start + batch], user_actor("bench"))
    return time.perf_counter() - started


def timed(run: Callable[[], object], repeat: int) -> float:
    """The median of `repeat` runs, after one warm-up, in milliseconds."""
    run()
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        run()
        samples.append((time.perf_counter() - started) * 1000)
    return statistics.median(samples)


def library_query(stores: MemoryStores, store_id: str, query: Query) -> Callable[[], object]:
    def run() -> object:
        page = None
        for _ in range(query.get("pages", 1)):
            found = stores.list_memories(WORKSPACE, store_id, query.get("path_prefix"), query.get("depth", 0),
                                         query["limit"], page, query.get("full", False))  # fmt: skip
            page = found.next_page
        return page

    return run


def api_query(client: Any, store_id: str, query: Query) -> Callable[[], object]:
    params = {key: value for key, value in query.items() if key in ("path_prefix", "depth", "limit")}
    if query.get("full"):
        params["view"] = "full"

    def run() -> object:
        page = None
        for _ in range(query.get("pages", 1)):
            extra: dict[str, str] = {"page": page} if page else {}
            found = client.beta.memory_stores.memories.list(store_id, **params, **extra)
            page = found.next_page
        return page

    return run


def measure(make: Callable[[str, Query], Callable[[], object]], small: str, large: str, repeat: int) -> list[Any]:
    rows = []
    for name, query in QUERIES.items():
        small_ms, large_ms = timed(make(small, query), repeat), timed(make(large, query), repeat)
        rows.append([name, round(small_ms, 3), round(large_ms, 3), round(large_ms / small_ms, 2)])
    return rows


def library_arm(large: int, repeat: int) -> tuple[list[Any], float]:
    stores = MemoryStores(KnowledgeDB(Path(tempfile.mkdtemp(prefix="corral-bench-memory-")) / "knowledge.db"))
    small_store = stores.create_store(WORKSPACE, "small").id
    large_store = stores.create_store(WORKSPACE, "large").id
    populate(stores, small_store, SMALL)
    seconds = populate(stores, large_store, large)
    rows = measure(lambda store, query: library_query(stores, store, query), small_store, large_store, repeat)
    return rows, seconds


def api_arm(large: int, repeat: int) -> list[Any]:
    import anthropic

    from bench import _stack
    from corral.knowledge_db import knowledge_db_path
    from corral.names import ENV_STATE_DIR

    stack = _stack.up()
    try:
        key = stack.corral("api-key", "create", "--workspace", WORKSPACE).stdout.strip()
        client = anthropic.Anthropic(base_url=f"http://127.0.0.1:{stack.ports['--api-port']}", api_key=key)
        small_store = client.beta.memory_stores.create(name="small").id
        large_store = client.beta.memory_stores.create(name="large").id
        # The stack's gateway reads the knowledge database in its state dir; the bench fills it through the library.
        stores = MemoryStores(KnowledgeDB(knowledge_db_path({ENV_STATE_DIR: str(stack.state_dir)})))
        populate(stores, small_store, SMALL)
        populate(stores, large_store, large)
        return measure(lambda store, query: api_query(client, store, query), small_store, large_store, repeat)
    finally:
        _stack.down(stack)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--large", type=int, default=100_000, help="memories in the large store")
    parser.add_argument("--repeat", type=int, default=30, help="timed runs of each query (the median is shown)")
    parser.add_argument("--no-api", action="store_true", help="measure the library only (no `corral up`)")
    parser.add_argument("--output", default="memory", help="results file name in bench/results/")
    add_run_options(parser)
    args = parser.parse_args()
    begin_run(args.allow_dirty)
    headers = ["query", f"{SMALL:,} memories, ms", f"{args.large:,} memories, ms", "ratio"]
    library_rows, fill_seconds = library_arm(args.large, args.repeat)
    sections = [
        f"Median of {args.repeat} runs of each query after a warm-up; goal: every ratio under {GOAL_RATIO:g} "
        f"(flat). Filling the large store through `import_memories` took {fill_seconds:.1f} s.",
        "",
        "## Through the library (corral.memory_stores)",
        "",
        markdown_table(headers, library_rows),
    ]
    summary: dict[str, Any] = {"large": args.large, "goal_ratio": GOAL_RATIO,
                               "library_max_ratio": max(row[3] for row in library_rows),
                               "library": {row[0]: row[3] for row in library_rows}}  # fmt: skip
    if not args.no_api:
        api_rows = api_arm(args.large, args.repeat)
        sections += ["", "## Through the HTTP API (the official SDK, on `corral up`)", "", markdown_table(headers,
                     api_rows)]  # fmt: skip
        summary |= {"api_max_ratio": max(row[3] for row in api_rows), "api": {row[0]: row[3] for row in api_rows}}
    body = "\n".join(sections)
    print(body)
    title = "Memory store listings at 1,000 and 100,000 memories"
    print(f"written to {write_results(args.output, title, body, summary=summary)}")


if __name__ == "__main__":
    main()
