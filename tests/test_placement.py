"""FreeState: the placement contract the engine relies on, for every policy."""

from __future__ import annotations

import dataclasses
import random
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpupool.policy.model import Assignment, Gpu, Kind, Node, Request, Workload
from gpupool.policy.placement import POLICIES, FreeState
from gpupool.wire.errors import InvalidRequest


def node(name: str, n_gpus: int, model: str = "A100", cpu: int = 64_000, mem: int = 256_000,
         groups: tuple[str, ...] | None = None, pools: frozenset[str] = frozenset({"build", "train"})) -> Node:
    gpus = tuple(
        Gpu(id=f"{name}-g{k}", index=k, model=model, memory_mib=40_000,
            topology_group=groups[k] if groups else "")
        for k in range(n_gpus)
    )
    return Node(name=name, cpu_milli=cpu, memory_mib=mem, gpus=gpus, pools=pools)


def running(wid: str, request: Request, assignment: Assignment) -> Workload:
    return Workload(id=wid, project="p", kind=Kind.TRAIN, request=request, assignment=assignment)


def gpu_used(state: FreeState) -> dict[str, int]:
    """milli taken per GPU id, from the state's arrays."""
    out = {}
    for i, ids in enumerate(state.gpu_ids):
        for j, gid in enumerate(ids):
            out[gid] = int(state.cap[i, j] - state.free[i, j])
    return out


@pytest.mark.parametrize("policy", POLICIES)
def test_whole_gpus_on_one_node(policy: str) -> None:
    state = FreeState.from_nodes([node("a", 2), node("b", 4)], (), policy=policy)
    a = state.find(Request(gpus=3))
    assert a is not None and a.node == "b"
    assert len(a.gpus) == 3 and all(m == 1000 for _, m in a.gpus)
    state.commit(a, Request(gpus=3))
    assert state.find(Request(gpus=3)) is None  # 2 + 1 free, but never split across nodes
    assert state.find(Request(gpus=2)) is not None


@pytest.mark.parametrize("policy", POLICIES)
def test_running_work_is_subtracted_and_pool_filter(policy: str) -> None:
    nodes = [node("a", 2), node("b", 2, pools=frozenset({"build"}))]
    held = running("w1", Request(gpu_milli=600, cpu_milli=1000), Assignment("a", (("a-g0", 600),)))
    state = FreeState.from_nodes(nodes, [held], pool="train", policy=policy)
    assert state.names == ["a"]
    assert state.free_gpu_milli() == 1400
    assert int(state.cpu_free[0]) == 63_000
    a = state.find(Request(gpu_milli=500))
    assert a is not None and a.gpus[0][0] == "a-g1"  # g0 has only 400 left
    assert state.find(Request(gpus=2)) is None


@pytest.mark.parametrize("policy", POLICIES)
def test_fraction_goes_on_one_gpu_with_room(policy: str) -> None:
    state = FreeState.from_nodes([node("a", 1)], (), policy=policy)
    for _ in range(3):
        a = state.find(Request(gpu_milli=300))
        assert a is not None
        state.commit(a, Request(gpu_milli=300))
    assert state.find(Request(gpu_milli=300)) is None
    assert state.find(Request(gpu_milli=100)) is not None


def test_gpu_memory_becomes_milli_of_the_gpu_it_lands_on() -> None:
    small = Node("s", 8000, 64_000, (Gpu("s0", 0, "T4", 16_000),))
    big = Node("b", 8000, 64_000, (Gpu("b0", 0, "A100", 80_000),))
    state = FreeState.from_nodes([small, big], (), policy="firstfit")
    a = state.find(Request(gpu_memory_mib=20_000))
    assert a == Assignment("b", (("b0", 250),))  # 20 GB does not fit a 16 GB card at all
    a = state.find(Request(gpu_memory_mib=4_000))
    assert a == Assignment("s", (("s0", 250),))
    assert not state.fits_empty(Request(gpu_memory_mib=90_000))


@pytest.mark.parametrize("policy", POLICIES)
def test_models_cpu_and_memory_are_respected(policy: str) -> None:
    nodes = [node("t4", 2, model="T4", cpu=8000), node("a100", 2, model="A100", cpu=64_000, mem=1000)]
    state = FreeState.from_nodes(nodes, (), policy=policy)
    assert state.find(Request(gpus=1, gpu_models=frozenset({"T4"}))).node == "t4"
    assert state.find(Request(gpu_milli=200, gpu_models=frozenset({"A100"}))).node == "a100"
    assert state.find(Request(gpus=1, cpu_milli=16_000)).node == "a100"
    assert state.find(Request(gpus=1, memory_mib=2000)).node == "t4"
    assert state.find(Request(gpus=1, cpu_milli=16_000, memory_mib=2000)) is None
    assert state.find(Request(gpus=1, gpu_models=frozenset({"H100"}))) is None
    assert not state.fits_empty(Request(gpus=1, gpu_models=frozenset({"H100"})))
    assert state.fits_empty(Request(gpus=2, gpu_models=frozenset({"T4"})))


