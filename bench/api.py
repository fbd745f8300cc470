"""Benchmark the scheduler service through its HTTP API, on simulated GPUs.

Runs `gpupool serve` as a separate process (as in production) and measures,
from a client process:

1. submissions/s: N jobs submitted by C concurrent clients into a pool whose
   GPUs are busy (the queue grows from 0 to N), with per-request latency;
2. submit -> running latency: N one-GPU jobs (``true``) submitted one after
   another into a pool with room, measured by the client (the submit reply or
   the event stream says "running") and by the service (started_at -
   submitted_at, which includes spawning the process);
3. reclaim: project A borrows every GPU, project B submits one job; time from
   B's submission to the victim's "paused" event and to B's "running" event;
4. memory: the service's RSS when idle and empty, and after a restart with
   H finished jobs in its history (seeded straight into its SQLite store, then
   queried through the API).

Prints one table; with ``--append`` adds it, with the machine and date, to
docs/benchmarks-history.md under "## Scheduler service API" (the current figure
in docs/benchmarks.md is then updated by hand).

    .venv/bin/python bench/api.py [--jobs 1000] [--concurrency 16] [--history 100000] [--append]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tornado.httpclient import AsyncHTTPClient  # noqa: E402

from bench._serve import ServeProcess  # noqa: E402
from gpupool.client import AsyncGpupoolClient  # noqa: E402

TOKEN = "bench-admin"
SETTINGS = {"tick_s": 1.0, "poll_s": 0.02, "pause_grace_s": 5.0, "min_runtime_s": 0.0, "resume_backoff_s": 0.0,
            "on_shutdown": "stop", "history_interval_s": 5.0, "watchdog": "off",
            "run_jobs_as": "service"}  # the bench's users are tokens, not Unix accounts
SLEEP = ["sleep", "3600"]


def service(state_dir: Path, simulate: str) -> ServeProcess:
    """`gpupool serve` with this benchmark's settings and token."""
    return ServeProcess(state_dir, simulate, SETTINGS, TOKEN)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def cancel_live(client: AsyncGpupoolClient) -> None:
    from gpupool.wire.errors import Conflict

    while True:
        live = await client.jobs(state="queued,running,paused", limit=1000)
        if not live:
            return
        for chunk in range(0, len(live), 32):
            results = await asyncio.gather(*(client.cancel(j["id"]) for j in live[chunk:chunk + 32]),
                                           return_exceptions=True)
            for r in results:
                if isinstance(r, Exception) and not isinstance(r, Conflict):
                    raise r
        await asyncio.sleep(0.2)


async def wait_for(client: AsyncGpupoolClient, since: int, match: Any, timeout: float = 60) -> tuple[float, int]:
    """Long-poll events until ``match(event)``; returns (perf_counter when seen, last seq)."""
    deadline = time.perf_counter() + timeout
    while time.perf_counter() < deadline:
        reply = await client.events(since=since, timeout=5)
        now = time.perf_counter()
        for event in reply["events"]:
            if match(event):
                return now, event["seq"]
        since = reply["last"]
    raise SystemExit("timed out waiting for an event")


async def bench_submissions(client: AsyncGpupoolClient, jobs: int, concurrency: int) -> dict[str, float]:
    spec = {"project": "bench", "gpus": 1, "command": SLEEP}
    latencies: list[float] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(jobs):
        queue.put_nowait(i)

    async def worker() -> None:
        while not queue.empty():
            i = queue.get_nowait()
            t0 = time.perf_counter()
            await client.submit({**spec, "name": f"load-{i}"})
            latencies.append(time.perf_counter() - t0)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall = time.perf_counter() - t0
    t1 = time.perf_counter()
    await cancel_live(client)
    cancel_wall = time.perf_counter() - t1
    return {"rate": jobs / wall, "p50": pct(latencies, 0.5), "p99": pct(latencies, 0.99), "wall": wall,
            "cancel_rate": jobs / cancel_wall}


async def bench_api_layer(client: AsyncGpupoolClient, requests: int, concurrency: int) -> float:
    """Requests/s of an endpoint that does no scheduling work (auth + JSON): the HTTP layer's own ceiling."""
    per_worker = requests // concurrency

    async def worker() -> None:
        for _ in range(per_worker):
            await client.whoami()

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return per_worker * concurrency / (time.perf_counter() - t0)


async def bench_latency(client: AsyncGpupoolClient, jobs: int) -> dict[str, float]:
    client_side: list[float] = []
    server_side: list[float] = []
    ids = []
    since = (await client.events(since=0))["last"]
    for i in range(jobs):
        t0 = time.perf_counter()
        job = await client.submit({"project": "bench", "gpus": 1, "command": ["true"], "name": f"lat-{i}"})
        if job["state"] == "running":
            t1 = time.perf_counter()
        else:
            t1, since = await wait_for(client, since, lambda e, j=job["id"]: e.get("job_id") == j
                                       and e.get("state") in ("running", "succeeded", "failed"))
        client_side.append(t1 - t0)
        ids.append(job["id"])
        if i % 8 == 7:  # let the short jobs end so the pool has room, as a steady stream would
            await asyncio.sleep(0.05)
    for job_id in ids[-min(jobs, 1000):]:
        job = await client.job(job_id)
        if job["started_at"] is not None:
            server_side.append(job["started_at"] - job["submitted_at"])
    return {"client_p50": pct(client_side, 0.5), "client_p99": pct(client_side, 0.99),
            "server_p50": pct(server_side, 0.5), "server_p99": pct(server_side, 0.99)}


