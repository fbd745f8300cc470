"""Benchmark: what running a multi-node gang through one wrapper costs the local executor (issue 12).

Real processes, :class:`gpupool.backends.local.executor.LocalExecutor` alone (no
service): for a one-process job (the plain wrapper) and gangs of 2, 4 and 8
replicas (the gang wrapper, gpupool/backends/local/gang.py), the median over
``--runs`` of

* start: ``launch()`` -> every replica's Python has started (each writes a file);
* fail-stop: a replica exits 3 -> the attempt's exit status is recorded (the
  others are stopped with SIGTERM, which they answer at once);
* pause: ``stop()`` -> the wrapper has ended, every replica stopped;
* log MB/s: every replica prints ``--mb`` MB of 100-byte lines; the wrapper
  copies them to each replica's log and, prefixed, to the job's log (the
  plain wrapper writes the one process's output straight to the file).

    .venv/bin/python -m bench.gang_executor [--runs 5] [--mb 20]
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

from gpupool.backends.base import Launch, ReplicaLaunch
from gpupool.backends.local.executor import LocalExecutor, ProcessHandle

PY = sys.executable
JOB = r"""
import os, signal, sys, time
rank = os.environ.get("RANK", "0"); mode = sys.argv[1]
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
open(f"ready-{rank}", "w").close()
if mode == "wait":
    time.sleep(120)
elif mode == "fail":
    if rank == os.environ.get("FAILER"):
        while not all(os.path.exists(f"ready-{k}") for k in range(int(os.environ["WORLD_SIZE"]))):
            time.sleep(0.001)
        sys.exit(3)
    time.sleep(120)
elif mode == "log":
    line = ("x" * 99 + "\n").encode()
    out = sys.stdout.buffer
    for _ in range(int(float(sys.argv[2]) * 1e6) // 100):
        out.write(line)
    out.flush()
"""


def _launch(work: Path, n: int, mode: str, attempt: int, *args: str) -> Launch:
    script = work / "job.py"
    script.write_text(JOB)
    replicas = tuple(ReplicaLaunch(k, f"node-{k}", {"CUDA_VISIBLE_DEVICES": f"GPU-{k}", "FAILER": str(n - 1)}, {})
                     for k in range(n)) if n > 1 else ()
    return Launch("j-bench", attempt, [PY, str(script), mode, *args], str(work), "bench", "p", replicas=replicas)


def _wait(pred, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise RuntimeError("timed out")
        time.sleep(0.001)


def _ready(work: Path, n: int) -> bool:
    return all((work / f"ready-{k}").exists() for k in range(n))


def _clean(work: Path) -> None:
    for f in work.glob("ready-*"):
        f.unlink()


def one_run(root: Path, n: int, attempt: int, mb: float) -> dict[str, float]:
    ex = LocalExecutor(root / "jobs")
    work = root / "work"
    work.mkdir(exist_ok=True)
    out: dict[str, float] = {}
    _clean(work)
    t0 = time.perf_counter()
    h: ProcessHandle = ex.launch(_launch(work, n, "wait", attempt))
    _wait(lambda: _ready(work, n))
    out["start"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    asyncio.run(ex.stop(h, 10.0))
    out["pause"] = time.perf_counter() - t0
    if n > 1:
        _clean(work)
        h = ex.launch(_launch(work, n, "fail", attempt + 1))
        _wait(lambda: _ready(work, n))
        t0 = time.perf_counter()
        _wait(lambda: ex.exit_code("j-bench", attempt + 1) is not None)
        out["fail"] = time.perf_counter() - t0
        assert ex.exit_code("j-bench", attempt + 1) == 3
        _wait(lambda: not ex.alive(h))
    for f in (root / "jobs" / "j-bench").glob("*.log"):
        f.unlink()
    t0 = time.perf_counter()
    h = ex.launch(_launch(work, n, "log", attempt + 2, str(mb)))
    _wait(lambda: not ex.alive(h), 300)
    out["log"] = n * mb / (time.perf_counter() - t0)
    size = ex.log_path("j-bench").stat().st_size
    assert size >= n * mb * 1e6, size
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--mb", type=float, default=20.0, help="MB each replica prints in the log run")
    args = p.parse_args()
    print(f"# {platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, median of {args.runs} runs")
    print("| processes | start (ms) | replica fails -> exit recorded (ms) | pause (ms) | log MB/s (all replicas) |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        for n in (1, 2, 4, 8):
            runs = [one_run(Path(d) / f"n{n}-{i}", n, 1, args.mb) for i in range(args.runs)]

            def med(key: str, scale: float = 1000.0, runs: list[dict[str, float]] = runs) -> str:
                vals = [r[key] for r in runs if key in r]
                return f"{statistics.median(vals) * scale:.0f}" if vals else "-"

            label = "1 (plain wrapper)" if n == 1 else f"{n} (gang wrapper)"
            print(f"| {label} | {med('start')} | {med('fail')} | {med('pause')} | {med('log', 1.0)} |")


if __name__ == "__main__":
    main()
