"""What allocated vs used costs (issue 26): sampling CPU, history size, report time.

Run: ``python -m bench.utilisation`` (``--samples N``). Prints one table:

1. **Sampling**: the service's CPU per sample with 64 GPUs and 256 GPU
   processes (NVML's answers simulated by a fake ``pynvml``: per GPU its
   memory, 4 processes and their per-process SM samples), each process a
   real sleeping process in its own session, so the pid -> job mapping reads
   ``/proc`` as it does on a GPU server; 256 running quarter-GPU jobs. One
   sample = ``NvmlInventory.sample()`` + :func:`job_use` +
   ``UseHistory.add`` + ``flush`` (a write every 10 s bucket, as at a 10 s
   period), measured with ``time.process_time``; shown as % of one core at a
   10 s period (target <= 1 %).
2. **History size**: the ``gpu_use`` rows 1,000 jobs leave over 90 days
   (starts spread evenly over the 90 days, each running 1 to 47 hours, about
   a day on average: ~11 running at any time): their 5 min rows, and the 10 s
   rows of the last day; the whole state.db after VACUUM (target <= 50 MB).
   Also per job-day, for other mixes.
3. **Report**: ``gpupool report --since 90d`` (and ``--by job``), the CLI as
   a process against ``gpupool serve`` on that state.db, median of 5
   (target <= 1 s).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

from bench._serve import ROOT, ServeProcess
from gpupool.inventory import nvml
from gpupool.service.gpu_use import job_use
from gpupool.service.store import JobRecord, Store
from gpupool.service.use_history import UseHistory
from gpupool.service.watchdog import job_of_process

GIB = 1 << 30
TOKEN = "bench-admin-token"


class FakeNvml:
    """NVML's answers for ``gpus`` GPUs, each with the given pids (4 per GPU), without a driver."""

    NVML_ERROR_NOT_FOUND = 6

    def __init__(self, pids_per_gpu: list[list[int]]) -> None:
        self.pids = pids_per_gpu
        self.t = 1_000_000

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: return len(self.pids)
    def nvmlDeviceGetHandleByIndex(self, i: int) -> int: return i
    def nvmlDeviceGetUUID(self, h: int) -> str: return f"GPU-{h:04d}"
    def nvmlDeviceGetName(self, h: int) -> str: return "NVIDIA H100 80GB HBM3"
    def nvmlDeviceGetPciInfo(self, h: int) -> object: return types.SimpleNamespace(busId=f"00000000:{h:02x}:00.0")
    def nvmlDeviceGetTopologyCommonAncestor(self, a: int, b: int) -> int: return 40
    def nvmlDeviceGetNvLinkState(self, h: int, link: int) -> int: raise RuntimeError("no NVLink")

    def nvmlDeviceGetMemoryInfo(self, h: int) -> object:
        return types.SimpleNamespace(total=80 * GIB, used=len(self.pids[h]) * 2 * GIB)

    def nvmlDeviceGetUtilizationRates(self, h: int) -> object:
        return types.SimpleNamespace(gpu=60)

    def nvmlDeviceGetComputeRunningProcesses(self, h: int) -> list[object]:
        return [types.SimpleNamespace(pid=p, usedGpuMemory=2 * GIB) for p in self.pids[h]]

    def nvmlDeviceGetGraphicsRunningProcesses(self, h: int) -> list[object]:
        return []

    def nvmlDeviceGetProcessUtilization(self, h: int, since: int) -> list[object]:
        # about six samples per process per 10 s (NVML's ring holds a sample every ~1/6 s per busy process)
        self.t += 1
        return [types.SimpleNamespace(pid=p, timeStamp=self.t + k, smUtil=15 + k, memUtil=5)
                for p in self.pids[h] for k in range(6)]


def _job(num: int, gpu: str, state: str = "running") -> JobRecord:
    return JobRecord(id=f"j-{num:06d}", num=num, name=f"job{num}", project=f"p{num % 20}", user=f"u{num % 50}",
                     kind="build" if num % 3 == 0 else "train", state=state, request={"gpu_fraction": 0.25},
                     submitted_at=1.0, assignment={"node": "h", "gpus": [{"id": gpu, "milli": 250}]})


