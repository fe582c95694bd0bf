"""Files' throughput: an upload and a download through the gateway (`/v1/files`, the official SDK) beside a raw copy
of the same bytes into and out of the blob store (`BlobStore.put` / `get`), in one run, as ratios.

The raw copy is the floor: the gateway adds HTTP, the multipart parse, hashing, the knowledge database's rows
and the quota check on the way in, and the database's lookup and a response on the way out. Each size runs the
arms interleaved (gateway up, raw put, gateway down, raw get), with fresh random bytes each time so no upload is
served by an earlier one's blob. Everything runs here: the Temporal dev server (in memory, for the gateway's API
keys), a harness worker, and the gateway as its own process, on a blob store and a knowledge database in a
temporary directory. Run from the repository root:

    python -m bench.files [--sizes-mib 1 16 64] [--runs 5] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from subprocess import DEVNULL

import anthropic
import httpx2

from bench._report import add_run_options, begin_run, markdown_table, write_results
from bench._stack import free_port
from corral.apikeys import create_key
from corral.blobs import LocalBlobStore
from corral.names import ENV_BLOB_STORE, ENV_FILE_MAX_BYTES, ENV_FILE_QUOTA_BYTES, ENV_KNOWLEDGE_DB
from corral.records import Records
from corral.temporal import start_local_temporal
from workers.roles import harness_worker

MIB = 1024 * 1024


def mib_per_second(size: int, seconds: float) -> float:
    return size / MIB / seconds if seconds > 0 else float("inf")


async def wait_healthy(url: str, process: asyncio.subprocess.Process) -> None:
    deadline = time.monotonic() + 60
    async with httpx2.AsyncClient() as http:
        while time.monotonic() < deadline:
            if process.returncode is not None:
                raise SystemExit(f"bench: the gateway exited with {process.returncode}")
            try:
                if (await http.get(f"{url}/healthz")).status_code == 200:
                    return
            except httpx2.TransportError:
                pass
            await asyncio.sleep(0.2)
    raise SystemExit("bench: the gateway did not answer within 60 s")


async def measure(
    client: anthropic.AsyncAnthropic, blobs: LocalBlobStore, size: int, runs: int
) -> dict[str, list[float]]:
    """Seconds per arm, `runs` times each, interleaved, after one warm-up round."""
    samples: dict[str, list[float]] = {"upload": [], "raw put": [], "download": [], "raw get": []}
    for round_number in range(runs + 1):
        data = os.urandom(size)
        started = time.perf_counter()
        made = await client.beta.files.upload(file=("bench.bin", data))
        upload = time.perf_counter() - started
        raw = os.urandom(size)
        key = f"bench/{uuid.uuid4().hex}"
        started = time.perf_counter()
        await asyncio.to_thread(blobs.put, key, raw)
        put = time.perf_counter() - started
        started = time.perf_counter()
        response = await client.beta.files.download(made.id)
        downloaded = await response.read()
        download = time.perf_counter() - started
        started = time.perf_counter()
        back = await asyncio.to_thread(blobs.get, key)
        get = time.perf_counter() - started
        if downloaded != data or back != raw:
            raise SystemExit("bench: bytes read back differ from those written")
        await client.beta.files.delete(made.id)
        await asyncio.to_thread(blobs.delete, key)
        if round_number:  # the first round warms the gateway, the disk and the connection
            for arm, seconds in (("upload", upload), ("raw put", put), ("download", download), ("raw get", get)):
                samples[arm].append(seconds)
    return samples


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes-mib", type=float, nargs="+", default=[1, 16, 64])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="1 and 8 MiB, 3 runs each")
    parser.add_argument("--output", default=None, help="results file name in bench/results/")
    add_run_options(parser)
    args = parser.parse_args()
    if args.quick:
        args.sizes_mib, args.runs = [1, 8], 3
    output = args.output or ("files-quick" if args.quick else "files")
    begin_run(args.allow_dirty)
    sizes = [int(mib * MIB) for mib in args.sizes_mib]
    scratch = Path(tempfile.mkdtemp(prefix="corral-bench-files-"))
    env = {**os.environ, ENV_BLOB_STORE: str(scratch / "blobs"), ENV_KNOWLEDGE_DB: str(scratch / "knowledge.db"),
           ENV_FILE_MAX_BYTES: str(max(sizes) + MIB), ENV_FILE_QUOTA_BYTES: str(4 * max(sizes) + MIB)}  # fmt: skip
    blobs = LocalBlobStore(scratch / "blobs")
    temporal = await start_local_temporal(dev_server_log_level="error")
    harness_queue = f"bench-files-{uuid.uuid4().hex[:8]}"
    port = free_port(set())
    address = temporal.client.service_client.config.target_host
    argv = [sys.executable, "-m", "gateway", "--port", str(port), "--temporal", address,
            "--harness-queue", harness_queue, "--model-queue", harness_queue + "-model"]  # fmt: skip
    results: dict[int, dict[str, list[float]]] = {}
    try:
        async with harness_worker(temporal.client, harness_queue):
            gateway = await asyncio.create_subprocess_exec(*argv, env=env, stdout=DEVNULL, stderr=DEVNULL)
            try:
                url = f"http://127.0.0.1:{port}"
                await wait_healthy(url, gateway)
                key, _ = await create_key(Records(temporal.client, task_queue=harness_queue), "bench-files")
                async with anthropic.AsyncAnthropic(base_url=url, api_key=key, max_retries=0, timeout=600) as client:
                    for size in sizes:
                        results[size] = await measure(client, blobs, size, args.runs)
            finally:
                gateway.terminate()
                await asyncio.wait_for(gateway.wait(), timeout=30)
    finally:
        await temporal.shutdown()

    rows = []
    summary: dict[str, dict[str, float]] = {}
    for size, samples in results.items():
        p50 = {arm: statistics.median(values) for arm, values in samples.items()}
        up, down = p50["upload"] / p50["raw put"], p50["download"] / p50["raw get"]
        rows.append([f"{size / MIB:g}", f"{mib_per_second(size, p50['upload']):.0f}",
                     f"{mib_per_second(size, p50['raw put']):.0f}", f"{up:.1f}x",
                     f"{mib_per_second(size, p50['download']):.0f}", f"{mib_per_second(size, p50['raw get']):.0f}",
                     f"{down:.1f}x"])  # fmt: skip
        summary[f"{size / MIB:g}MiB"] = {"upload_over_raw_put": round(up, 2), "download_over_raw_get": round(down, 2),
                                         "upload_mib_s": round(mib_per_second(size, p50["upload"]), 1),
                                         "download_mib_s": round(mib_per_second(size, p50["download"]), 1)}  # fmt: skip
    headers = ["MiB", "upload MiB/s", "raw put MiB/s", "upload / raw put (time)", "download MiB/s",
               "raw get MiB/s", "download / raw get (time)"]  # fmt: skip
    body = (
        f"p50 of {args.runs} runs per size, after a warm-up round, arms interleaved; the gateway through the official "
        "SDK, the raw arm `BlobStore.put` / `get` on the same local store.\n\n" + markdown_table(headers, rows)
    )
    print(body)
    title = "Files: throughput through the gateway vs the blob store"
    print(f"written to {write_results(output, title, body, summary=summary)}")


if __name__ == "__main__":
    asyncio.run(main())
