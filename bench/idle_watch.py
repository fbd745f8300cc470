"""What the idle watch costs per sample (issue 26, item 4): :meth:`IdleWatch.observe` at a tick.

Run: ``python -m bench.idle_watch`` (``--samples N``). Prints one table: for
256, 1,000 and 10,000 running quarter-GPU jobs over 20 projects (a real
store and job book), the service's CPU per sample (``time.process_time``,
median over the samples) in three steady states: every job busy, every job
idle and flagged (the flags and their events already given), and half each.
Shown also as % of one core at the default 5 s tick. The sampling before it
(NVML, the pid -> job mapping, the history) is bench/utilisation.py's.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from gpupool.service.book import JobBook, Lifecycle
from gpupool.service.gpu_use import JobUse
from gpupool.service.idle import IdleWatch
from gpupool.service.metrics import Metrics
from gpupool.service.store import JobRecord, ProjectRecord, Store
from gpupool.service.usage import DecayedUsage

TICK_S = 5.0
PROJECTS = 20


def _jobs(n: int) -> list[JobRecord]:
    return [JobRecord(id=f"j-{i:06d}", num=i, name=f"job {i}", project=f"p{i % PROJECTS}", user=f"u{i % 50}",
                      kind="build" if i % 2 else "train", state="running", request={"gpu_fraction": 0.25},
                      assignment={"node": "n", "gpus": [{"id": f"GPU-{i // 4}", "milli": 250}]})
            for i in range(n)]


def _measure(n: int, busy_part: float, samples: int, folder: Path) -> float:
    """Median seconds of CPU per observe() once the states are steady."""
    store = Store(folder / f"state-{n}-{busy_part}.db")
    for p in range(PROJECTS):  # both kinds watched, one minute windows: flags come within the warm-up
        store.upsert_project(ProjectRecord(f"p{p}", created_at=1.0, idle={
            "build": {"window_s": 60.0}, "train": {"window_s": 60.0, "action": "flag"}}))
    book = JobBook(store, DecayedUsage(0.0), Lifecycle())
    watch = IdleWatch(book, attempts=None, metrics=Metrics(), max_gap_s=60.0)  # type: ignore[arg-type]
    jobs = _jobs(n)
    busy_until = int(n * busy_part)
    uses = {r.id: JobUse(250, 250, 200.0 if i < busy_until else 1.0, 1 << 30) for i, r in enumerate(jobs)}
    t = 1_000_000.0
    for _ in range(int(60 / TICK_S) + 2):  # warm-up: the idle ones are flagged (their events written)
        watch.observe(t, jobs, uses)
        t += TICK_S
    assert watch.flagged() == n - busy_until
    times = []
    for _ in range(samples):
        start = time.process_time()
        watch.observe(t, jobs, uses)
        times.append(time.process_time() - start)
        t += TICK_S
    store.close()
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=20)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in (256, 1000, 10_000):
            for label, busy in (("all busy", 1.0), ("all idle (flagged)", 0.0), ("half idle", 0.5)):
                s = _measure(n, busy, args.samples, Path(tmp))
                rows.append((n, label, s * 1000, 100 * s / TICK_S))
    print(f"{'running jobs':>12}  {'state':<20}  {'ms CPU / sample':>15}  {'% core at 5 s tick':>18}")
    for n, label, ms, pct in rows:
        print(f"{n:>12}  {label:<20}  {ms:>15.2f}  {pct:>18.3f}")


if __name__ == "__main__":
    main()