@pytest.mark.parametrize("policy", POLICIES)
def test_cpu_only_work_needs_only_cpu_and_memory(policy: str) -> None:
    nodes = [node("gpu", 2, cpu=4000), Node("cpu", 32_000, 64_000)]
    state = FreeState.from_nodes(nodes, (), policy=policy)
    a = state.find(Request(cpu_milli=8000, memory_mib=1000))
    assert a == Assignment("cpu", ())


@pytest.mark.parametrize("policy", POLICIES)
def test_topology_group_is_preferred(policy: str) -> None:
    groups = ("nv0", "nv0", "nv1", "nv1", "nv1", "nv1", "nv2", "nv2")
    state = FreeState.from_nodes([node("a", 8, groups=groups)], (), policy=policy)
    one = Request(gpus=1)
    state.commit(Assignment("a", (("a-g0", 1000),)), one)
    a = state.find(Request(gpus=2))
    ids = {g for g, _ in a.gpus}
    # a 2-GPU job fits inside nv2 (exactly two free) rather than splitting nv1 or using the broken nv0
    assert ids == {"a-g6", "a-g7"}
    a4 = state.find(Request(gpus=4))
    assert {g for g, _ in a4.gpus} == {"a-g2", "a-g3", "a-g4", "a-g5"}


def test_topology_group_preferred_across_nodes() -> None:
    split = node("split", 4, groups=("x", "x", "y", "y"))
    joined = node("joined", 4, groups=("x", "x", "x", "x"))
    state = FreeState.from_nodes([split, joined], (), policy="firstfit")
    state.commit(Assignment("split", (("split-g0", 1000),)), Request(gpus=1))
    state.commit(Assignment("joined", (("joined-g0", 1000),)), Request(gpus=1))
    # both nodes have 3 free GPUs; only "joined" has 3 in one group
    assert state.find(Request(gpus=3)).node == "joined"


def test_bestfit_packs_and_picks_least_free_gpu() -> None:
    state = FreeState.from_nodes([node("a", 2), node("b", 2)], (), policy="bestfit")
    state.commit(Assignment("b", (("b-g1", 700),)), Request(gpu_milli=700))
    a = state.find(Request(gpu_milli=200))
    assert a == Assignment("b", (("b-g1", 200),))  # the busier node, the fuller GPU


def test_default_keeps_whole_gpus_and_nodes_free() -> None:
    nodes = [node(f"n{k}", 4) for k in range(3)]
    state = FreeState.from_nodes(nodes, (), policy="default")
    # a fraction on n1 g0; next fractions should stack there, not break new GPUs or nodes
    state.commit(Assignment("n1", (("n1-g0", 500),)), Request(gpu_milli=500))
    for _ in range(2):
        req = Request(gpu_milli=250)
        a = state.find(req)
        assert a == Assignment("n1", (("n1-g0", 250),))
        state.commit(a, req)
    a = state.find(Request(gpus=1))
    assert a.node == "n1"  # a whole GPU goes on the node already in use, n0 and n2 stay whole
    assert state.find(Request(gpus=4)).node in {"n0", "n2"}


def test_failed_request_is_remembered_until_release() -> None:
    state = FreeState.from_nodes([node("a", 1)], (), policy="default")
    req = Request(gpus=1)
    a = state.find(req)
    state.commit(a, req)
    assert state.find(req) is None
    assert state.find(req) is None
    state.release(a, req)
    assert state.find(req) == a


def test_bad_input_is_refused() -> None:
    state = FreeState.from_nodes([node("a", 1)], ())
    with pytest.raises(InvalidRequest):
        state.find(Request(gpus=1, gpu_milli=500))
    with pytest.raises(InvalidRequest):
        FreeState.from_nodes([node("a", 1)], (), policy="nope")
    with pytest.raises(InvalidRequest):
        state.commit(Assignment("zzz", ()), Request())


def test_empty_pool() -> None:
    state = FreeState.from_nodes([], ())
    assert state.find(Request(gpus=1)) is None
    assert state.find(Request(cpu_milli=1)) is None
    assert not state.fits_empty(Request())


# ---------------------------------------------------------------- properties

requests = st.one_of(
    st.builds(Request, gpus=st.integers(1, 4), cpu_milli=st.sampled_from([0, 2000, 16_000]),
              gpu_models=st.sampled_from([frozenset(), frozenset({"T4"}), frozenset({"A100", "T4"})])),
    st.builds(Request, gpu_milli=st.integers(1, 1000), cpu_milli=st.sampled_from([0, 1000, 8000]),
              memory_mib=st.sampled_from([0, 4000])),
    st.builds(Request, gpu_memory_mib=st.integers(1, 50_000)),
    st.builds(Request, cpu_milli=st.integers(0, 40_000), memory_mib=st.integers(0, 100_000)),
)


def cluster() -> list[Node]:
    return [
        node("a", 8, model="A100", cpu=32_000, groups=("x",) * 4 + ("y",) * 4),
        node("b", 2, model="T4", cpu=16_000, mem=64_000),
        node("c", 4, model="A100", cpu=48_000),
        Node("d", 8000, 16_000, (Gpu("d-g0", 0, "T4", 16_000),)),
        Node("cpu", 64_000, 128_000),
    ]


