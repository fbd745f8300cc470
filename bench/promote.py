"""Promote to training: time from the promote call to the job running, on an idle pool (target: < 1 s).

Run from the project root::

    python -m bench.promote --rounds 10

Starts an embedded scheduler (simulated GPUs) in this process, as the Jupyter
extension does, writes a small notebook, and promotes it ``--rounds`` times
with :func:`jupyter_gpupool.promote.promote` (what ``POST /gpupool/api/promote``
runs: snapshot, submit, place the snapshot). For each it measures the promote
call itself and the time until the scheduler reports the job ``running``
(its process started), then cancels it so the pool is idle again. Prints one
table; ``--json`` prints the numbers only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any

import nbformat

from jupyter_gpupool.connection import PoolConnection, PoolSettings
from jupyter_gpupool.promote import PromoteRequest, promote


def write_notebook(path: str) -> None:
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("epochs = 1\n")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell("print(epochs)")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)


async def wait_running(client: Any, job_id: str, since: int) -> tuple[float, int]:
    """Wait on the event long-poll until the job is running; returns (time seen, last seq)."""
    while True:
        reply = await client.events(since=since, timeout=5)
        since = reply["last"]
        for event in reply["events"]:
            if event.get("job_id") == job_id and event.get("state") in ("running", "failed", "rejected"):
                if event["state"] != "running":
                    raise RuntimeError(f"job {job_id} {event['state']}: {event.get('reason')}")
                return time.perf_counter(), since


async def run(rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "root")
        os.makedirs(root)
        write_notebook(os.path.join(root, "train.ipynb"))
        conn = PoolConnection(PoolSettings(state_dir=os.path.join(tmp, "state"), simulate="4xA100-80GB",
                                           extra={"config": {"pause_grace_s": 1.0}}))
        client = await conn.client()
        calls, running = [], []
        try:
            since = (await client.events(since=0, timeout=0))["last"]
            for i in range(rounds + 1):
                request = PromoteRequest.from_body({"path": "train.ipynb", "gpus": 1, "parameters": {"epochs": i}})
                start = time.perf_counter()
                job = await promote(client, root, request, conn.project)
                returned = time.perf_counter()
                if job["state"] == "running":
                    seen = returned
                else:
                    seen, since = await wait_running(client, job["id"], since)
                await client.cancel(job["id"])
                since = (await client.events(since=since, timeout=0))["last"]
                if i == 0:
                    continue  # warm-up: first-use imports and caches
                calls.append(returned - start)
                running.append(seen - start)
        finally:
            await conn.close()
    return {"promote_call_s": calls, "to_running_s": running}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--json", action="store_true", help="print the raw numbers as JSON")
    args = parser.parse_args(argv)
    result = asyncio.run(run(args.rounds))
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"# promote -> running, idle pool of 4 simulated GPUs, {args.rounds} rounds, {platform.node()} "
          f"({os.cpu_count()} CPU), Python {platform.python_version()}")
    print(f"{'step':<28} {'median s':>9} {'p90 s':>7} {'max s':>7}")
    for label, key in (("promote call (snapshot+submit)", "promote_call_s"), ("promote -> running", "to_running_s")):
        values = sorted(result[key])
        p90 = values[min(len(values) - 1, int(0.9 * len(values)))]
        print(f"{label:<28} {statistics.median(values):9.3f} {p90:7.3f} {max(values):7.3f}")
    median = statistics.median(result["to_running_s"])
    print(f"promote -> running median {median:.3f} s (target < 1 s: {'OK' if median < 1 else 'OVER TARGET'})")
    return 0 if median < 1 else 1


if __name__ == "__main__":
    sys.exit(main())
