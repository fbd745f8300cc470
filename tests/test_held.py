"""The count of held capacity carried between cycles equals a count from scratch."""

from __future__ import annotations

import dataclasses
import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpupool.policy.cache import PolicyCache, active, using
from gpupool.policy.capacity import Ledger
from gpupool.policy.held import held_by
from gpupool.policy.model import Assignment, Gpu, Kind, Node, Request, Workload
from gpupool.policy.placement import FreeState
from gpupool.wire.errors import InvalidRequest

POOLS = (frozenset({"build", "train"}), frozenset({"train"}), frozenset({"build"}))
SHAPES = (Request(gpus=1, cpu_milli=4000, memory_mib=8000), Request(gpus=2, cpu_milli=8000),
          Request(gpu_milli=250, cpu_milli=1000, memory_mib=1000), Request(gpu_milli=500), Request(cpu_milli=2000))


def cluster(n: int = 6) -> tuple[Node, ...]:
    return tuple(
        Node(f"n{i}", 64_000, 256_000, tuple(Gpu(f"n{i}-g{k}", k, "A100", 40_000) for k in range(4)),
             pools=POOLS[i % len(POOLS)])
        for i in range(n)
    )


def fresh(nodes, running):
    """A count from scratch: in a cache of its own, so nothing is carried."""
    with using(PolicyCache()):
        return held_by(nodes, running)


def same(a, b) -> None:
    assert np.array_equal(a.cpu, b.cpu) and np.array_equal(a.mem, b.mem) and np.array_equal(a.gpu, b.gpu)
    assert a.outside == b.outside

    def tally(h):
        out: dict[Request, int] = {}
        for r, count in h.counts:
            out[r] = out.get(r, 0) + count
        return out
    assert tally(a) == tally(b)


def place(state: FreeState, rng: random.Random, n: int, prefix: str) -> list[Workload]:
    """Up to ``n`` new running jobs wherever first-fit puts them (new objects each time)."""
    out = []
    for k in range(n):
        req = rng.choice(SHAPES)
        a = state.find(req)
        if a is None:
            continue
        state.commit(a, req)
        out.append(Workload(f"{prefix}{k}", "p", Kind.TRAIN, req, assignment=a))
    return out


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10_000), steps=st.integers(1, 8))
def test_carried_count_equals_a_fresh_count(seed: int, steps: int) -> None:
    """Jobs leave, are paused (a new object for the same id), and start between cycles."""
    with using(PolicyCache()):  # the carry between the calls below, as a cycle has it
        rng = random.Random(seed)
        nodes = cluster()
        active().held.clear()
        running: list[Workload] = []
        for step in range(steps):
            running = [w for w in running if rng.random() > 0.2]  # finished or paused
            # a re-created object for an unchanged job is counted afresh: it must still come out equal
            running = [dataclasses.replace(w) if rng.random() < 0.1 else w for w in running]
            state = FreeState.from_nodes(nodes, running, policy="firstfit", held=held_by(nodes, running))
            running += place(state, rng, rng.randrange(0, 12), f"s{step}-")
            same(held_by(nodes, running), fresh(nodes, list(running)))


def test_states_and_ledger_from_the_carried_count_match_counting_from_scratch() -> None:
    with using(PolicyCache()):  # the carry between the calls below, as a cycle has it
        rng = random.Random(7)
        nodes = cluster()
        active().held.clear()
        running = place(FreeState.from_nodes(nodes, [], policy="firstfit"), rng, 30, "a")
        held_by(nodes, running)
        later = running[5:] + place(FreeState.from_nodes(nodes, running[5:], policy="firstfit"), rng, 5, "b")
        carried = FreeState.from_nodes(nodes, later, "train", policy="default")
        led = Ledger(nodes, later, held=held_by(nodes, later))
        active().held.clear()
        scratch = FreeState.from_nodes(nodes, later, "train", policy="default")
        assert np.array_equal(carried.free, scratch.free) and np.array_equal(carried.cpu_free, scratch.cpu_free)
        assert carried.frag.counts == scratch.frag.counts  # type: ignore[union-attr]
        with pytest.raises(ValueError, match="another node list"):  # a count over other nodes is refused
            FreeState.from_nodes(nodes, later, "train", held=held_by(nodes, later))
        active().held.clear()
        again = Ledger(nodes, later)  # counted by the ledger itself
        assert (led.cpu, led.mem, led.gpu, led.whole) == (again.cpu, again.mem, again.gpu, again.whole)
        # and by hand: node n0's GPUs hold what the jobs there hold
        on_n0 = {}
        for w in later:
            if w.assignment is not None and w.assignment.node == "n0":
                for gid, m in w.assignment.gpus:
                    on_n0[gid] = on_n0.get(gid, 0) + m
        assert led.gpu["n0"] == {g.id: g.capacity_milli - on_n0.get(g.id, 0) for g in nodes[0].gpus}


def test_a_gpu_on_the_wrong_node_is_refused_and_the_carry_survives() -> None:
    with using(PolicyCache()):  # the carry between the calls below, as a cycle has it
        nodes = cluster()
        active().held.clear()
        ok = [Workload("a", "p", Kind.TRAIN, SHAPES[0], assignment=Assignment("n0", (("n0-g0", 1000),)))]
        before = held_by(nodes, ok)
        bad = ok + [Workload("b", "p", Kind.TRAIN, SHAPES[0], assignment=Assignment("n0", (("n1-g0", 1000),)))]
        with pytest.raises(InvalidRequest, match="not on node 'n0'"):
            held_by(nodes, bad)
        after = held_by(nodes, ok)
        same(before, after)
        assert int(after.gpu.sum()) == 1000
        # work on a node or GPU the pool no longer has holds nothing
        gone = ok + [Workload("c", "p", Kind.TRAIN, SHAPES[0], assignment=Assignment("zz", (("zz-g0", 1000),)))]
        assert int(held_by(nodes, gone).gpu.sum()) == 1000 and held_by(nodes, gone).outside == 1
        assert held_by(nodes, ok).outside == 0  # carried back: the job on the unknown node left


def test_the_same_running_object_twice_counts_twice() -> None:
    """A caller's duplicate is counted as a fresh count would (and the engine's usage does)."""
    with using(PolicyCache()):  # the carry between the calls below, as a cycle has it
        nodes = cluster()
        active().held.clear()
        w = Workload("a", "p", Kind.TRAIN, SHAPES[2], assignment=Assignment("n0", (("n0-g0", 250),)))
        held_by(nodes, [w])
        twice = held_by(nodes, [w, w])
        assert int(twice.gpu.sum()) == 500 and twice.counts == ((SHAPES[2], 2),)
        assert int(held_by(nodes, [w]).gpu.sum()) == 250