def check_assignment(state: FreeState, a: Assignment, req: Request) -> None:
    nd = next(n for n in state.nodes if n.name == a.node)
    by_id = {g.id: g for g in nd.gpus}
    assert all(gid in by_id for gid, _ in a.gpus), "gang spread over nodes"
    if req.gpus:
        assert len(a.gpus) == req.gpus and len({g for g, _ in a.gpus}) == req.gpus
    elif req.gpu_milli or req.gpu_memory_mib:
        assert len(a.gpus) == 1
    else:
        assert a.gpus == ()
    if req.gpu_models:
        assert all(by_id[gid].model in req.gpu_models for gid, _ in a.gpus)
    if req.gpu_memory_mib:
        gid, milli = a.gpus[0]
        assert milli * by_id[gid].memory_mib >= req.gpu_memory_mib * 1000


def fits_somewhere(nodes: list[Node], placed: list[tuple[Assignment, Request]], req: Request) -> bool:
    """Brute force, independent of FreeState: does ``req`` fit on any node right now?"""
    for nd in nodes:
        mine = [(a, r) for a, r in placed if a.node == nd.name]
        if nd.cpu_milli - sum(r.cpu_milli for _, r in mine) < req.cpu_milli:
            continue
        if nd.memory_mib - sum(r.memory_mib for _, r in mine) < req.memory_mib:
            continue
        used = {g.id: 0 for g in nd.gpus}
        for a, _ in mine:
            for gid, milli in a.gpus:
                used[gid] += milli
        gpus = [g for g in nd.gpus if not req.gpu_models or g.model in req.gpu_models]
        if req.gpus:
            if sum(1 for g in gpus if used[g.id] == 0) >= req.gpus:
                return True
        elif req.gpu_milli:
            if any(g.capacity_milli - used[g.id] >= req.gpu_milli for g in gpus):
                return True
        elif req.gpu_memory_mib:
            if any(g.capacity_milli - used[g.id] >= -(-req.gpu_memory_mib * 1000 // g.memory_mib) for g in gpus):
                return True
        else:
            return True
    return False


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=st.lists(requests, min_size=1, max_size=30))
def test_never_over_capacity_and_constraints_hold(policy: str, reqs: list[Request]) -> None:
    nodes = cluster()
    state = FreeState.from_nodes(nodes, (), policy=policy)
    placed: list[tuple[Assignment, Request]] = []
    for req in reqs:
        a = state.find(req)
        assert (a is not None) == fits_somewhere(nodes, placed, req), "a fit was missed or invented"
        if a is None:
            continue
        check_assignment(state, a, req)
        state.commit(a, req)
        placed.append((a, req))
        assert (state.free >= 0).all()
        assert (state.cpu_free >= 0).all() and (state.mem_free >= 0).all()
    # an independent recount of use matches the state and never exceeds a GPU
    used: dict[str, int] = {}
    for a, _ in placed:
        for gid, milli in a.gpus:
            used[gid] = used.get(gid, 0) + milli
    assert {k: v for k, v in gpu_used(state).items() if v} == used
    assert all(v <= 1000 for v in used.values())


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=20, deadline=None)
@given(reqs=st.lists(requests, min_size=1, max_size=25))
def test_deterministic_and_release_restores(policy: str, reqs: list[Request]) -> None:
    def play() -> tuple[FreeState, list]:
        state = FreeState.from_nodes(cluster(), (), policy=policy)
        out = []
        for req in reqs:
            a = state.find(req)
            if a is not None:
                state.commit(a, req)
            out.append(a)
        return state, out

    s1, out1 = play()
    s2, out2 = play()
    assert out1 == out2
    fresh = FreeState.from_nodes(cluster(), (), policy=policy)
    for a, req in zip(reversed(out1), reversed(reqs), strict=True):
        if a is not None:
            s1.release(a, req)
    assert (s1.free == fresh.free).all()
    assert (s1.cpu_free == fresh.cpu_free).all() and (s1.mem_free == fresh.mem_free).all()
    assert (s1.whole_free == fresh.whole_free).all() and (s1.max_share == fresh.max_share).all()


@settings(max_examples=20, deadline=None)
@given(reqs=st.lists(requests, min_size=1, max_size=25))
def test_from_running_equals_committing(reqs: list[Request]) -> None:
    """A state rebuilt from running workloads matches the one that placed them."""
    live = FreeState.from_nodes(cluster(), (), policy="default")
    work = []
    for k, req in enumerate(reqs):
        a = live.find(req)
        if a is not None:
            live.commit(a, req)
            work.append(running(f"w{k}", req, a))
    rebuilt = FreeState.from_nodes(cluster(), work, policy="default")
    assert (rebuilt.free == live.free).all() and (rebuilt.cpu_free == live.cpu_free).all()
    probe = Request(gpu_milli=300)
    assert (rebuilt.find(probe) is None) == (live.find(probe) is None)


