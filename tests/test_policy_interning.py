"""Interning carried across cycles (gpupool/policy/interning.py) decides exactly as interning from scratch."""

from __future__ import annotations

import dataclasses
import random

from gpupool.policy import PolicyCache, schedule
from gpupool.policy.interning import Interner
from gpupool.policy.model import Kind, Request, Workload
from tests.test_policy_helpers import node, project, snap


def test_equal_requests_get_one_stand_in_per_cycle_whichever_comes_first() -> None:
    cache = PolicyCache()
    old = Request(gpus=1, cpu_milli=100)
    first = Interner(cache)
    assert first.intern(old) is old
    first.keep()
    # next cycle: a new object equal to the carried one comes first, then the carried one
    new = Request(gpus=1, cpu_milli=100)
    second = Interner(cache)
    a = second.intern(new)
    b = second.intern(old)
    assert a is b is new
    second.keep()
    # and the other way round
    third = Interner(cache)
    newer = Request(gpus=1, cpu_milli=100)
    assert third.intern(old) is third.intern(newer)
    assert len(third.canon) == 1


def test_the_carry_holds_only_the_last_cycles_objects() -> None:
    cache = PolicyCache()
    gone = Request(gpus=2)
    i = Interner(cache)
    i.intern(gone)
    i.keep()
    j = Interner(cache)
    j.intern(Request(gpus=3))
    j.keep()
    assert [r for r, _ in cache.interned.values()] == [Request(gpus=3)]


def _queue(rng: random.Random, requests: list[Request], n: int) -> list[Workload]:
    return [Workload(f"j{i:04d}", rng.choice(["a", "b"]), Kind.TRAIN, rng.choice(requests),
                     priority=rng.choice([0, 1]), submitted_at=float(i)) for i in range(n)]


def test_decisions_with_the_carry_equal_decisions_from_scratch() -> None:
    rng = random.Random(7)
    shapes = [Request(gpus=1), Request(gpu_milli=250), Request(gpus=2, cpu_milli=1000), Request(gpu_memory_mib=8000)]
    nodes = [node(f"n{i}", gpus=4) for i in range(3)]
    projects = [project("a", guarantee=4), project("b", guarantee=4)]
    jobs = _queue(rng, shapes, 60)
    cache = PolicyCache()  # carried through the rounds, as the service keeps one
    for _ in range(5):
        # each round: some jobs keep their request object, others get a new equal (or different) one
        jobs = [w if rng.random() < 0.5 else dataclasses.replace(
            w, request=dataclasses.replace(rng.choice(shapes))) for w in jobs]
        s = snap(nodes, projects, jobs)
        carried = schedule(s, cache)
        assert schedule(s) == carried  # no cache: from scratch
