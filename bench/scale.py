"""How long one policy cycle takes at cluster scale.

Run: ``python -m bench.scale`` (``--quick`` for fewer repeats, ``--append`` to
add the table to docs/benchmarks-history.md; the current figures in
docs/benchmarks.md are then updated by hand). Prints one table:

* **openb 90%**: the Alibaba openb cluster (1,213 nodes, 6,212 GPUs) filled to
  about 90% of its GPU share with pods of ``openb_pod_list_default.csv``, and
  10,000 pending pods drawn from the same list;
* **synthetic full**: 1,000 nodes x 8 GPUs with 8,000 running one-GPU jobs and
  10,000 pending jobs of openb shapes, in 20 projects whose guarantees cover
  the cluster, so some pending work is within its guarantee and triggers
  reclaim;
* **placements/s**: an empty synthetic cluster and 10,000 pending jobs that
  nearly all fit: starts per second of cycle time;
* **growth**: the synthetic full cluster at 1k, 10k and 100k pending;
* **gangs**: the synthetic full cluster with 10,000 pending *jobs* of which
  10% are multi-node gangs of 2-16 replicas (each replica 1, 2, 4 or 8 whole
  GPUs; so about 18,000 pending workloads, one per replica), issue 12's case.
  ``--gangs-only`` runs just these rows.

Each row is the p50 and p99 of the cycle time over repeated cycles on the same
snapshot (the engine is deterministic, so every repeat decides the same).
The openb files live in ``../shared/traces/openb`` beside the project root;
without them the script says so and exits non-zero.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import datetime as dt
import platform
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from gpupool.policy import (
    MILLI,
    Assignment,
    Decisions,
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
from gpupool.policy.placement import FreeState

CACHE = PolicyCache()
"""The policy's carries from cycle to cycle, kept through this process as the service keeps one."""


def cycle(snap: Snapshot) -> Decisions:
    """One policy cycle as the service runs it: with the carries of the cycles before (:data:`CACHE`)."""
    return schedule(snap, CACHE)

ROOT = Path(__file__).resolve().parent.parent
OPENB = ROOT.parent / "shared" / "traces" / "openb"
NODE_LIST = OPENB / "openb_node_list_gpu_node.csv"
POD_LIST = OPENB / "openb_pod_list_default.csv"
MODEL_MEMORY_MIB = {"T4": 15_360, "P100": 16_384, "V100M16": 16_384, "V100M32": 32_768, "A10": 24_576,
                    "G2": 24_576, "G3": 32_768}
N_PROJECTS = 20


@dataclass(frozen=True)
class Row:
    name: str
    placement: str
    nodes: int
    gpus: int
    running: int
    pending: int
    p50_ms: float
    p99_ms: float
    cpu_p50_ms: float
    starts: int
    preempts: int

    @property
    def starts_per_s(self) -> float:
        """Starts per second of CPU time (wall time on a shared machine mostly measures the neighbours)."""
        return self.starts / (self.cpu_p50_ms / 1000) if self.cpu_p50_ms else 0.0


# ------------------------------------------------------------------ inputs


def openb_nodes() -> list[Node]:
    nodes = []
    with NODE_LIST.open() as f:
        for row in csv.DictReader(f):
            n, model = int(row["gpu"]), row["model"]
            gpus = tuple(
                Gpu(f"{row['sn']}-g{i}", i, model, MODEL_MEMORY_MIB.get(model, 16_384), "pcie0") for i in range(n)
            )
            nodes.append(Node(row["sn"], int(row["cpu_milli"]), int(row["memory_mib"]), gpus))
    return nodes


def openb_requests(keep_models: bool) -> list[Request]:
    """GPU pods of the default list as requests (CPU-only pods left out: the bench is about GPUs)."""
    out = []
    with POD_LIST.open() as f:
        for row in csv.DictReader(f):
            num, milli = int(row["num_gpu"]), int(row["gpu_milli"])
            if num == 0:
                continue
            models = frozenset(m for m in row["gpu_spec"].split("|") if m) if keep_models else frozenset()
            cpu, mem = int(row["cpu_milli"]), int(row["memory_mib"])
            if num == 1 and milli < MILLI:
                out.append(Request(gpu_milli=milli, gpu_models=models, cpu_milli=cpu, memory_mib=mem))
            else:
                out.append(Request(gpus=num, gpu_models=models, cpu_milli=cpu, memory_mib=mem))
    return out