@settings(max_examples=20, deadline=None)
@given(reqs=st.lists(requests, min_size=1, max_size=25))
def test_frag_cache_matches_a_fresh_rebuild(reqs: list[Request]) -> None:
    """The incrementally kept fragmentation rows equal a from-scratch computation."""
    state = FreeState.from_nodes(cluster(), (), policy="fgd", workload=reqs)
    for req in reqs:
        a = state.find(req)
        if a is not None:
            state.commit(a, req)
    frag = state.frag
    kept = frag.frag_now.copy(), frag.su.copy()
    frag.rebuild()
    assert kept[0] == pytest.approx(frag.frag_now)
    assert kept[1] == pytest.approx(frag.su)


@pytest.mark.parametrize("probe_between", [False, True])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=st.lists(requests, min_size=1, max_size=25))
@example(reqs=[Request(gpus=3, gpu_models=frozenset({"T4"}))])  # fits nowhere: nothing is ever scored
def test_default_rows_kept_from_choosing_match_a_rebuild(probe_between: bool, reqs: list[Request]) -> None:
    """Commit reuses the row computed while choosing; it must equal a from-scratch row.

    With ``probe_between`` another request is looked up between find and commit,
    so the kept row belongs to the probe and commit must recompute instead.
    """
    state = FreeState.from_nodes(cluster(), (), policy="default", workload=reqs)
    probe = Request(gpu_milli=250, cpu_milli=1000)
    for req in reqs:
        a = state.find(req)
        if probe_between:
            state.find(probe)
        if a is not None:
            state.commit(a, req)
    model = state.frag
    kept = model.usable_now.copy(), model.su.copy(), model.ftot.copy(), model.fgd.frag_now.copy(), model.fgd.su.copy()
    model.rebuild()
    model.fgd.rebuild()
    assert kept[0] == pytest.approx(model.usable_now)
    assert kept[1] == pytest.approx(model.su)
    assert kept[2] == pytest.approx(model.ftot)
    assert kept[3] == pytest.approx(model.fgd.frag_now)
    assert kept[4] == pytest.approx(model.fgd.su)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(reqs=st.lists(requests, min_size=1, max_size=30), cpu=st.sampled_from([0, 1000, 6000]))
def test_default_cpu_only_shortcut_equals_full_scoring(reqs: list[Request], cpu: int) -> None:
    """CPU-only work skips scoring when a node has no free GPU share; the answer must not change."""
    import numpy as np

    state = FreeState.from_nodes(cluster(), (), policy="default")
    for req in reqs:
        a = state.find(req)
        if a is not None:
            state.commit(a, req)
    probe = Request(cpu_milli=cpu)
    found = state.find(probe)
    cand = np.flatnonzero((state.cpu_free >= cpu) & (state.mem_free >= 0))
    if cand.size == 0:
        assert found is None
        return
    model = state.frag
    rows, _, delta = model.deltas(cand, None, probe)
    keys = (state.tie_rank[rows], state.cpu_free[rows] - cpu, model._ftot_after, np.round(delta, 6))
    assert found is not None and found.node == state.names[int(rows[np.lexsort(keys)[0]])]


def test_default_keeps_cpu_next_to_free_gpus() -> None:
    """A CPU-heavy job goes where it strands no GPU; BestFit packs it where it does."""
    nodes = [node("lean", 2, cpu=16_000), node("rich", 2, cpu=64_000)]
    mix = [Request(gpus=1, cpu_milli=8000)] * 20
    heavy = Request(gpus=1, cpu_milli=12_000)
    default = FreeState.from_nodes(nodes, (), policy="default", workload=mix)
    assert default.find(heavy).node == "rich"  # on "lean" the other GPU would be left with 4 cores
    bestfit = FreeState.from_nodes(nodes, (), policy="bestfit")
    assert bestfit.find(heavy).node == "lean"


def test_default_learns_the_mix_from_running_work() -> None:
    nodes = [node("a", 2), node("b", 2)]
    held = [running(f"w{k}", Request(gpu_milli=500), Assignment("a", (("a-g0", 500),))) for k in range(1)]
    state = FreeState.from_nodes(nodes, held, policy="default")
    assert state.frag.counts  # the running job's shape is in the learned mix
    a = state.find(Request(gpu_milli=500))
    assert a == Assignment("a", (("a-g0", 500),))  # completes the half-used GPU


def test_found_place_is_not_reused_after_a_commit() -> None:
    state = FreeState.from_nodes([node("a", 1), node("b", 1)], (), policy="default")
    req = Request(gpu_milli=600)
    first = state.find(req)
    assert state.find(req) == first  # nothing changed: same answer
    state.commit(first, req)
    second = state.find(req)
    assert second is not None and second.node != first.node  # 0.4 left there: the other node
    state.commit(second, req)
    assert state.find(req) is None