async def bench_reclaim(client: AsyncGpupoolClient, gpus: int, trials: int) -> dict[str, float]:
    await client.set_project("A", train_guarantee=gpus // 2)
    await client.set_project("B", train_guarantee=gpus // 2)
    to_pause: list[float] = []
    to_start: list[float] = []
    for _ in range(trials):
        await cancel_live(client)
        a_ids = [(await client.submit({"project": "A", "gpus": 1, "command": SLEEP}))["id"] for _ in range(gpus)]
        while True:
            states = [(await client.job(j))["state"] for j in a_ids]
            if all(state == "running" for state in states):
                break
            await asyncio.sleep(0.05)
        since = (await client.events(since=0))["last"]
        t0 = time.perf_counter()
        b = await client.submit({"project": "B", "gpus": 1, "command": SLEEP})
        paused_at: float | None = None
        started_at: float | None = time.perf_counter() if b["state"] == "running" else None
        deadline = time.perf_counter() + 60
        while (paused_at is None or started_at is None) and time.perf_counter() < deadline:
            reply = await client.events(since=since, timeout=5)
            now = time.perf_counter()
            for e in reply["events"]:
                if e.get("job_id") in a_ids and e.get("state") == "paused" and paused_at is None:
                    paused_at = now
                if e.get("job_id") == b["id"] and e.get("state") == "running" and started_at is None:
                    started_at = now
            since = reply["last"]
        if paused_at is None or started_at is None:
            raise SystemExit("reclaim did not happen within 60 s")
        to_pause.append(paused_at - t0)
        to_start.append(started_at - t0)
    await cancel_live(client)
    return {"pause_p50": statistics.median(to_pause), "pause_max": max(to_pause),
            "start_p50": statistics.median(to_start), "start_max": max(to_start), "trials": trials}


def seed_history(state_dir: Path, count: int) -> None:
    """Write ``count`` finished jobs into a fresh store, as months of use would leave them."""
    from gpupool.service.store import JobRecord, ProjectRecord, Store

    store = Store(state_dir / "state.db", synchronous="NORMAL")
    store.upsert_project(ProjectRecord(name="bench", train_guarantee_milli=4000, created_at=time.time()))
    now = time.time() - count
    states = ["succeeded", "failed", "cancelled"]
    with store.transaction():
        for i in range(count):
            num = store.next_job_number()
            t = now + i
            store.insert_job(JobRecord(
                id=f"j-{num:06d}", num=num, name=f"hist-{i}", project="bench", user=f"user{i % 20}", kind="train",
                state=states[i % 3], request={"gpus": 1, "gpu_fraction": None, "gpu_memory": None,
                                              "gpu_model": None, "cpu": None, "memory": None},
                submitted_at=t, started_at=t + 0.1, finished_at=t + 0.9, attempts=1, reason="exited with code 0",
                exit_code=0, workdir="/tmp", command=["python", "train.py", "--seed", str(i)],
                labels={"sweep": "s1"}))
    store.close()


async def bench_memory(root: Path, history: int, simulate: str) -> dict[str, float]:
    empty = service(root / "empty", simulate)
    empty.start()
    try:
        client = AsyncGpupoolClient(empty.url, TOKEN)
        await client.status()
        await client.jobs(limit=1000)
        rss_empty = empty.rss()[0]
    finally:
        empty.stop()
    t0 = time.perf_counter()
    seed_history(root / "full", history)
    seed_s = time.perf_counter() - t0
    full = service(root / "full", simulate)
    start_s = full.start()
    try:
        client = AsyncGpupoolClient(full.url, TOKEN)
        t1 = time.perf_counter()
        listed = await client.jobs(limit=1000)
        list_s = time.perf_counter() - t1
        await client.jobs(user="user3", state="failed", limit=100)
        await client.status()
        job = await client.submit({"project": "bench", "gpus": 1, "command": ["true"]})
        assert job["id"] == f"j-{history + 1:06d}", job["id"]
        assert len(listed) == 1000
        rss, hwm = full.rss()
    finally:
        full.stop()
    return {"rss_empty": rss_empty, "rss_full": rss, "hwm_full": hwm, "seed_s": seed_s, "start_s": start_s,
            "list_s": list_s}


async def run(args: argparse.Namespace) -> list[tuple[str, str, str]]:
    AsyncHTTPClient.configure(None, max_clients=max(args.concurrency, 10))
    root = Path(tempfile.mkdtemp(prefix="gpupool-bench-"))
    rows: list[tuple[str, str, str]] = []
    svc = service(root / "main", f"{args.gpus}xA100-80GB")
    svc.start()
    try:
        client = AsyncGpupoolClient(svc.url, TOKEN, timeout=120)
        await client.set_project("bench", train_guarantee=args.gpus)
        layer = await bench_api_layer(client, 2000, args.concurrency)
        sub = await bench_submissions(client, args.jobs, args.concurrency)
        rows += [
            (f"submissions/s ({args.jobs} jobs, {args.concurrency} clients, queue 0->{args.jobs})",
             f"{sub['rate']:.0f}/s", ">= 500/s"),
            ("submit request latency p50 / p99", f"{sub['p50'] * 1e3:.1f} / {sub['p99'] * 1e3:.1f} ms", ""),
            (f"cancels/s ({args.jobs} jobs)", f"{sub['cancel_rate']:.0f}/s", ""),
            (f"HTTP layer alone: GET /whoami requests/s ({args.concurrency} clients)", f"{layer:.0f}/s", ""),
        ]
        lat = await bench_latency(client, args.jobs)
        rows += [
            (f"submit->running, client-seen p50 / p99 ({args.jobs} jobs)",
             f"{lat['client_p50'] * 1e3:.1f} / {lat['client_p99'] * 1e3:.1f} ms", "p50 < 50 ms + process start"),
            ("submit->running, service-recorded p50 / p99 (incl. spawn)",
             f"{lat['server_p50'] * 1e3:.1f} / {lat['server_p99'] * 1e3:.1f} ms", ""),
        ]
        rec = await bench_reclaim(client, args.gpus, args.trials)
        rows += [
            (f"reclaim: B submits -> victim paused, p50 / max ({rec['trials']} trials)",
             f"{rec['pause_p50'] * 1e3:.0f} / {rec['pause_max'] * 1e3:.0f} ms", ""),
            ("reclaim: B submits -> B running, p50 / max",
             f"{rec['start_p50'] * 1e3:.0f} / {rec['start_max'] * 1e3:.0f} ms", ""),
        ]
    finally:
        svc.stop()
    if args.skip_memory:
        return rows
    mem = await bench_memory(root, args.history, f"{args.gpus}xA100-80GB")
    rows += [
        ("service RSS, empty (after a few requests)", f"{mem['rss_empty'] / 2**20:.0f} MiB", ""),
        (f"service RSS with {args.history:,} jobs in history (peak)",
         f"{mem['rss_full'] / 2**20:.0f} MiB ({mem['hwm_full'] / 2**20:.0f} MiB)", ""),
        (f"start with {args.history:,} jobs in history; list 1000 jobs",
         f"{mem['start_s']:.2f} s; {mem['list_s'] * 1e3:.0f} ms", ""),
    ]
    return rows


def render(rows: list[tuple[str, str, str]]) -> str:
    widths = [max(len(r[i]) for r in rows + [("measure", "result", "target")]) for i in range(3)]
    lines = ["| " + " | ".join(h.ljust(widths[i]) for i, h in enumerate(("measure", "result", "target"))) + " |",
             "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += ["| " + " | ".join(c.ljust(widths[i]) for i, c in enumerate(r)) + " |" for r in rows]
    return "\n".join(lines)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{platform.node()}: {cpu}, {os.cpu_count()} cores, Linux {platform.release()}, Python {platform.python_version()}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--gpus", type=int, default=8, help="simulated A100s")
    parser.add_argument("--trials", type=int, default=10, help="reclaim repetitions")
    parser.add_argument("--history", type=int, default=100_000)
    parser.add_argument("--sync", choices=["FULL", "NORMAL"], default=None,
                        help="SQLite synchronous mode of the service (default: the service's own default, NORMAL; "
                        "NORMAL is safe against kill -9, not power loss)")
    parser.add_argument("--skip-memory", action="store_true", help="leave out the history/RSS measurement")
    parser.add_argument("--append", action="store_true", help="append the table to docs/benchmarks-history.md")
    args = parser.parse_args()
    if args.sync:
        SETTINGS["sqlite_synchronous"] = args.sync
    rows = asyncio.run(run(args))
    table = render(rows)
    stamp = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    header = (f"{stamp}, {machine()}; `bench/api.py --jobs {args.jobs} --concurrency {args.concurrency} "
              f"--gpus {args.gpus} --history {args.history} --sync {args.sync or 'service default'}"
              f"{' --skip-memory' if args.skip_memory else ''}`")
    print(header)
    print(table)
    if args.append:
        path = ROOT / "docs" / "benchmarks-history.md"
        text = path.read_text() if path.exists() else "# Benchmark history\n"
        section = "## Scheduler service API"
        block = f"\n{header}\n\n{table}\n"
        last_section = [line for line in text.splitlines() if line.startswith("## ")][-1:]
        if last_section != [section]:  # start (or restart) our section at the end: append only
            block = f"\n{section}\n" + block
        with open(path, "a") as f:
            f.write(("\n" if not text.endswith("\n") else "") + block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
