"""The scenarios whose decisions the golden test pins: bench.scale's cycles, its gangs, and reclaim storms.

Why these: a refactor of the policy (issue 23: mixins into phases, caches
into an object the service owns) must decide exactly as before, at the scale
the policy's speed work was done for and in the rules that change most
(reclaim, build reclaim, gangs, starvation reservations, placement). Each
scenario is a first snapshot and the number of cycles to chain from it: each
next snapshot is the last one with its decisions carried out, one second
later (``bench.scale.applied``), so steady cycles and the caches they use are
covered too.

The snapshots are built here from fixed seeds and the openb trace in
``../shared/traces/openb`` (read, never copied into the project); the golden
file records a digest of each input, so a changed generator reads as "the
scenario changed", never as a changed decision.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from bench.scale import (
    MILLI,
    OPENB,
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
from gpupool.policy import Assignment, Gpu, Kind, Node, PolicyConfig, Project, Request, Snapshot, Workload


@dataclass(frozen=True)
class Scenario:
    """A named first snapshot (built on demand: some take a second) and how many cycles to chain from it."""

    name: str
    build: Callable[[], Snapshot]
    cycles: int
    needs_openb: bool = True


def _openb_full() -> Snapshot:
    """bench.scale's first row: openb filled to 90% of its GPU share, 10k pending pods of its shapes."""
    rng = random.Random(42)
    nodes = openb_nodes()
    shapes = openb_requests(keep_models=True)
    running = fill(nodes, shapes, 0.90, rng)
    total = sum(len(n.gpus) for n in nodes) * MILLI
    return snapshot(nodes, projects(total), running + pending_jobs(shapes, 10_000, rng))


def _synthetic_full(placement: str) -> Callable[[], Snapshot]:
    """1,000 x 8 GPUs all held by one-GPU jobs of 20 projects whose guarantees cover the pool, 10k pending."""
    def build() -> Snapshot:
        rng = random.Random(7)
        nodes = synthetic_nodes()
        running = synthetic_running(nodes, rng)
        pending = pending_jobs(openb_requests(keep_models=False), 10_000, rng)
        return snapshot(nodes, projects(len(nodes) * 8 * MILLI), running + pending, placement=placement)
    return build


def _synthetic_empty(placement: str) -> Callable[[], Snapshot]:
    """An empty synthetic pool and 10k pending jobs that nearly all fit: placement at speed."""
    def build() -> Snapshot:
        rng = random.Random(9)
        nodes = synthetic_nodes()
        pending = pending_jobs(openb_requests(keep_models=False), 10_000, rng, start=200_000)
        return snapshot(nodes, projects(len(nodes) * 8 * MILLI), pending, placement=placement)
    return build


def _gangs(replicas_reading: bool) -> Callable[[], Snapshot]:
    """bench.scale's gang rows: 10k pending jobs, 10% of them gangs; or 10k workloads, ~10% gang replicas."""
    def build() -> Snapshot:
        rng = random.Random(12)
        nodes = synthetic_nodes()
        running = synthetic_running(nodes, rng)
        shapes = openb_requests(keep_models=False)
        projs = projects(len(nodes) * 8 * MILLI)
        if not replicas_reading:
            return snapshot(nodes, projs, running + gang_jobs(shapes, 10_000, rng))
        mixed = gang_jobs(shapes, 9_000, rng, share=0.0, start=400_000)
        replicas = gang_jobs(shapes, 300, rng, share=1.0, start=500_000)
        while len(replicas) > 1_000:  # whole gangs only, as bench.scale.gang_rows
            last = replicas[-1].gang
            replicas = [w for w in replicas if w.gang != last]
        return snapshot(nodes, projs, running + mixed + replicas)
    return build