def test_default_weighs_the_fgd_term_by_the_gang_share_of_the_mix() -> None:
    """The FGD term's weight follows the learned share of GPU volume in multi-GPU gangs."""
    from gpupool.policy.placement_capacity import CapacityModel

    singles = FreeState.from_nodes(cluster(), (), policy="default", workload=[Request(gpus=1)] * 3)
    gangs = FreeState.from_nodes(cluster(), (), policy="default", workload=[Request(gpus=4)] * 3)
    half = FreeState.from_nodes(cluster(), (), policy="default",
                                workload=[Request(gpus=2), Request(gpu_milli=500)] * 2 + [Request(gpus=1)] * 3)
    base, gain, exp = CapacityModel.LAMBDA, CapacityModel.GANG_GAIN, CapacityModel.GANG_EXP
    assert singles.frag.lam == pytest.approx(base)
    assert gangs.frag.lam == pytest.approx(base * (1 + gain))
    # gang volume 2 x 2000 of 2 x 2000 + 2 x 500 + 3 x 1000 = 8000 milli
    assert half.frag.lam == pytest.approx(base * (1 + gain * 0.5**exp))


def test_default_starts_from_a_gang_prior_that_fades_as_work_is_seen() -> None:
    """Learning the mix, ``default`` first weighs FGD's whole-node lookahead as if gangs were coming.

    The prior is gang work of 1 % of the pool's GPUs; every request counted dilutes it, so the
    weight falls toward the plain learned share. A mix given up front gets no prior (see the test above).
    """
    from gpupool.policy.placement_capacity import CapacityModel

    base, gain, exp = CapacityModel.LAMBDA, CapacityModel.GANG_GAIN, CapacityModel.GANG_EXP
    nodes = [node(f"n{k}", 8) for k in range(25)]  # 200 GPUs: the prior counts as 2,000 milli of gangs
    empty = FreeState.from_nodes(nodes, (), policy="default")
    assert empty.frag.lam == pytest.approx(base * (1 + gain))  # nothing seen: all the mix is the prior
    held = [running(f"w{k}", Request(gpus=1), Assignment(f"n{k}", ((f"n{k}-g0", 1000),))) for k in range(8)]
    busy = FreeState.from_nodes(nodes, held, policy="default")
    assert busy.frag.lam == pytest.approx(base * (1 + gain * (2000 / (8000 + 2000)) ** exp))
    # one-GPU work keeps coming: the weight only falls, toward the learned share (0 here)
    weights = [busy.frag.lam]
    for _ in range(120):
        req = Request(gpus=1)
        busy.commit(busy.find(req), req)
        busy.frag.refresh()
        weights.append(busy.frag.lam)
    assert all(later <= earlier for earlier, later in zip(weights, weights[1:], strict=False))
    assert weights[-1] < weights[0] and weights[-1] < base * 1.01  # (re-weighed every few dozen requests)


def test_layout_reused_only_for_the_same_node_objects() -> None:
    """States over the same node objects share the hardware layout (within one PolicyCache, as in a cycle or
    from one cycle to the next); equal-named new nodes get their own."""
    from gpupool.policy.cache import PolicyCache, using

    nodes = cluster()
    with using(PolicyCache()):
        first = FreeState.from_nodes(nodes, [])
        again = FreeState.from_nodes(list(nodes), [])
        # same names, one node rebuilt with a smaller GPU: a fresh layout with the new capacity
        changed = [Node("d", 8000, 16_000, (Gpu("d-g0", 0, "T4", 16_000, capacity_milli=500),))
                   if n.name == "d" else n for n in nodes]
        other = FreeState.from_nodes(changed, [])
    assert FreeState.from_nodes(nodes, []).cap is not first.cap  # another cache (here: none) builds its own
    assert again.cap is first.cap and again.gpu_slot is first.gpu_slot
    assert not first.cap.flags.writeable  # shared, so nobody may write to it
    assert other.cap is not first.cap
    d = other.node_index["d"]
    assert int(other.cap[d, 0]) == 500 and int(first.cap[d, 0]) == 1000
    # and the running work of one state never leaks into another over the same nodes
    busy = FreeState.from_nodes(nodes, [Workload("w", "p", Kind.TRAIN, Request(gpus=1),
                                                 assignment=Assignment("d", (("d-g0", 1000),)))])
    assert busy.free_gpu_milli() == first.free_gpu_milli() - 1000
    assert FreeState.from_nodes(nodes, []).free_gpu_milli() == first.free_gpu_milli()


@pytest.mark.parametrize("policy", ["default", "fgd"])
def test_mix_learned_in_groups_matches_one_by_one(policy: str) -> None:
    """observe_counts (used for the running work) ends in the same counts and flags as observe per request."""
    shared = Request(gpus=1, cpu_milli=4_000)
    seq = [shared] * 40 + [Request(gpu_milli=500, cpu_milli=2_000) for _ in range(30)] + [Request(cpu_milli=1_000)] * 5
    seq += [Request(gpus=2, cpu_milli=8_000), shared, Request(gpu_milli=500, cpu_milli=2_000)] * 7
    state = FreeState.from_nodes(cluster(), [], policy=policy)
    grouped, one_by_one = type(state.frag)(state), type(state.frag)(state)
    _learn_both_ways(grouped, one_by_one, seq)
    # a few more of known types after a rebuild: not yet due for a re-weigh, either way
    grouped.rebuild()
    one_by_one.rebuild()
    grouped.observe_counts([(shared, 10)])
    for _ in range(10):
        one_by_one.observe(shared)
    assert (grouped._dirty, grouped._new_type, grouped._seen_since) == (False, False, 10)
    assert (one_by_one._dirty, one_by_one._new_type, one_by_one._seen_since) == (False, False, 10)


