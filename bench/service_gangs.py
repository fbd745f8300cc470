"""Benchmark: what multi-node gangs cost the scheduler service (issue 12, service side).

Prints two tables:

1. the service's cycle (snapshot with one workload per replica, the policy,
   applying the decisions per job) against queue length, with no gangs and
   with 10 % of the queued jobs gangs of 2-16 replicas x 8 GPUs, on a
   simulated pool of 16 nodes x 8 GPUs held by build shares (so every train
   job waits, the steady state of a full pool);
2. submit -> every process of the job running, with real processes, for one
   8-GPU job and for a 2 x 8 GPU gang on two idle simulated nodes.

    .venv/bin/python -m bench.service_gangs [--sizes 1000,10000]
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from gpupool.app.backend import build_core
from gpupool.service.config import ServiceConfig
from gpupool.service.core import Actor, SchedulerCore
from gpupool.service.store import JobRecord

ADMIN = Actor("admin", True)
NODES = 16
POOL = ";".join(f"n{i:02d}@rack{i // 8}=8xA100-80GB" for i in range(NODES))
REQUEST = {"gpu_fraction": None, "gpu_memory": None, "gpu_model": None, "cpu": None, "memory": None}


def _config(state: Path, simulate: str = POOL) -> ServiceConfig:
    return ServiceConfig(state_dir=state, simulate=simulate, tick_s=3600, history_interval_s=3600,
                         admin_token="bench", min_runtime_s=0, resume_backoff_s=0, pause_grace_s=5,
                         run_jobs_as="service", poll_s=0.01)


def _queue(core: SchedulerCore, n: int, gang_share: float) -> None:
    """``n`` queued train jobs; every 1/gang_share-th a gang of 2..16 replicas x 8 GPUs (else 1-2 GPUs)."""
    store = core.book.store
    now = time.time()
    every = round(1 / gang_share) if gang_share else 0
    with store.transaction():
        for k in range(n):
            num = store.next_job_number()
            gang = every and k % every == 0
            store.insert_job(JobRecord(
                id=f"j-{num:06d}", num=num, name="bench", project="train", user="u", kind="train", state="queued",
                request={"gpus": 8 if gang else 1 + num % 2, **REQUEST}, priority=num % 3,
                submitted_at=now + num * 1e-6, command=["true"], workdir="/tmp",
                replicas=2 + (k // every) % 15 if gang else 1))
    core.book.reload()


async def cycle_times(n: int, gang_share: float, repeats: int = 5) -> tuple[float, float, int]:
    """(median, max) seconds of a steady cycle, and the workloads in its snapshot."""
    with tempfile.TemporaryDirectory() as d:
        core = build_core(_config(Path(d)))
        await core.start()
        core.set_project(ADMIN, "kernels", {"build_quota": NODES * 8})
        core.set_project(ADMIN, "train", {"train_guarantee": 64})
        for _ in range(NODES * 8):
            await core.submit(ADMIN, {"project": "kernels", "kind": "build", "gpus": 1})
        _queue(core, n, gang_share)
        core.cycles.run()  # the first cycle writes every wait reason once
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            core.cycles.run()
            times.append(time.perf_counter() - t)
        workloads = len(core.cycles.snapshot(core.book.live_jobs()).workloads)
        await core.stop()
    return statistics.median(times), max(times), workloads


UP = ("import os, time; open('up-' + os.environ.get('RANK', '0'), 'w').close(); time.sleep(60)")


async def start_latency(replicas: int, samples: int = 5) -> float:
    """Median seconds from submit to every process of the job running (each wrote its file)."""
    out = []
    with tempfile.TemporaryDirectory() as d:
        core = build_core(_config(Path(d) / "s", "a@r=8xA100-80GB;b@r=8xA100-80GB"))
        await core.start()
        core.set_project(ADMIN, "train", {"train_guarantee": 16})
        for i in range(samples):
            wd = Path(d) / f"w{i}"
            wd.mkdir()
            spec = {"project": "train", "gpus": 8, "workdir": str(wd), "command": [sys.executable, "-c", UP]}
            if replicas > 1:
                spec["replicas"] = replicas
            t = time.perf_counter()
            job, _ = await core.submit(ADMIN, spec)
            while len(list(wd.glob("up-*"))) < replicas:
                await asyncio.sleep(0.002)
            out.append(time.perf_counter() - t)
            await core.cancel(ADMIN, job["id"])
            while core.get_job(ADMIN, job["id"])["state"] != "cancelled":
                await asyncio.sleep(0.01)
        await core.stop()
    return statistics.median(out)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="1000,10000")
    args = ap.parse_args()
    sizes = [int(x) for x in args.sizes.split(",")]
    print(f"# service cycle with gangs — {platform.node()}, {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"{NODES} simulated nodes x 8 A100 (2 racks), every GPU held by a build share; the queue is train jobs "
          "that must wait.\n")
    print("| queued jobs | gangs among them | workloads in the snapshot | cycle median (ms) | cycle max (ms) |")
    print("|---:|---:|---:|---:|---:|")
    for n in sizes:
        for share in (0.0, 0.1):
            med, worst, workloads = await cycle_times(n, share)
            print(f"| {n} | {share:.0%} | {workloads} | {med * 1e3:.1f} | {worst * 1e3:.1f} |")
    one, gang = await start_latency(1), await start_latency(2)
    print("\n| job (real processes, two idle 8-GPU simulated nodes) | submit -> every process running, median (ms) |")
    print("|---|---:|")
    print(f"| 1 x 8 GPUs | {one * 1e3:.0f} |")
    print(f"| 2 x 8 GPUs (gang) | {gang * 1e3:.0f} |")


if __name__ == "__main__":
    asyncio.run(main())