def projects(total_milli: int, guaranteed: float = 1.0) -> tuple[Project, ...]:
    each = int(total_milli * guaranteed / N_PROJECTS) // MILLI * MILLI
    return tuple(
        Project(f"p{i:02d}", build_quota_milli=0, train_guarantee_milli=each, weight=1.0 + i % 3)
        for i in range(N_PROJECTS)
    )


def pending_jobs(shapes: list[Request], n: int, rng: random.Random, start: int = 0) -> list[Workload]:
    return [
        Workload(
            f"q{start + i:06d}", f"p{rng.randrange(N_PROJECTS):02d}", Kind.TRAIN, rng.choice(shapes),
            priority=rng.choice((0, 0, 0, 1)), submitted_at=float(rng.randrange(0, 3600)),
        )
        for i in range(n)
    ]


GANG_GPUS = (1, 2, 4, 8, 8)  # GPUs per replica (8: a whole synthetic node per replica, the common case)


def gang_jobs(shapes: list[Request], n: int, rng: random.Random, share: float = 0.10,
              start: int = 300_000) -> list[Workload]:
    """``n`` pending jobs, ``share`` of them multi-node gangs of 2-16 replicas (one workload per replica)."""
    out: list[Workload] = []
    for i in range(n):
        project = f"p{rng.randrange(N_PROJECTS):02d}"
        priority = rng.choice((0, 0, 0, 1))
        t = float(rng.randrange(0, 3600))
        if rng.random() < share:
            g = rng.choice(GANG_GPUS)
            replicas = rng.randint(2, 16)
            req = Request(gpus=g, cpu_milli=8_000 * g, memory_mib=65_536 * g)
            gid = f"g{start + i:06d}"
            out += [Workload(f"{gid}-{k:02d}", project, Kind.TRAIN, req, priority=priority, submitted_at=t,
                             gang=gid, gang_size=replicas) for k in range(replicas)]
        else:
            out.append(Workload(f"q{start + i:06d}", project, Kind.TRAIN, rng.choice(shapes), priority=priority,
                                submitted_at=t))
    return out


def gang_rows(repeats: int) -> list[Row]:
    """The synthetic full cluster with gangs mixed in: first and steady cycle.

    Two readings of "10k pending, 10% gangs": 10,000 pending jobs of which
    10% are gangs (about 18,000 workloads), and 10,000 pending workloads of
    which about 10% are gang replicas (comparable with the rows without gangs).
    """
    rng = random.Random(12)
    snodes = synthetic_nodes()
    srunning = synthetic_running(snodes, rng)
    shapes = openb_requests(keep_models=False)
    sprojects = projects(len(snodes) * 8 * MILLI)
    rows = first_and_steady("synthetic full, 10k pending jobs, 10% gangs of 2-16 replicas",
                            snapshot(snodes, sprojects, srunning + gang_jobs(shapes, 10_000, rng)), repeats)
    mixed = gang_jobs(shapes, 9_000, rng, share=0.0, start=400_000)
    replicas = gang_jobs(shapes, 300, rng, share=1.0, start=500_000)
    while len(replicas) > 1_000:  # whole gangs only: drop the last gang until about a tenth are replicas
        last = replicas[-1].gang
        replicas = [w for w in replicas if w.gang != last]
    rows += first_and_steady("synthetic full, 10k pending workloads, ~10% of them gang replicas",
                             snapshot(snodes, sprojects, srunning + mixed + replicas), repeats)
    return rows


def fill(nodes: list[Node], shapes: list[Request], target: float, rng: random.Random) -> list[Workload]:
    """Running jobs placing random openb shapes until ``target`` of the GPU share is allocated."""
    state = FreeState.from_nodes(nodes, [], None, "firstfit")
    total = sum(g.capacity_milli for n in nodes for g in n.gpus)
    used, running, misses = 0, [], 0
    while used < target * total and misses < 2000:
        req = rng.choice(shapes)
        a = state.find(req)
        if a is None:
            misses += 1
            continue
        state.commit(a, req)
        used += a.total_milli
        running.append(
            Workload(f"r{len(running):06d}", f"p{rng.randrange(N_PROJECTS):02d}", Kind.TRAIN, req,
                     assignment=a, started_at=float(rng.randrange(0, 3000)), submitted_at=0.0)
        )
    return running