@pytest.mark.parametrize("policy", ["default", "fgd"])
def test_mix_learned_in_groups_matches_one_by_one_on_random_runs(policy: str) -> None:
    """Grouped and one-by-one learning agree on counts and flags, with and without new types."""
    rng = random.Random(7)
    kinds = [Request(gpus=1, cpu_milli=4_000), Request(gpus=2, cpu_milli=8_000), Request(cpu_milli=1_000),
             Request(gpu_milli=500, cpu_milli=2_000), Request(gpu_milli=250, cpu_milli=2_000)]
    for _ in range(60):
        state = FreeState.from_nodes(cluster(), [], policy=policy)
        grouped, one_by_one = type(state.frag)(state), type(state.frag)(state)
        # some types known beforehand (so later requests of them are not new), then a rebuild
        known = rng.sample(kinds, rng.randrange(len(kinds) + 1))
        for frag in (grouped, one_by_one):
            for r in known:
                frag.observe(r)
            frag.rebuild()
        # equal requests as separate objects and shared ones, in random amounts
        seq = [rng.choice(kinds) if rng.random() < 0.5 else dataclasses.replace(rng.choice(kinds))
               for _ in range(rng.randrange(0, 90))]
        _learn_both_ways(grouped, one_by_one, seq)


def _learn_both_ways(grouped: object, one_by_one: object, seq: list[Request]) -> None:
    """``seq`` learned grouped by request object and one by one: same counts (in order) and flags."""
    pairs: dict[int, list] = {}
    for r in seq:
        pairs.setdefault(id(r), [r, 0])[1] += 1
    grouped.observe_counts((r, n) for r, n in pairs.values())  # type: ignore[attr-defined]
    for r in seq:
        one_by_one.observe(r)  # type: ignore[attr-defined]
    for a, b in ((grouped, one_by_one), (getattr(grouped, "fgd", None), getattr(one_by_one, "fgd", None))):
        if a is None:
            continue
        assert list(a.counts.items()) == list(b.counts.items())
        assert (a._dirty, a._new_type, a._seen_since, a._total) == (b._dirty, b._new_type, b._seen_since, b._total)


@pytest.mark.parametrize("policy", ["fgd", "default"])
def test_given_mix_scores_running_work_like_committed_work(policy: str) -> None:
    """With a given mix, work running at build time weighs as if committed after it (FGD term included)."""
    import numpy as np

    mix = [Request(gpus=1), Request(gpu_milli=500), Request(gpus=2)]
    held = [(Request(gpu_milli=600), Assignment("a", (("a-g0", 600),))),
            (Request(gpus=2), Assignment("c", (("c-g0", 1000), ("c-g1", 1000))))]
    built = FreeState.from_nodes(cluster(), [running(f"w{k}", r, a) for k, (r, a) in enumerate(held)],
                                 policy=policy, workload=mix)
    later = FreeState.from_nodes(cluster(), (), policy=policy, workload=mix)
    for r, a in held:
        later.commit(a, r)
    cand = np.arange(len(built.names))
    for probe in (Request(gpus=1), Request(gpus=2)):
        _, _, got = built.frag.deltas(cand, None, probe)
        _, _, want = later.frag.deltas(cand, None, probe)
        assert np.allclose(got, want)


def uniform_cluster() -> list[Node]:
    """Identical nodes (states repeat, so the scorers' memo is hit) beside one different node."""
    return [node(f"u{i}", 4, cpu=24_000, mem=96_000) for i in range(6)] + [node("t", 2, model="T4", cpu=8_000)]


def replay_with(policy: str, memo: bool, steps: list[tuple[str, Request]], expect: bool) -> list:
    state = FreeState.from_nodes(uniform_cluster(), (), policy=policy,
                                 expect=[r for _, r in steps] if expect else ())
    if not memo:
        state.frag._memo_ok = False
        if getattr(state.frag, "fgd", None) is not None:
            state.frag.fgd._memo_ok = False
    held: list[tuple[Assignment, Request]] = []
    out = []
    for op, req in steps:
        if op == "release" and held:
            a, r = held.pop(0)
            state.release(a, r)
            out.append(("released", a))
            continue
        a = state.find(req)
        out.append(a)
        if a is not None:
            state.commit(a, req)
            held.append((a, req))
    if memo and policy in ("default", "fgd"):
        out.append(("memo rows", sum(t.size for t in state.frag.memo.tables.values()) > 0))
    return out



