"""Digests of the decisions of bench.scale's cycles (14 without gangs, 4 with), and the steady cycle's CPU time.

Run: ``python -m bench.decision_digest [REPEATS]`` in two checkouts (e.g. one
from ``git archive`` of an older commit) to show that a change to the policy
decides exactly as before: equal digests mean equal ``repr`` of every
``Decisions``. The openb trace must sit beside the project root (as for
bench.scale).
"""

from __future__ import annotations

import hashlib
import random
import statistics
import sys
import time

from bench.scale import (
    MILLI,
    applied,
    cycle,
    fill,
    gang_jobs,
    openb_nodes,
    openb_requests,
    pending_jobs,
    projects,
    snapshot,
    synthetic_nodes,
    synthetic_running,
)
from gpupool.policy import Decisions, Snapshot


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    repeats = int(argv[0]) if argv else 15
    h = hashlib.sha256()

    def eat(s: Snapshot) -> Decisions:
        d = cycle(s)
        h.update(repr(d).encode())
        return d

    # the same snapshots, from the same random stream, as bench.scale.run
    rng = random.Random(42)
    onodes = openb_nodes()
    oshapes = openb_requests(keep_models=True)
    orunning = fill(onodes, oshapes, 0.90, rng)
    ototal = sum(len(n.gpus) for n in onodes) * MILLI
    first = snapshot(onodes, projects(ototal), orunning + pending_jobs(oshapes, 10_000, rng))
    eat(applied(first, eat(first)))
    snodes = synthetic_nodes()
    sshapes = openb_requests(keep_models=False)
    srunning = synthetic_running(snodes, rng)
    sprojects = projects(len(snodes) * 8 * MILLI)
    spending = pending_jobs(sshapes, 100_000, rng)
    first = snapshot(snodes, sprojects, srunning + spending[:10_000])
    steady = applied(first, eat(first))
    eat(steady)
    first = snapshot(snodes, sprojects, srunning + spending[:10_000], placement="firstfit")
    eat(applied(first, eat(first)))
    pending = pending_jobs(sshapes, 10_000, rng, start=200_000)
    for placement in ("default", "firstfit"):
        eat(snapshot(snodes, sprojects, pending, placement=placement))
    for n in (1_000, 10_000, 100_000):
        first = snapshot(snodes, sprojects, srunning + spending[:n])
        eat(applied(first, eat(first)))
    print("digest of 14 cycles' decisions", h.hexdigest()[:16])
    print("digest of the 4 gang cycles' decisions", gang_digest())
    cpu = []
    for _ in range(repeats):
        c = time.process_time()
        cycle(steady)
        cpu.append((time.process_time() - c) * 1000)
    print(f"steady synthetic 10k cycle: CPU p50 {statistics.median(cpu):.1f} ms, min {min(cpu):.1f} ms")
    return 0


def gang_digest() -> str:
    """The same for bench.scale's gang rows (first and next cycle of both readings), from their random stream."""
    h = hashlib.sha256()
    rng = random.Random(12)
    snodes = synthetic_nodes()
    srunning = synthetic_running(snodes, rng)
    shapes = openb_requests(keep_models=False)
    sprojects = projects(len(snodes) * 8 * MILLI)
    first = snapshot(snodes, sprojects, srunning + gang_jobs(shapes, 10_000, rng))
    mixed = gang_jobs(shapes, 9_000, rng, share=0.0, start=400_000)
    replicas = gang_jobs(shapes, 300, rng, share=1.0, start=500_000)
    while len(replicas) > 1_000:  # as bench.scale.gang_rows
        last = replicas[-1].gang
        replicas = [w for w in replicas if w.gang != last]
    second = snapshot(snodes, sprojects, srunning + mixed + replicas)
    for s in (first, second):
        d = cycle(s)
        h.update(repr(d).encode())
        h.update(repr(cycle(applied(s, d))).encode())
    return h.hexdigest()[:16]


if __name__ == "__main__":
    raise SystemExit(main())