def synthetic_nodes(n_nodes: int = 1000) -> list[Node]:
    return [
        Node(f"s{i:04d}", 128_000, 1_048_576,
             tuple(Gpu(f"s{i:04d}-g{j}", j, "A100-80GB", 81_920, f"nvl{j // 4}") for j in range(8)))
        for i in range(n_nodes)
    ]


def synthetic_running(nodes: list[Node], rng: random.Random) -> list[Workload]:
    """One one-GPU job on every GPU, spread over the projects."""
    req = Request(gpus=1, cpu_milli=8_000, memory_mib=65_536)
    out = []
    for node in nodes:
        for g in node.gpus:
            out.append(
                Workload(f"r{len(out):06d}", f"p{rng.randrange(N_PROJECTS):02d}", Kind.TRAIN, req,
                         assignment=Assignment(node.name, ((g.id, MILLI),)),
                         started_at=float(rng.randrange(0, 3000)))
            )
    return out


# ------------------------------------------------------------------ timing


def time_cycles(snap: Snapshot, repeats: int) -> tuple[list[float], list[float], Decisions]:
    """Wall-clock and CPU milliseconds of ``repeats`` cycles (after one warm-up cycle)."""
    cycle(snap)  # warm caches (imports, numpy)
    wall, cpu, d = [], [], None
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        d = cycle(snap)
        cpu.append((time.process_time() - c0) * 1000)
        wall.append((time.perf_counter() - t0) * 1000)
    assert d is not None
    return wall, cpu, d


def applied(snap: Snapshot, d: Decisions) -> Snapshot:
    """The next cycle's snapshot once the service carried out ``d`` (one second later)."""
    paused = {p.workload_id for p in d.preempts}
    started = {s.workload_id: s.assignment for s in d.starts}
    rejected = {r.workload_id for r in d.rejects}
    out = []
    for w in snap.workloads:
        if w.id in rejected:
            continue
        if w.id in paused:
            w = dataclasses.replace(w, assignment=None, started_at=None, paused_at=snap.now, attempts=w.attempts + 1)
        elif w.id in started:
            w = dataclasses.replace(w, assignment=started[w.id], started_at=snap.now)
        out.append(w)
    return dataclasses.replace(snap, workloads=tuple(out), now=snap.now + 1.0)


def measure(name: str, snap: Snapshot, repeats: int) -> tuple[Row, Decisions]:
    wall, cpu, d = time_cycles(snap, repeats)
    wall.sort()
    p99 = wall[min(len(wall) - 1, int(round(0.99 * (len(wall) - 1))))]
    running = sum(1 for w in snap.workloads if w.assignment is not None)
    row = Row(name, snap.config.placement, len(snap.nodes), sum(len(n.gpus) for n in snap.nodes), running,
              len(snap.workloads) - running, statistics.median(wall), p99, statistics.median(cpu),
              len(d.starts), len(d.preempts))
    print(f"  {row.name} [{row.placement}]: p50 {row.p50_ms:.1f} ms (CPU {row.cpu_p50_ms:.1f}), "
          f"p99 {row.p99_ms:.1f} ms, {row.starts} starts", file=sys.stderr)
    return row, d


def first_and_steady(name: str, snap: Snapshot, repeats: int) -> list[Row]:
    """The cycle on a fresh snapshot, then the next one once its decisions are carried out."""
    first, d = measure(f"{name}: first cycle", snap, repeats)
    steady, _ = measure(f"{name}: next cycle", applied(snap, d), repeats)
    return [first, steady]


def snapshot(nodes: list[Node], projs: tuple[Project, ...], workloads: list[Workload],
             placement: str = "default") -> Snapshot:
    return Snapshot(tuple(nodes), projs, tuple(workloads), now=4000.0,
                    config=PolicyConfig(min_runtime_s=60.0, placement=placement))