def sampling(samples: int, gpus: int = 64, per_gpu: int = 4) -> float:
    """CPU milliseconds per sample (mean over ``samples``)."""
    sleepers = [subprocess.Popen(["sleep", "600"], start_new_session=True) for _ in range(gpus * per_gpu)]
    try:
        pids = [[sleepers[g * per_gpu + k].pid for k in range(per_gpu)] for g in range(gpus)]
        fake = FakeNvml(pids)
        real = nvml._nvml
        nvml._nvml = lambda: fake  # type: ignore[assignment]
        nvml.UTIL_MIN_INTERVAL_S = 0.0  # samples come 10 s apart in the service: every one reads NVML afresh
        try:
            inv = nvml.NvmlInventory()
        finally:
            nvml._nvml = real  # type: ignore[assignment]
        jobs = [_job(i + 1, f"GPU-{i // per_gpu:04d}") for i in range(gpus * per_gpu)]
        sessions = {p.pid: jobs[i].id for i, p in enumerate(sleepers)}  # each sleeper leads its own session
        nums = {r.id: r.num for r in jobs}
        with tempfile.TemporaryDirectory() as tmp:
            store = Store(Path(tmp) / "state.db")
            history = UseHistory(store)
            now = 1_000_000_000.0
            spent = []
            for _ in range(samples + 1):
                now += 10.0
                t0 = time.process_time()
                uses = job_use(inv.sample(), jobs, lambda pid: job_of_process(pid, sessions))
                history.add(now, {nums[j]: u for j, u in uses.items()})
                history.flush(now)
                spent.append(time.process_time() - t0)
            assert len(uses) == len(jobs) and all(u.used > 0 for u in uses.values())
            store.close()
        return statistics.mean(spent[1:]) * 1000.0
    finally:
        for p in sleepers:
            p.kill()
            p.wait()


def history_store(state_dir: Path, n_jobs: int = 1000, days: int = 90, seed: int = 26) -> tuple[int, int, float]:
    """A state.db as 90 days of 1,000 jobs leave it: (5 min rows, 10 s rows, job-days)."""
    rng = random.Random(seed)
    end = time.time() // 300 * 300  # up to now: the report asks for the 90 days before its call
    start = end - days * 86400
    store = Store(state_dir / "state.db")
    coarse, fine, job_s = [], [], 0.0
    for num in range(1, n_jobs + 1):
        t0 = start + (num - 1) * (days * 86400 / n_jobs)
        t1 = min(end, t0 + rng.uniform(3600, 47 * 3600))
        job_s += t1 - t0
        rec = _job(num, "GPU-0000", state="succeeded")
        rec.started_at, rec.finished_at, rec.assignment = t0, t1, None
        store.insert_job(rec)
        busy = rng.uniform(0.05, 0.95)
        for b in range(int(t0 // 300 * 300), int(t1), 300):
            coarse.append((300, b, num, 250 * 300, 250 * 300, int(250 * 300 * busy), 2 * GIB))
        for b in range(int(max(t0, end - 86400) // 10 * 10), int(t1), 10):
            fine.append((10, b, num, 2500, 2500, int(2500 * busy), 2 * GIB))
    with store.transaction() as db:
        db.executemany("INSERT INTO gpu_use VALUES (?, ?, ?, ?, ?, ?, ?)", coarse + fine)
        db.execute("INSERT INTO meta(key, value) VALUES ('gpu_use_rolled', ?)", (str(int(end)),))
    store.query("VACUUM")
    store.close()
    return len(coarse), len(fine), job_s / 86400


def db_bytes(state_dir: Path) -> int:
    return sum(f.stat().st_size for f in state_dir.glob("state.db*"))


def report_time(state_dir: Path, by: str, repeats: int = 5) -> float:
    """Median seconds of ``gpupool report --since 90d --by BY`` (a CLI process) against a service on ``state_dir``."""
    srv = ServeProcess(state_dir, "64xH100-80GB", {"on_shutdown": "leave", "run_jobs_as": "service"}, TOKEN)
    srv.start()
    try:
        env = dict(os.environ, GPUPOOL_URL=srv.url, GPUPOOL_TOKEN=TOKEN, PYTHONPATH=str(ROOT))
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            out = subprocess.run([sys.executable, "-m", "gpupool", "report", "--since", "90d", "--by", by],
                                 env=env, capture_output=True, text=True, check=True)
            times.append(time.perf_counter() - t0)
        assert "GPU-hours since" in out.stdout, out.stdout[:500]
        return statistics.median(times)
    finally:
        srv.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.utilisation", description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=30, help="samples timed (default 30)")
    args = parser.parse_args(argv)
    per_sample_ms = sampling(args.samples)
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state"
        state.mkdir(mode=0o700)
        coarse, fine, job_days = history_store(state)
        size = db_bytes(state)
        by_project = report_time(state, "project")
        by_job = report_time(state, "job")
    rows = [
        ("sampling: CPU per sample, 64 GPUs, 256 processes", f"{per_sample_ms:.2f} ms",
         f"{per_sample_ms / 10_000 * 100:.3f} % of a core at 10 s", "<= 1 %"),
        ("history: 1,000 jobs over 90 days, state.db", f"{size / 1e6:.1f} MB",
         f"{coarse:,} 5 min rows + {fine:,} 10 s rows; {job_days:.0f} job-days, "
         f"{size / job_days / 1e3:.1f} kB per job-day", "<= 50 MB"),
        ("gpupool report --since 90d (CLI process)", f"{by_project:.2f} s", "--by project, median of 5", "<= 1 s"),
        ("gpupool report --since 90d --by job", f"{by_job:.2f} s", "1,000 rows, median of 5", "<= 1 s"),
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in [("what", "figure", "detail", "target"), *rows]:
        print("  ".join(c.ljust(widths[i]) for i, c in enumerate(r)).rstrip())
    return 0


if __name__ == "__main__":
    sys.exit(main())
