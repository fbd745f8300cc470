"""What a kernel's build claim costs in a policy cycle (gpupool/policy/build_reclaim.py).

Run: ``python -m bench.build_claims``. Prints one table. Each row is a pool of
8-GPU nodes that serve both the build and the train pool, every GPU held by a
one-GPU training job (ten projects, each guaranteed a tenth of the pool, so
their jobs beyond it are preemptible), and a number of pending kernels (two
of three ask a quarter GPU, one a whole GPU; rows with none are the baseline)
of projects with room in their
build quota. Every kernel must pause training to start. Reported: the p50 and
max cycle time over repeats of the same snapshot (the engine is deterministic,
so each repeat decides the same), and what the cycle decided.
"""

from __future__ import annotations

import platform
import statistics
import sys
import time

from gpupool.policy import (
    BUILD_POOL,
    TRAIN_POOL,
    Assignment,
    Gpu,
    Kind,
    Node,
    PolicyCache,
    PolicyConfig,
    Project,
    Request,
    Snapshot,
    Workload,
    schedule,
)

CACHE = PolicyCache()  # the carries from cycle to cycle, as the service keeps them

SIZES = ((1, 1), (1, 4), (100, 0), (100, 20), (100, 200), (500, 0), (500, 50), (500, 1000))
REPEATS = 5


def world(n_nodes: int, n_kernels: int) -> Snapshot:
    """A full shared pool and ``n_kernels`` pending kernels (see the module docstring)."""
    both = frozenset({BUILD_POOL, TRAIN_POOL})
    nodes = tuple(
        Node(f"n{i:04d}", 64_000, 262_144, tuple(Gpu(f"n{i:04d}-g{g}", g, "A100", 81_920) for g in range(8)), both)
        for i in range(n_nodes)
    )
    projects = tuple(
        Project(f"p{j}", build_quota_milli=50_000, train_guarantee_milli=n_nodes * 800) for j in range(10)
    )
    jobs = []
    for i in range(n_nodes):
        for g in range(8):
            k = i * 8 + g
            jobs.append(Workload(f"t{k:05d}", f"p{k % 10}", Kind.TRAIN, Request(gpus=1), priority=g % 2,
                                 assignment=Assignment(f"n{i:04d}", ((f"n{i:04d}-g{g}", 1000),)), started_at=0.0))
    for i in range(n_kernels):
        req = Request(gpus=1) if i % 3 == 0 else Request(gpu_milli=250)
        jobs.append(Workload(f"k{i:05d}", f"p{i % 10}", Kind.BUILD, req, submitted_at=float(i)))
    return Snapshot(nodes, projects, tuple(jobs), now=1000.0, config=PolicyConfig())


def main() -> int:
    print(f"# build claims, {platform.processor() or platform.machine()}, Python {sys.version.split()[0]}")
    print("| nodes x 8 GPUs | training jobs | kernels | p50 cycle (ms) | max (ms) | started | paused | waiting |")
    print("|---|---|---|---|---|---|---|---|")
    for n_nodes, n_kernels in SIZES:
        snap = world(n_nodes, n_kernels)
        times = []
        for _ in range(REPEATS):
            t0 = time.perf_counter()
            d = schedule(snap, CACHE)
            times.append((time.perf_counter() - t0) * 1000)
        print(f"| {n_nodes} | {n_nodes * 8} | {n_kernels} | {statistics.median(times):.1f} | {max(times):.1f} "
              f"| {len(d.starts)} | {len(d.preempts)} | {len(d.waits)} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