SHAPES = [Request(gpu_milli=m, cpu_milli=c) for m in (150, 250, 300, 500, 700) for c in (1000, 4000)] + [
    Request(gpus=1, cpu_milli=4000), Request(gpus=2, cpu_milli=8000), Request(gpus=4, cpu_milli=2000),
    Request(gpu_memory_mib=20_000, cpu_milli=2000), Request(cpu_milli=6000), Request(gpus=1, gpu_models=frozenset({"T4"})),
]


@pytest.mark.parametrize("policy", ["default", "fgd"])
@pytest.mark.parametrize("seed", range(4))
def test_memo_of_scored_states_changes_no_choice(policy: str, seed: int) -> None:
    """Scores kept per (request, node state) give exactly the places full scoring gives.

    A long random run on identical nodes, so states repeat and the memo is
    hit: fractions on GPUs with equal and different free shares, releases
    (states coming back), weights refreshed many times; every other seed
    announces the request types up front (no table rebuilds).
    """
    import random

    rng = random.Random(seed)
    steps = [("release" if rng.random() < 0.15 else "find", rng.choice(SHAPES)) for _ in range(400)]
    with_memo = replay_with(policy, True, steps, expect=seed % 2 == 0)
    without = replay_with(policy, False, steps, expect=seed % 2 == 0)
    assert with_memo[-1] == ("memo rows", True)
    assert with_memo[:-1] == without


def test_closest_node_for_a_starving_request() -> None:
    """Most whole free GPUs of an allowed model first, then free CPU; skipped and too-small nodes never."""
    nodes = [node("a", 4), node("b", 4, cpu=96_000), node("c", 8, model="T4"), node("d", 2)]
    busy = [running("x", Request(gpus=3, cpu_milli=1000), Assignment("a", tuple((f"a-g{k}", 1000) for k in range(3)))),
            running("y", Request(gpus=2), Assignment("b", (("b-g0", 1000), ("b-g1", 1000)))),
            running("z", Request(gpu_milli=300), Assignment("d", (("d-g0", 300),)))]
    state = FreeState.from_nodes(nodes, busy, policy="firstfit")
    four = Request(gpus=4)
    assert state.closest(four) == "c"  # 8 free T4s
    assert state.closest(Request(gpus=4, gpu_models=frozenset({"A100"}))) == "b"  # 2 free, more than a's 1
    assert state.closest(four, skip={"c", "b"}) == "a"  # d has 2 GPUs: it never holds 4
    assert state.closest(Request(gpus=4, cpu_milli=100_000)) is None
    # a fraction: the largest free share on one GPU, then free CPU (b has more than the others)
    assert state.closest(Request(gpu_milli=800), skip={"c"}) == "b"
    assert state.closest(Request(gpu_milli=800), skip={"c", "b"}) == "d"  # a whole GPU like a, more free CPU


def test_fits_empty_is_kept_with_the_hardware_and_still_refuses_bad_requests() -> None:
    nodes = [node("a", 2), node("b", 4, model="T4")]
    first = FreeState.from_nodes(nodes, [])
    assert first.fits_empty(Request(gpus=4, gpu_models=frozenset({"T4"})))
    assert not first.fits_empty(Request(gpus=3, gpu_models=frozenset({"A100"})))
    # a later state over the same node objects, busy or not, gives the same answers
    busy = FreeState.from_nodes(nodes, [running("x", Request(gpus=4), Assignment("b", tuple((f"b-g{k}", 1000)
                                                                                            for k in range(4))))])
    assert busy.fits_empty(Request(gpus=4, gpu_models=frozenset({"T4"})))
    assert not busy.fits_empty(Request(gpus=3, gpu_models=frozenset({"A100"})))
    # other hardware under the same names answers for itself
    assert not FreeState.from_nodes([node("a", 2), node("b", 2, model="T4")], []).fits_empty(
        Request(gpus=4, gpu_models=frozenset({"T4"})))
    for _ in range(2):  # a malformed request is refused each time, never remembered
        with pytest.raises(InvalidRequest):
            busy.fits_empty(Request(gpus=1, gpu_milli=500))


def test_fgd_ranks_by_the_authors_integer_node_score() -> None:
    """Near-equal increases of fragmentation tie (then node order decides); large ones saturate."""
    from gpupool.policy.placement_scoring import fgd_node_score

    score = fgd_node_score(np.array([1.0, 39.0, 45.0, 5000.0, 9000.0, -5000.0, -9000.0, 0.0]))
    assert score[0] == score[1] != score[2]  # within one step of the score (~40 milli near 0)
    assert score[3] == score[4] == 0.0  # both stranding several GPUs: equally bad to the baseline
    assert score[5] == score[6] == -99.0
    assert score[7] == -50.0 and score[2] > score[0] > score[7] > score[5]  # less increase ranks first


