"""Helpers for the policy tests: build snapshots tersely and replay decisions.

``apply`` does what the service does with a cycle's decisions (pauses first,
then starts, rejects drop out), so tests can drive successive cycles and tell
the classic stories: quota reclaim, resume after the claimant finishes, and so
on. ``violations`` lists every capacity rule a snapshot breaks, and every
multi-node gang that runs partly (``gang`` builds one).
"""

from __future__ import annotations

import dataclasses
import random
from collections import defaultdict
from collections.abc import Iterable

from gpupool.policy import (
    BUILD_POOL,
    TRAIN_POOL,
    Assignment,
    Decisions,
    Gpu,
    Kind,
    Node,
    PolicyConfig,
    Project,
    Request,
    Snapshot,
    Workload,
    schedule,
)

TRAIN_ONLY = frozenset({TRAIN_POOL})
BUILD_ONLY = frozenset({BUILD_POOL})


def node(name: str, gpus: int = 4, model: str = "A100", pools: frozenset[str] = TRAIN_ONLY,
         cpu: int = 64_000, mem: int = 262_144, gpu_mem: int = 81_920, groups: int = 1, rack: str = "") -> Node:
    per_group = max(gpus // groups, 1)
    return Node(
        name, cpu, mem,
        tuple(Gpu(f"{name}-g{i}", i, model, gpu_mem, f"grp{i // per_group}") for i in range(gpus)),
        pools, rack,
    )


def project(name: str, guarantee: float = 0, limit: float | None = None, weight: float = 1.0,
            build: float = 0) -> Project:
    return Project(
        name,
        build_quota_milli=round(build * 1000),
        train_guarantee_milli=round(guarantee * 1000),
        train_limit_milli=None if limit is None else round(limit * 1000),
        weight=weight,
    )


def train(wid: str, proj: str, gpus: int = 1, milli: int = 0, prio: int = 0, t: float = 0.0,
          cpu: int = 0, mem: int = 0, models: Iterable[str] = ()) -> Workload:
    req = Request(gpus=gpus if not milli else 0, gpu_milli=milli, cpu_milli=cpu, memory_mib=mem,
                  gpu_models=frozenset(models))
    return Workload(wid, proj, Kind.TRAIN, req, priority=prio, submitted_at=t)


def build(wid: str, proj: str, milli: int = 0, gpus: int = 0, t: float = 0.0, mem_mib: int = 0) -> Workload:
    req = Request(gpus=gpus, gpu_milli=milli, gpu_memory_mib=mem_mib)
    return Workload(wid, proj, Kind.BUILD, req, submitted_at=t)


def gang(gid: str, proj: str, replicas: int, gpus: int, prio: int = 0, t: float = 0.0, cpu: int = 0,
         mem: int = 0, size: int | None = None) -> list[Workload]:
    """The ``replicas`` workloads of multi-node gang ``gid`` (``gpus`` whole GPUs each), ids ``gid-0``..."""
    return [dataclasses.replace(train(f"{gid}-{k}", proj, gpus=gpus, prio=prio, t=t, cpu=cpu, mem=mem),
                                gang=gid, gang_size=replicas if size is None else size)
            for k in range(replicas)]


def partial_gangs(s: Snapshot) -> list[str]:
    """Gangs of ``s`` with some replicas running and others pending (a gang must never run partly)."""
    state: dict[str, set[bool]] = defaultdict(set)
    for w in s.workloads:
        if w.gang:
            state[w.gang].add(w.running)
    return sorted(g for g, seen in state.items() if len(seen) > 1)


def on(w: Workload, node_name: str, *gpu_slots: int, started: float = 0.0) -> Workload:
    """``w`` already running on ``node_name``: whole GPUs at the given slots, or one fraction at the first."""
    milli = w.request.gpu_milli or 1000
    gpus = tuple((f"{node_name}-g{i}", milli) for i in gpu_slots)
    return dataclasses.replace(w, assignment=Assignment(node_name, gpus), started_at=started)


def snap(nodes: Iterable[Node], projects: Iterable[Project], workloads: Iterable[Workload],
         now: float = 1000.0, **config: object) -> Snapshot:
    cfg = PolicyConfig(**{"min_runtime_s": 0.0, "resume_backoff_s": 0.0, **config})  # type: ignore[arg-type]
    return Snapshot(tuple(nodes), tuple(projects), tuple(workloads), now=now, config=cfg)


def apply(s: Snapshot, d: Decisions, now: float | None = None) -> Snapshot:
    """The snapshot after the service carried out ``d`` (pauses, then starts; rejects leave)."""
    t = s.now if now is None else now
    paused = {p.workload_id for p in d.preempts}
    started = {st.workload_id: st.assignment for st in d.starts}
    rejected = {r.workload_id for r in d.rejects}
    out = []
    for w in s.workloads:
        if w.id in rejected:
            continue
        if w.id in paused:
            w = dataclasses.replace(w, assignment=None, started_at=None, paused_at=t, attempts=w.attempts + 1)
        if w.id in started:
            w = dataclasses.replace(w, assignment=started[w.id], started_at=t)
        out.append(w)
    return dataclasses.replace(s, workloads=tuple(out), now=t)


def cycle(s: Snapshot, advance: float = 1.0) -> tuple[Snapshot, Decisions]:
    """Run one cycle and apply it; time moves on by ``advance`` seconds first."""
    s = dataclasses.replace(s, now=s.now + advance)
    d = schedule(s)
    return apply(s, d), d


def finish(s: Snapshot, *ids: str) -> Snapshot:
    return dataclasses.replace(s, workloads=tuple(w for w in s.workloads if w.id not in ids))


def submit(s: Snapshot, *ws: Workload) -> Snapshot:
    return dataclasses.replace(s, workloads=s.workloads + tuple(ws))


def running_ids(s: Snapshot, proj: str | None = None) -> set[str]:
    return {w.id for w in s.workloads if w.running and (proj is None or w.project == proj)}


def usage(s: Snapshot, proj: str, kind: Kind = Kind.TRAIN) -> int:
    return sum(w.assignment.total_milli for w in s.workloads
               if w.running and w.project == proj and w.kind is kind and w.assignment)


def train_usage(s: Snapshot) -> dict[str, int]:
    """Training milli-GPU each project runs in ``s`` (0 for a project with none)."""
    used: dict[str, int] = defaultdict(int)
    for w in s.workloads:
        if w.kind is Kind.TRAIN and w.assignment is not None:
            used[w.project] += w.assignment.total_milli
    return used


def assert_same_decisions_whatever_the_order(s: Snapshot, rnd: random.Random) -> None:
    """The engine decides the same twice, and with the workloads shuffled by ``rnd``."""
    d = schedule(s)
    assert schedule(s) == d
    shuffled = list(s.workloads)
    rnd.shuffle(shuffled)
    assert schedule(dataclasses.replace(s, workloads=tuple(shuffled))) == d


def assert_no_project_pushed_below_its_guarantee(s: Snapshot) -> None:
    """After one cycle no project is below min(guarantee, what it ran), unless its own claim paused it.

    A project's own claimants (a higher-priority job, its kernels within the build quota, or its gang
    restarting whole: docs/policy.md) may take it below its guarantee; nobody else's may.
    """
    d = schedule(s)
    before_use, after_use = train_usage(s), train_usage(apply(s, d))
    by_id = {w.id: w for w in s.workloads}
    own = {by_id[p.workload_id].project for p in d.preempts
           if "of the same project" in p.reason or "restarts whole" in p.reason}
    for p in s.projects:
        if p.name not in own:
            assert after_use[p.name] >= min(p.train_guarantee_milli, before_use[p.name])


def violations(s: Snapshot) -> list[str]:
    """Every capacity rule the running workloads of ``s`` break (empty when all is well)."""
    problems = []
    nodes = {n.name: n for n in s.nodes}
    gpu_used: dict[str, int] = defaultdict(int)
    cpu_used: dict[str, int] = defaultdict(int)
    mem_used: dict[str, int] = defaultdict(int)
    build_used: dict[str, int] = defaultdict(int)
    for w in s.workloads:
        a = w.assignment
        if a is None:
            continue
        n = nodes[a.node]
        gpu_ids = {g.id: g for g in n.gpus}
        pool = BUILD_POOL if w.kind is Kind.BUILD else TRAIN_POOL
        if pool not in n.pools:
            problems.append(f"{w.id} runs on {n.name}, outside the {pool} pool")
        cpu_used[a.node] += w.request.cpu_milli
        mem_used[a.node] += w.request.memory_mib
        r = w.request
        if r.gpus and len(a.gpus) != r.gpus:
            problems.append(f"{w.id} asked {r.gpus} GPUs, got {len(a.gpus)}")
        if r.gpu_milli and (len(a.gpus) != 1 or a.gpus[0][1] != r.gpu_milli):
            problems.append(f"{w.id} asked {r.gpu_milli} milli, got {a.gpus}")
        if len({gid for gid, _ in a.gpus}) != len(a.gpus):
            problems.append(f"{w.id} holds one GPU twice")
        for gid, milli in a.gpus:
            if gid not in gpu_ids:
                problems.append(f"{w.id} holds GPU {gid} which is not on {a.node}")
                continue
            if r.gpu_models and gpu_ids[gid].model not in r.gpu_models:
                problems.append(f"{w.id} got model {gpu_ids[gid].model}")
            gpu_used[gid] += milli
        if w.kind is Kind.BUILD:
            build_used[w.project] += a.total_milli
    for n in s.nodes:
        if cpu_used[n.name] > n.cpu_milli:
            problems.append(f"{n.name} CPU over capacity")
        if mem_used[n.name] > n.memory_mib:
            problems.append(f"{n.name} memory over capacity")
        for g in n.gpus:
            if gpu_used[g.id] > g.capacity_milli:
                problems.append(f"GPU {g.id} over capacity: {gpu_used[g.id]}")
    quotas = {p.name: p.build_quota_milli for p in s.projects}
    for name, used in build_used.items():
        if used > quotas.get(name, 0):
            problems.append(f"project {name} build use {used} over quota {quotas.get(name, 0)}")
    problems += [f"gang {g} runs partly" for g in partial_gangs(s)]
    return problems
