"""Benchmark of the scheduler service core (no GPU needed: simulated GPUs, real processes).

Prints one table: scheduling-cycle time against queue length (the real policy
engine plus the core's snapshot/apply work), submit latency, start-up
(recovery) time with a long queue, and the pause round trip of a real process.

    .venv/bin/python bench/service_core.py [--sizes 100,1000,10000]
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


SYNC = "NORMAL"


def _config(state: Path) -> ServiceConfig:
    return ServiceConfig(state_dir=state, simulate="8xA100-80GB", tick_s=3600, history_interval_s=3600,
                         admin_token="bench", min_runtime_s=0, resume_backoff_s=0, pause_grace_s=5,
                         sqlite_synchronous=SYNC, run_jobs_as="service")


async def _full_pool(core: SchedulerCore) -> None:
    """Occupy every GPU with build shares (no processes) so queued train jobs stay queued."""
    core.set_project(ADMIN, "kernels", {"build_quota": 8})
    core.set_project(ADMIN, "train", {"train_guarantee": 4})
    for _ in range(8):
        await core.submit(ADMIN, {"project": "kernels", "kind": "build", "gpus": 1})


def _bulk_queue(core: SchedulerCore, n: int) -> None:
    store = core.book.store
    now = time.time()
    with store.transaction():
        for _ in range(n):
            num = store.next_job_number()
            store.insert_job(JobRecord(
                id=f"j-{num:06d}", num=num, name="bench", project="train", user="u", kind="train", state="queued",
                request={"gpus": 1 + num % 2, "gpu_fraction": None, "gpu_memory": None, "gpu_model": None,
                         "cpu": None, "memory": None},
                priority=num % 3, submitted_at=now + num * 1e-6, command=["true"], workdir="/tmp"))
    core.book.reload()


async def _loaded_core(state_dir: Path, pending: int) -> SchedulerCore:
    """A started core on a full pool with ``pending`` train jobs queued, after its first cycle
    (which writes every wait reason once, so later cycles measure the steady state)."""
    core = build_core(_config(state_dir))
    await core.start()
    await _full_pool(core)
    _bulk_queue(core, pending)
    core.cycles.run()
    return core


async def cycle_times(n: int) -> tuple[float, float, float]:
    with tempfile.TemporaryDirectory() as d:
        core = await _loaded_core(Path(d), n)
        times = []
        for _ in range(5):
            t = time.perf_counter()
            core.cycles.run()
            times.append(time.perf_counter() - t)
        await core.stop()
        t = time.perf_counter()
        again = build_core(_config(Path(d)))
        await again.start()
        startup = time.perf_counter() - t
        await again.stop()
    return statistics.median(times), max(times), startup


async def submit_latency(pending: int, samples: int = 50) -> tuple[float, float]:
    """Median submit call, and wall time per submit including the cycles a burst causes."""
    with tempfile.TemporaryDirectory() as d:
        core = await _loaded_core(Path(d), pending)
        lat = []
        t0 = time.perf_counter()
        for _ in range(samples):
            t = time.perf_counter()
            await core.submit(Actor("alice"), {"project": "train", "gpus": 1, "command": ["true"]})
            lat.append(time.perf_counter() - t)
            await asyncio.sleep(0.001)  # let the loop run deferred cycles, as between HTTP requests
        while core.cycle_pending:
            await asyncio.sleep(0.001)
        amortized = (time.perf_counter() - t0 - 0.001 * samples) / samples
        await core.stop()
    lat.sort()
    return statistics.median(lat), amortized


async def burst(pending: int, n: int = 1000, clients: int = 16) -> tuple[float, float, int]:
    """``clients`` concurrent submitters send ``n`` train jobs on top of ``pending`` queued ones.

    Each submitter yields to the loop between submits, as HTTP requests arrive
    over several loop turns. Returns (submits/s, CPU ms per submit with the
    cycles the burst caused, cycles run): what the core costs per submit with no
    HTTP in front of it.
    """
    with tempfile.TemporaryDirectory() as d:
        core = await _loaded_core(Path(d), pending)
        left = list(range(n))
        spec = {"project": "train", "gpus": 1, "command": ["true"]}

        async def submitter() -> None:
            while left:
                left.pop()
                await core.submit(Actor("alice"), spec)
                await asyncio.sleep(0)

        before = core.registry.get_sample_value("gpupool_cycle_seconds_count") or 0
        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*(submitter() for _ in range(clients)))
        while core.cycle_pending:
            await asyncio.sleep(0.001)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        cycles = int((core.registry.get_sample_value("gpupool_cycle_seconds_count") or 0) - before)
        await core.stop()
    return n / wall, cpu / n, cycles


async def pause_round_trip(samples: int = 5) -> tuple[float, float]:
    """submit -> process running; pause -> state paused (SIGTERM honoured at once)."""
    code = "import signal,sys,time; signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); open('up','w'); time.sleep(60)"
    starts, pauses = [], []
    with tempfile.TemporaryDirectory() as d:
        cfg = _config(Path(d) / "s")
        cfg.poll_s = 0.01
        core = build_core(cfg)
        await core.start()
        core.set_project(ADMIN, "train", {"train_guarantee": 8})
        for i in range(samples):
            wd = Path(d) / f"w{i}"
            wd.mkdir()
            t = time.perf_counter()
            job, _ = await core.submit(ADMIN, {"project": "train", "gpus": 1, "workdir": str(wd),
                                               "command": [sys.executable, "-c", code]})
            while not (wd / "up").exists():
                await asyncio.sleep(0.002)
            starts.append(time.perf_counter() - t)
            t = time.perf_counter()
            out = await core.pause(ADMIN, job["id"])
            assert out["state"] == "paused", out
            pauses.append(time.perf_counter() - t)
            await core.cancel(ADMIN, job["id"])
        await core.stop()
    return statistics.median(starts), statistics.median(pauses)


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="100,1000,10000")
    ap.add_argument("--sync", default="NORMAL", choices=["FULL", "NORMAL"], help="SQLite synchronous setting")
    args = ap.parse_args()
    global SYNC
    SYNC = args.sync
    sizes = [int(x) for x in args.sizes.split(",")]
    print(f"# service core benchmark — {platform.node()}, {platform.processor() or platform.machine()}, "
          f"Python {platform.python_version()}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"8 simulated A100 GPUs, all held by build shares; the queue is train jobs that must wait; "
          f"SQLite synchronous={SYNC}.\n")
    print("| queued jobs | cycle median (ms) | cycle max (ms) | start-up incl. recovery (ms) | submit call p50 (ms) | per submit in a burst, cycles included (ms) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n in sizes:
        med, worst, startup = await cycle_times(n)
        p50, amortized = await submit_latency(n, samples=20 if n >= 10000 else 50)
        print(f"| {n} | {med * 1e3:.1f} | {worst * 1e3:.1f} | {startup * 1e3:.0f} | {p50 * 1e3:.1f} | {amortized * 1e3:.1f} |")
    print("\n| burst of 1000 submits from 16 concurrent callers onto a queue of | submits/s | CPU per submit, cycles included (ms) | cycles |")
    print("|---:|---:|---:|---:|")
    for n in sizes:
        rate, cpu, cycles = await burst(n)
        print(f"| {n} | {rate:.0f} | {cpu * 1e3:.2f} | {cycles} |")
    start, pause = await pause_round_trip()
    print(f"\nreal process: submit -> command running {start * 1e3:.0f} ms (median, includes Python start-up of "
          f"wrapper and command); pause -> paused {pause * 1e3:.0f} ms (median)")


if __name__ == "__main__":
    asyncio.run(main())
