"""Side by side: the steady policy cycle of this checkout against another, alternating, in one run.

A shared machine's load moves a cycle's CPU time by 10-30 % from one minute
to the next, more than most changes to the engine; so a change is measured
against its base in the same minutes: rounds alternate the two checkouts
(the order flips each round), each round a fresh process per checkout that
builds bench.scale's snapshots, runs the first cycle, applies it, and times
the next cycle ``--repeats`` times (CPU time, after one warm-up). The ratio
of the medians is the result; the digests of the decisions show both decide
alike (``bench.decision_digest`` covers more cycles).

    .venv/bin/python -m bench.cycle_ab --before /path/to/other/checkout [--rounds 4] [--repeats 9]

Cases: ``gang-jobs`` (10,000 pending jobs, 10 % of them gangs of 2-16
replicas: ~18,000 pending workloads), ``gang-workloads`` (10,000 pending
workloads, ~10 % of them replicas), ``plain`` (10,000 pending, no gangs), on
1,000 x 8 GPUs fully used, as in bench.scale.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import hashlib, json, random, sys, time
sys.path.insert(0, sys.argv[1])
from bench.scale import (MILLI, applied, gang_jobs, openb_requests, pending_jobs, projects, snapshot,
                         synthetic_nodes, synthetic_running)
import importlib, os
# The checkout's own policy package: gpupool/, or scheduler/ in a checkout from before the rename (the
# editable install puts this project's root on sys.path too, so the name alone could find the other one).
policy = importlib.import_module("gpupool.policy" if os.path.isdir(os.path.join(sys.argv[1], "gpupool"))
                                 else "scheduler.policy")
engine = policy.schedule
if hasattr(policy, "PolicyCache"):  # one PolicyCache through every cycle of the process, as the service keeps one
    _cache = policy.PolicyCache()
    def schedule(s):
        return engine(s, _cache)
else:  # a checkout from before the PolicyCache: its carries were module state
    schedule = engine

def steady(case):
    if case == "plain":
        rng = random.Random(42)
        nodes = synthetic_nodes()
        shapes = openb_requests(keep_models=False)
        running = synthetic_running(nodes, rng)
        first = snapshot(nodes, projects(len(nodes) * 8 * MILLI), running + pending_jobs(shapes, 10_000, rng))
        return applied(first, schedule(first))
    rng = random.Random(12)
    nodes = synthetic_nodes()
    running = synthetic_running(nodes, rng)
    shapes = openb_requests(keep_models=False)
    projs = projects(len(nodes) * 8 * MILLI)
    jobs = gang_jobs(shapes, 10_000, rng)
    if case == "gang-workloads":
        mixed = gang_jobs(shapes, 9_000, rng, share=0.0, start=400_000)
        replicas = gang_jobs(shapes, 300, rng, share=1.0, start=500_000)
        while len(replicas) > 1_000:
            last = replicas[-1].gang
            replicas = [w for w in replicas if w.gang != last]
        jobs = mixed + replicas
    first = snapshot(nodes, projs, running + jobs)
    return applied(first, schedule(first))

out = {}
for case in sys.argv[3].split(","):
    s = steady(case)
    d = schedule(s)
    cpu = []
    for _ in range(int(sys.argv[2])):
        c = time.process_time()
        schedule(s)
        cpu.append((time.process_time() - c) * 1000)
    out[case] = {"cpu": cpu, "digest": hashlib.sha256(repr(d).encode()).hexdigest()[:12]}
print(json.dumps(out))
"""

CASES = ("gang-jobs", "gang-workloads", "plain")


def measure(root: Path, repeats: int, cases: tuple[str, ...]) -> dict:
    """One fresh process of checkout ``root``: per case, the steady cycle's CPU ms and its decisions' digest."""
    r = subprocess.run([sys.executable, "-c", CHILD, str(root), str(repeats), ",".join(cases)],
                       capture_output=True, text=True, cwd=root, check=False)
    if r.returncode != 0:
        raise SystemExit(f"the run in {root} failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, type=Path, help="the other checkout (its root directory)")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--cases", default=",".join(CASES))
    args = parser.parse_args(argv)
    cases = tuple(c for c in args.cases.split(",") if c)
    unknown = set(cases) - set(CASES)
    if unknown:
        parser.error(f"unknown case(s) {', '.join(sorted(unknown))}; known: {', '.join(CASES)}")
    arms = {"before": args.before.resolve(), "after": ROOT}
    cpu: dict[tuple[str, str], list[float]] = {}
    digests: dict[tuple[str, str], set[str]] = {}
    for k in range(args.rounds):
        order = ("before", "after") if k % 2 == 0 else ("after", "before")
        for arm in order:
            got = measure(arms[arm], args.repeats, cases)
            for case, v in got.items():
                cpu.setdefault((arm, case), []).append(statistics.median(v["cpu"]))
                digests.setdefault((arm, case), set()).add(v["digest"])
            print(f"round {k} {arm}: " + ", ".join(f"{c} {statistics.median(got[c]['cpu']):.1f} ms" for c in cases),
                  file=sys.stderr)
    print("| case | before: CPU p50 per round (ms) | after | median before | median after | after / before "
          "| decisions alike |")
    print("|---|---|---|---:|---:|---:|---|")
    for case in cases:
        b, a = cpu[("before", case)], cpu[("after", case)]
        alike = "yes" if digests[("before", case)] == digests[("after", case)] else "NO"
        print(f"| {case} | {', '.join(f'{x:.1f}' for x in b)} | {', '.join(f'{x:.1f}' for x in a)} "
              f"| {statistics.median(b):.1f} | {statistics.median(a):.1f} "
              f"| {statistics.median(a) / statistics.median(b):.2f} | {alike} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
