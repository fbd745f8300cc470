"""What fair share over time costs the policy cycle: the same snapshots with and without history.

Run: ``python -m bench.fair_history`` (``--repeats N``). Builds bench.scale's
synthetic cluster (1,000 nodes x 8 GPUs, 8,000 running one-GPU jobs, 20
projects) with 10,000 pending jobs of openb shapes, takes the steady cycle
(the one after the first cycle's decisions are carried out), and times it
with every project's ``recent_milli`` at 0 (no history: the rule as it was)
and with a recent use for every project (the history path), interleaved so
both see the same machine. Two cases: guarantees covering the whole cluster
(reclaim-heavy) and covering half of it (idle capacity handed out in pass 2,
where history orders projects). Prints p50/p99 per case and the ratio.
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import statistics
import sys
import time

from bench.scale import (
    applied,
    cycle,
    openb_requests,
    pending_jobs,
    projects,
    snapshot,
    synthetic_nodes,
    synthetic_running,
)
from gpupool.policy import MILLI, Snapshot


def with_history(snap: Snapshot, rng: random.Random) -> Snapshot:
    """Every project with a recent use between none and twice its guarantee (or 400 GPUs)."""
    projs = tuple(
        dataclasses.replace(p, recent_milli=rng.uniform(0.0, 2.0 * (p.train_guarantee_milli or 400 * MILLI)))
        for p in snap.projects
    )
    return dataclasses.replace(snap, projects=projs)


def steady(guaranteed: float, rng: random.Random) -> Snapshot:
    nodes = synthetic_nodes()
    running = synthetic_running(nodes, rng)
    shapes = openb_requests(keep_models=False)
    fresh = snapshot(nodes, projects(len(nodes) * 8 * MILLI, guaranteed), running + pending_jobs(shapes, 10_000, rng))
    return applied(fresh, cycle(fresh))


def timed(snap: Snapshot) -> float:
    t0 = time.perf_counter()
    cycle(snap)
    return (time.perf_counter() - t0) * 1000.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.fair_history", description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    rng = random.Random(7)
    print(f"{'case':<42}{'no history p50/p99 ms':>24}{'history p50/p99 ms':>22}{'ratio p50':>11}")
    for label, guaranteed in (("guarantees = the whole cluster", 1.0), ("guarantees = half the cluster", 0.5)):
        base = steady(guaranteed, rng)
        hist = with_history(base, rng)
        cycle(base)  # warm-up (imports, caches)
        cycle(hist)
        a, b = [], []
        for _ in range(args.repeats):
            a.append(timed(base))
            b.append(timed(hist))
        a.sort()
        b.sort()
        p99 = min(args.repeats - 1, round(0.99 * (args.repeats - 1)))
        ratio = statistics.median(b) / statistics.median(a)
        print(f"{label + ', 10k pending, steady':<42}{f'{statistics.median(a):.1f}/{a[p99]:.1f}':>24}"
              f"{f'{statistics.median(b):.1f}/{b[p99]:.1f}':>22}{ratio:>10.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