def run(repeats: int) -> list[Row]:
    rng = random.Random(42)
    rows = []
    onodes = openb_nodes()
    oshapes = openb_requests(keep_models=True)
    orunning = fill(onodes, oshapes, 0.90, rng)
    ototal = sum(len(n.gpus) for n in onodes) * MILLI
    rows += first_and_steady("openb 90% full, 10k pending",
                             snapshot(onodes, projects(ototal), orunning + pending_jobs(oshapes, 10_000, rng)), repeats)

    snodes = synthetic_nodes()
    sshapes = openb_requests(keep_models=False)
    srunning = synthetic_running(snodes, rng)
    sprojects = projects(len(snodes) * 8 * MILLI)
    spending = pending_jobs(sshapes, 100_000, rng)
    rows += first_and_steady("synthetic full, 10k pending",
                             snapshot(snodes, sprojects, srunning + spending[:10_000]), repeats)

    fresh = snapshot(snodes, sprojects, srunning + spending[:10_000], placement="firstfit")
    rows.append(measure("synthetic full, 10k pending: next cycle", applied(fresh, cycle(fresh)), repeats)[0])

    pending = pending_jobs(sshapes, 10_000, rng, start=200_000)
    for placement in ("default", "firstfit"):
        empty = snapshot(snodes, sprojects, pending, placement=placement)
        rows.append(measure("placements: empty synthetic, 10k pending", empty, max(3, repeats // 4))[0])
    for n in (1_000, 10_000, 100_000):
        reps = repeats if n <= 10_000 else max(3, repeats // 10)
        fresh = snapshot(snodes, sprojects, srunning + spending[:n])
        steady = applied(fresh, cycle(fresh))
        rows.append(measure(f"growth: synthetic full, {n // 1000}k pending, next cycle", steady, reps)[0])
    rows += gang_rows(repeats)
    return rows


# ------------------------------------------------------------------ report


def machine() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        model = next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), "")
    except OSError:
        model = ""
    import os

    load = f", load average {os.getloadavg()[0]:.1f}" if hasattr(os, "getloadavg") else ""
    return (f"{model or platform.processor() or 'unknown CPU'}, {os.cpu_count()} cores{load}, "
            f"Python {platform.python_version()}")


def table(rows: list[Row]) -> str:
    lines = [
        "| case | placement | nodes | GPUs | running | pending | p50 ms | p99 ms | CPU p50 ms | starts | preempts "
        "| starts/CPU-s |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.name} | {r.placement} | {r.nodes} | {r.gpus} | {r.running} | {r.pending} | {r.p50_ms:.1f} "
            f"| {r.p99_ms:.1f} | {r.cpu_p50_ms:.1f} | {r.starts} | {r.preempts} | {r.starts_per_s:,.0f} |"
        )
    return "\n".join(lines)


def block(stamp: str, repeats: int, out: str) -> str:
    return (
        f"\n### `python -m bench.scale`, {stamp}\n\nMachine: {machine()}. {repeats} cycles per row "
        "(fewer for the empty-cluster and 100k rows). p50/p99: wall clock; CPU p50: process time, which is "
        "what the engine costs when the machine is shared.\n\n"
        f"{out}\n"
    )


def add_to_section(text: str, heading: str, addition: str) -> str:
    """Append ``addition`` at the end of section ``heading`` (created at the end if missing)."""
    if heading not in text:
        return text.rstrip("\n") + f"\n\n{heading}\n" + addition
    start = text.index(heading) + len(heading)
    nxt = text.find("\n## ", start)
    if nxt == -1:
        return text.rstrip("\n") + "\n" + addition
    return text[:nxt].rstrip("\n") + "\n" + addition + text[nxt:]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--append", action="store_true", help="append the table to docs/benchmarks-history.md")
    parser.add_argument("--gangs-only", action="store_true", help="only the rows with multi-node gangs")
    args = parser.parse_args(argv)
    if not NODE_LIST.exists() or not POD_LIST.exists():
        print(f"cannot find the openb trace at {OPENB} (see ../shared/README.md)", file=sys.stderr)
        return 1
    repeats = args.repeats or (3 if args.quick else 15)
    rows = gang_rows(repeats) if args.gangs_only else run(repeats)
    out = table(rows)
    print(out)
    if args.append:
        stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        doc = ROOT / "docs" / "benchmarks-history.md"
        text = doc.read_text() if doc.exists() else "# Benchmark history\n"
        doc.write_text(add_to_section(text, "## Policy cycle scale", block(stamp, repeats, out)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