def _reclaim_storm() -> Snapshot:
    """One project holds the whole pool beyond its guarantee; eleven others claim theirs at once.

    Training and build work, whole GPUs, fractions and 8-GPU jobs, gangs,
    priorities, jobs too young to pause (min_runtime_s) and paused jobs in
    their resume backoff: every reclaim rule has work to do in one cycle.
    """
    rng = random.Random(2026)
    nodes = tuple(
        Node(f"n{i:03d}", 256_000, 2_097_152,
             tuple(Gpu(f"n{i:03d}-g{j}", j, "H100-80GB" if i % 4 else "A100-80GB", 81_920, f"nvl{j // 4}")
                   for j in range(8)),
             group=f"rack{i // 16}")
        for i in range(64)
    )
    projs = (Project("hog", build_quota_milli=4 * MILLI, train_guarantee_milli=32 * MILLI, weight=1.0),
             *(Project(f"t{i:02d}", build_quota_milli=2 * MILLI, train_guarantee_milli=40 * MILLI,
                       weight=1.0 + i % 3, recent_milli=float(rng.randrange(0, 20 * MILLI)))
               for i in range(11)))
    now = 10_000.0
    one = Request(gpus=1, cpu_milli=8_000, memory_mib=65_536)
    work: list[Workload] = []
    for node in nodes:  # the hog: every GPU, whole or in halves, some too young to pause
        for g in node.gpus:
            for half in ((MILLI,) if g.index % 3 else (500, 500)):
                started = now - (30.0 if rng.random() < 0.1 else float(rng.randrange(120, 5000)))
                req = one if half == MILLI else Request(gpu_milli=half, cpu_milli=4_000, memory_mib=32_768)
                work.append(Workload(f"h{len(work):05d}", "hog", Kind.TRAIN, req, priority=rng.choice((0, 0, 1)),
                                     submitted_at=started - 10, assignment=Assignment(node.name, ((g.id, half),)),
                                     started_at=started))
    shapes = (one, Request(gpus=8, cpu_milli=64_000, memory_mib=524_288),
              Request(gpus=2, gpu_models=frozenset({"H100-80GB"}), cpu_milli=16_000, memory_mib=131_072),
              Request(gpu_milli=250, cpu_milli=2_000, memory_mib=16_384))
    for i in range(600):
        project = f"t{rng.randrange(11):02d}"
        t = now - float(rng.randrange(0, 900))
        if i % 40 == 0:  # a gang of 2-6 replicas of 4 GPUs
            size = rng.randint(2, 6)
            req = Request(gpus=4, cpu_milli=32_000, memory_mib=262_144)
            work += [Workload(f"g{i:04d}-{k}", project, Kind.TRAIN, req, submitted_at=t, gang=f"g{i:04d}",
                              gang_size=size) for k in range(size)]
        elif i % 9 == 0:  # a kernel: build work, within or beyond its fixed quota
            kernel = rng.choice((Request(gpu_milli=250), Request(gpu_milli=500), Request(gpus=1)))
            work.append(Workload(f"k{i:04d}", project, Kind.BUILD, kernel, submitted_at=t))
        elif i % 13 == 0:  # paused earlier, some still in their resume backoff
            work.append(Workload(f"p{i:04d}", project, Kind.TRAIN, rng.choice(shapes), submitted_at=t - 3000,
                                 attempts=1, paused_at=now - float(rng.randrange(0, 90))))
        else:
            work.append(Workload(f"q{i:04d}", project, Kind.TRAIN, rng.choice(shapes),
                                 priority=rng.choice((0, 0, 0, 1, 2)), submitted_at=t))
    config = PolicyConfig(min_runtime_s=60.0, resume_backoff_s=30.0, starvation_s=300.0)
    return Snapshot(nodes, projs, tuple(work), now=now, config=config)


SCENARIOS = (
    Scenario("openb-90-full-10k-pending", _openb_full, cycles=2),
    Scenario("synthetic-full-10k-pending", _synthetic_full("default"), cycles=3),
    Scenario("synthetic-full-10k-pending-firstfit", _synthetic_full("firstfit"), cycles=2),
    Scenario("synthetic-empty-10k-pending", _synthetic_empty("default"), cycles=1),
    Scenario("synthetic-empty-10k-pending-firstfit", _synthetic_empty("firstfit"), cycles=1),
    Scenario("gangs-10k-jobs", _gangs(replicas_reading=False), cycles=2),
    Scenario("gangs-10k-workloads", _gangs(replicas_reading=True), cycles=2),
    Scenario("reclaim-storm", _reclaim_storm, cycles=2, needs_openb=False),
)


def openb_present() -> bool:
    """Whether the openb trace is beside the project (``../shared``), as in CI."""
    return OPENB.is_dir()