def _cpu_table_by_hand(frag: object) -> np.ndarray:
    """The FGD weight table as first written: each type added from its CPU level up, in repr order."""
    counts = frag.counts  # type: ignore[attr-defined]
    levels = np.asarray(sorted({c for (_, c) in counts}), dtype=np.int64)
    table = np.zeros((len(levels) + 1, len(frag._shapes)))  # type: ignore[attr-defined]
    total = sum(counts.values()) or 1.0
    for (shape, cpu), cnt in sorted(counts.items(), key=repr):
        level = int(np.searchsorted(levels, cpu, side="left")) + 1
        table[level:, frag._sidx[shape]] += cnt / total  # type: ignore[attr-defined]
    return table


@pytest.mark.parametrize("policy", ["default", "fgd"])
def test_fgd_weights_planned_once_equal_the_plain_sums(policy: str) -> None:
    """The planned re-weighing gives the very table of the plain per-type loop, bit for bit."""
    rng = random.Random(11)
    for _ in range(40):
        state = FreeState.from_nodes(cluster(), [], policy=policy)
        frag = state.frag if policy == "fgd" else state.frag.fgd  # type: ignore[union-attr]
        kinds = [Request(gpus=rng.choice([1, 2, 4]), cpu_milli=rng.choice([1_000, 3_000, 8_000, 11_000]))
                 for _ in range(rng.randrange(1, 6))]
        kinds += [Request(gpu_milli=rng.choice([100, 250, 470, 810]), cpu_milli=rng.choice([2_000, 3_000, 11_000]))
                  for _ in range(rng.randrange(1, 8))]
        for r in kinds:
            state.frag.observe(r)  # type: ignore[union-attr]
        state.frag.refresh()  # type: ignore[union-attr]
        for _ in range(3):  # new proportions of the same types: only re-weighed
            for r in rng.choices(kinds, k=rng.randrange(1, 200)):
                state.frag.observe(r)  # type: ignore[union-attr]
            frag._weigh()  # (refresh() re-weighs only once enough requests came)
            assert np.array_equal(frag.cpu_table, _cpu_table_by_hand(frag))


def _fgd_measure_by_hand(frag: object, state: FreeState) -> np.ndarray:
    """FGD's expected fragmentation of every node as first written, from the state and the weights."""
    f: Any = frag
    if not f._shapes:
        return np.zeros(len(state.names))
    fits = np.where(f.whole, state.whole_free[:, None], state.max_share[:, None]) >= f.threshold
    pc = f.cpu_table[f.cpu_levels.searchsorted(state.cpu_free, side="right")]
    return f.ftot * f.p_total + np.add.reduce(np.where(fits, pc, 0.0) * (f.su - f.ftot[:, None]), axis=1)


def _unlike_gpus_cluster() -> list[Node]:
    """Nodes whose GPUs differ in share and memory (placement scores them without its memo)."""
    caps = (1000, 0, 2000, 500)
    unlike = [Node(name, 32_000, 256_000, tuple(Gpu(f"{name}-g{k}", k, "A100", (40_000, 80_000)[k % 2], "x", cap)
                                                 for k, cap in enumerate(caps)))
              for name in ("u", "v")]
    return unlike + cluster()


@pytest.mark.parametrize("policy", ["default", "fgd"])
@pytest.mark.parametrize("nodes", ["uniform", "mixed", "unlike"])
def test_kept_node_arrays_match_a_fresh_count_after_commits_and_releases(policy: str, nodes: str) -> None:
    """What placement keeps per node across commits equals what the GPU matrix and a fresh measure say.

    (free shares with -1 on empty slots, the largest partly used share, and FGD's weight-free parts and
    measure after a re-weighing; on alike GPUs the memo hands the committed node's parts over, on GPUs
    that differ they come from the node's real state)
    """
    rng = random.Random(3)
    made = {"uniform": uniform_cluster, "mixed": cluster, "unlike": _unlike_gpus_cluster}[nodes]()
    state = FreeState.from_nodes(made, [], policy=policy)
    placed: list[tuple[Assignment, Request]] = []
    for _ in range(300):
        if placed and rng.random() < 0.3:
            a, r = placed.pop(rng.randrange(len(placed)))
            state.release(a, r)
        else:
            r = rng.choice(SHAPES)
            a = state.find(r)
            if a is None:
                continue
            state.commit(a, r)
            placed.append((a, r))
        assert np.array_equal(state.free_or_neg, np.where(state.valid, state.free, -1))
        part = np.where(state.valid & (state.free < state.cap), state.free, 0).max(axis=1)
        assert np.array_equal(state.part_share, part)
        frag = state.frag if policy == "fgd" else state.frag.fgd  # type: ignore[union-attr]
        frag.refresh()
        n = np.arange(len(state.names))
        gain, level = frag._frag_parts(n, frag.su, frag.ftot, state.whole_free, state.max_share, state.cpu_free)
        assert np.array_equal(frag.node_gain, gain) and np.array_equal(frag.node_level, level)
        if state.gpus_alike:
            # (on GPUs that differ, the committed node's row and measure are the scorer's estimates of its
            # after-state until the next re-weighing; its weight-free parts, above, come from its real state)
            assert np.array_equal(frag.su, frag._unusable(state.free, state.valid, frag.demand))
            assert np.array_equal(frag.frag_now, _fgd_measure_by_hand(frag, state))
