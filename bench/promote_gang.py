"""Promote a distributed notebook as a gang: time from the promote call to every replica running.

Run from the project root::

    python -m bench.promote_gang --rounds 5

Like :mod:`bench.promote` (an embedded scheduler in this process, as the Jupyter
extension runs it, and :func:`jupyter_gpupool.promote.promote`, what
``POST /gpupool/api/promote`` runs), on a simulated pool of four 8-GPU nodes,
for 1, 2 and 4 replicas of 8 GPUs. A gang's job is ``running`` only once the
executor has started every replica's process, so "promote -> running" is the
time until the last replica started. Each job is cancelled before the next, so
the pool is idle at every promote. Prints one table; ``--json`` the numbers.
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

from bench.promote import wait_running, write_notebook
from jupyter_gpupool.connection import PoolConnection, PoolSettings
from jupyter_gpupool.promote import PromoteRequest, promote

NODES = "n1=8xA100-80GB;n2=8xA100-80GB;n3=8xA100-80GB;n4=8xA100-80GB"
SIZES = (1, 2, 4)


async def run(rounds: int) -> dict[str, dict[str, list[float]]]:
    """{replicas: {"promote_call_s": [...], "to_running_s": [...]}} after one warm-up promote."""
    results: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = os.path.join(tmp, "root")
        os.makedirs(root)
        write_notebook(os.path.join(root, "train.ipynb"))
        conn = PoolConnection(PoolSettings(state_dir=os.path.join(tmp, "state"), simulate=NODES,
                                           extra={"config": {"pause_grace_s": 1.0}}))
        client = await conn.client()
        try:
            since = (await client.events(since=0, timeout=0))["last"]
            for replicas in (SIZES[0], *SIZES):  # the first pass is a warm-up
                calls, running = [], []
                for i in range(rounds):
                    body = {"path": "train.ipynb", "gpus": 8, "replicas": replicas, "parameters": {"epochs": i}}
                    start = time.perf_counter()
                    job = await promote(client, root, PromoteRequest.from_body(body), conn.project)
                    returned = time.perf_counter()
                    if job["state"] == "running":
                        seen = returned
                    else:
                        seen, since = await wait_running(client, job["id"], since)
                    await client.cancel(job["id"])
                    since = (await client.events(since=since, timeout=0))["last"]
                    calls.append(returned - start)
                    running.append(seen - start)
                results[str(replicas)] = {"promote_call_s": calls, "to_running_s": running}
        finally:
            await conn.close()
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="print the raw numbers as JSON")
    args = parser.parse_args(argv)
    result = asyncio.run(run(args.rounds))
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"# promote -> every replica running, idle pool of 4 simulated 8-GPU nodes, {args.rounds} rounds, "
          f"{platform.node()} ({os.cpu_count()} CPU), Python {platform.python_version()}")
    print(f"{'job':<14} {'call median s':>13} {'running median s':>16} {'max s':>7}")
    for replicas in SIZES:
        r = result[str(replicas)]
        print(f"{f'{replicas} x 8 GPUs':<14} {statistics.median(r['promote_call_s']):13.3f} "
              f"{statistics.median(r['to_running_s']):16.3f} {max(r['to_running_s']):7.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
