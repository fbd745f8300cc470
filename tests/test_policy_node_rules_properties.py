"""Placement rules on random pools (hypothesis): no path of the policy ever starts work on a node its rules forbid.

Random nodes (labels, taints, both pools or one), projects with guarantees,
training jobs, gangs and kernels with and without selectors, affinity and
tolerations, some running and paused over several cycles with finishes:
every start (plain placement, reclaim, build reclaim, gangs, starvation
reservations) lands on a node that ``node_rules.allows``, capacity holds,
and the decisions do not depend on the order of the workloads.
"""

from __future__ import annotations

import dataclasses
import random

from hypothesis import given, settings
from hypothesis import strategies as st
from test_policy_helpers import apply, assert_same_decisions_whatever_the_order, partial_gangs, violations

from gpupool.policy import (
    BUILD_POOL,
    TRAIN_POOL,
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
from gpupool.policy.node_rules import Expr, NodeRules, Taint, Toleration, allows

SETTINGS = settings(max_examples=60, deadline=None)
TAINTS = [Taint("dedicated", "inference", "NoSchedule"), Taint("maint", "", "NoExecute"),
          Taint("spot", "", "PreferNoSchedule")]


@st.composite
def nodes(draw: st.DrawFn) -> tuple[Node, ...]:
    out = []
    for i in range(draw(st.integers(1, 5))):
        gpus = tuple(Gpu(f"n{i}-g{j}", j, "A100", 40_000) for j in range(draw(st.sampled_from([2, 4, 8]))))
        labels = {"gpu": draw(st.sampled_from(["a100", "h100"])), "mem": draw(st.sampled_from(["40", "80"]))}
        if draw(st.booleans()):
            labels["zone"] = draw(st.sampled_from(["a", "b"]))
        taints = tuple(t for t in TAINTS if draw(st.integers(0, 3)) == 0)
        pools = draw(st.sampled_from([frozenset({TRAIN_POOL}), frozenset({BUILD_POOL, TRAIN_POOL})]))
        out.append(Node(f"n{i}", 64_000, 262_144, gpus, pools, draw(st.sampled_from(["", "r1"])),
                        tuple(sorted(labels.items())), taints))
    return tuple(out)


RULES = st.one_of(
    st.none(),
    st.just(NodeRules(selector=(("gpu", "h100"),))),
    st.just(NodeRules(required=((Expr("mem", "Gt", ("64",)),), (Expr("zone", "In", ("a",)),)))),
    st.just(NodeRules(required=((Expr("zone", "DoesNotExist"),),), tolerations=(Toleration("", "Exists"),))),
    st.just(NodeRules(tolerations=(Toleration("dedicated", "Equal", "inference", "NoSchedule"),))),
    st.just(NodeRules(selector=(("gpu", "a100"),), preferred=((50, (Expr("zone", "In", ("b",)),)),),
                      tolerations=(Toleration("maint", "Exists"),))),
)


@st.composite
def workloads(draw: st.DrawFn) -> tuple[Workload, ...]:
    out: list[Workload] = []
    for i in range(draw(st.integers(1, 14))):
        rules = draw(RULES)
        project = draw(st.sampled_from(["A", "B"]))
        t = float(draw(st.integers(0, 50)))
        kind = draw(st.sampled_from(["train", "train", "frac", "gang", "build"]))
        if kind == "gang":
            n, g = draw(st.integers(2, 3)), draw(st.sampled_from([1, 2, 4]))
            for k in range(n):
                out.append(Workload(f"g{i}-{k}", project, Kind.TRAIN, Request(gpus=g, rules=rules),
                                    priority=0, submitted_at=t, gang=f"g{i}", gang_size=n))
        elif kind == "build":
            out.append(Workload(f"k{i}", project, Kind.BUILD, Request(gpu_milli=250, rules=rules), submitted_at=t))
        elif kind == "frac":
            out.append(Workload(f"f{i}", project, Kind.TRAIN, Request(gpu_milli=500, rules=rules), submitted_at=t))
        else:
            out.append(Workload(f"j{i}", project, Kind.TRAIN,
                                Request(gpus=draw(st.sampled_from([1, 2, 4])), rules=rules),
                                priority=draw(st.integers(0, 1)), submitted_at=t))
    return tuple(out)


def _bad_starts(s: Snapshot, d) -> list[str]:
    by_name = {n.name: n for n in s.nodes}
    req = {w.id: w.request for w in s.workloads}
    bad = []
    for start in d.starts:
        n = by_name[start.assignment.node]
        if not allows(req[start.workload_id].rules, dict(n.labels), n.taints):
            bad.append(f"{start.workload_id} on {n.name}")
    return bad


@SETTINGS
@given(nodes(), workloads(), st.integers(0, 4), st.booleans(), st.randoms(use_true_random=False))
def test_no_start_ever_breaks_a_placement_rule(ns, ws, guarantee, elastic, rnd):
    projects = (Project("A", build_quota_milli=1000, train_guarantee_milli=guarantee * 1000),
                Project("B", build_quota_milli=1000, train_guarantee_milli=(4 - guarantee) * 1000))
    cfg = PolicyConfig(min_runtime_s=0.0, resume_backoff_s=0.0, starvation_s=3.0, elastic_pool=elastic)
    s = Snapshot(ns, projects, ws, now=100.0, config=cfg)
    for step in range(5):
        d = schedule(s)
        assert not _bad_starts(s, d), _bad_starts(s, d)
        if step == 0:
            assert_same_decisions_whatever_the_order(s, random.Random(rnd.random()))
        s = apply(s, d, now=s.now + 2.0)
        assert not violations(s), violations(s)
        assert not partial_gangs(s)
        running = [w for w in s.workloads if w.running]
        if running and step % 2:  # something ends, so paused and waiting work gets its turn
            gone = rnd.choice(running)
            s = dataclasses.replace(s, workloads=tuple(w for w in s.workloads
                                                       if w.id != gone.id and (not gone.gang or w.gang != gone.gang)))
