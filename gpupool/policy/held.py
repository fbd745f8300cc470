"""What the running work holds on each node, carried from one cycle to the next.

Every cycle starts from the pool minus what running work holds. Counting that
afresh meant a Python pass over every running job for each placement state and
the ledger, a fifth of a steady cycle at 8,000 running jobs. Between two
cycles only a few jobs change (started, paused, finished), and the service
hands the engine the very same frozen :class:`Workload` object for a job that
did not change (``gpupool.service.core``, ``_workload``). So the last count
of a node list is kept (in the caller's :class:`~gpupool.policy.cache.PolicyCache`)
together with the workload objects it counted, and the
next count starts from it: jobs no longer there are given back, new ones are
taken, both found by object identity. A caller that builds new objects every
time still gets the right answer, at the cost of a count from scratch.

The result is exactly a count from scratch (integer sums in any order; a test
compares the two over random sequences of snapshots). Nothing is written in
place: each call makes new arrays, so a count handed out earlier stays valid.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from operator import attrgetter

import numpy as np

from gpupool.policy.cache import active
from gpupool.policy.model import Node, Request, Workload
from gpupool.policy.placement_layout import Layout, layout_of
from gpupool.wire.errors import InvalidRequest

_assignment_of = attrgetter("assignment")  # (an Assignment is always true, a missing one None)
KEEP = 4  # node lists whose last count is carried (the engine uses one; tests and benches a few)
# Past this share of changed jobs a fresh count is as cheap as applying the difference.
FRESH_SHARE = 0.5


@dataclass(frozen=True)
class Held:
    """Capacity held by running work on the nodes of ``layout`` (read-only arrays)."""

    layout: Layout
    cpu: np.ndarray  # (nodes,) CPU milli held
    mem: np.ndarray  # (nodes,) memory MiB held
    gpu: np.ndarray  # (nodes, slots) milli-GPU held per GPU slot
    counts: tuple[tuple[Request, int], ...]  # request object, how many running jobs on these nodes hold it
    outside: int = 0  # running jobs on nodes not in the list (they hold nothing here)


@dataclass(frozen=True)
class _Carry:
    layout: Layout
    jobs: dict[int, Workload]  # id -> the workload object counted (keeps the id from being reused)
    held: Held
    tally: dict[int, tuple[Request, int]]  # id(request) -> (request, count)


def held_by(nodes: Sequence[Node], running: Iterable[Workload]) -> Held:
    """What ``running`` holds on ``nodes``, from the last count over the same node objects when there is one.

    Work on a node not in ``nodes``, or on a GPU gone from them, holds
    nothing here. A GPU placed on a node other than its own is an error.
    """
    lay = layout_of(tuple(nodes))
    # (C-level passes: this runs on every running job each cycle)
    listed = list(filter(_assignment_of, running))
    jobs = dict(zip(map(id, listed), listed, strict=True))
    if len(jobs) != len(listed):  # the same object twice: each counts, as in any fresh count; no carry
        return _apply(_empty(lay), {}, listed, [])[0]
    carry: dict[int, _Carry] = active().held
    last = carry.get(id(lay))
    if last is not None and last.layout is lay:
        before = last.jobs
        gone = [before[k] for k in before.keys() - jobs.keys()]
        new = [jobs[k] for k in jobs.keys() - before.keys()]
        if len(gone) + len(new) <= FRESH_SHARE * max(len(jobs), 1):
            held, tally = _apply(last.held, dict(last.tally), new, gone)
            _remember(carry, lay, jobs, held, tally)
            return held
    held, tally = _apply(_empty(lay), {}, listed, [])
    _remember(carry, lay, jobs, held, tally)
    return held


def _empty(lay: Layout) -> Held:
    n, g = lay.cap.shape
    return Held(lay, np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros((n, g), np.int64), ())


def _remember(carry: dict[int, _Carry], lay: Layout, jobs: dict[int, Workload], held: Held,
              tally: dict[int, tuple[Request, int]]) -> None:
    carry.pop(id(lay), None)
    carry[id(lay)] = _Carry(lay, jobs, held, tally)
    while len(carry) > KEEP:  # the least recently counted node lists go
        del carry[next(iter(carry))]


def _apply(base: Held, tally: dict[int, tuple[Request, int]], taken: list[Workload],
           given: list[Workload]) -> tuple[Held, dict[int, tuple[Request, int]]]:
    """``base`` plus ``taken`` minus ``given``, as new arrays; ``tally`` (a copy) is updated in place."""
    lay = base.layout
    node_index, gpu_slot = lay.node_index.get, lay.gpu_slot.get
    width = lay.cap.shape[1]
    rows: list[int] = []
    cpu: list[int] = []
    mem: list[int] = []
    cells: list[int] = []
    milli: list[int] = []
    # (bound methods: on a fresh count this runs once per running job)
    add_row, add_cpu, add_mem, add_cell, add_milli = rows.append, cpu.append, mem.append, cells.append, milli.append
    outside = base.outside
    for sign, group in ((1, taken), (-1, given)):
        for w in group:
            a = w.assignment
            assert a is not None
            i = node_index(a.node)
            if i is None:
                outside += sign
                continue
            r = w.request
            add_row(i)
            add_cpu(sign * r.cpu_milli)
            add_mem(sign * r.memory_mib)
            for gid, m in a.gpus:
                slot = gpu_slot(gid)
                if slot is None:
                    continue  # a GPU gone from the inventory holds nothing we hand out
                if slot[0] != i:
                    raise InvalidRequest(f"GPU {gid!r} is not on node {a.node!r}")
                add_cell(i * width + slot[1])
                add_milli(sign * m)
            key = id(r)
            seen = tally.get(key)
            count = (seen[1] if seen is not None else 0) + sign
            if count:
                tally[key] = (r, count)
            else:
                del tally[key]
    cpu_held, mem_held, gpu_held = base.cpu.copy(), base.mem.copy(), base.gpu.copy()
    if rows:
        at = np.array(rows, dtype=np.int64)
        np.add.at(cpu_held, at, np.array(cpu, dtype=np.int64))
        np.add.at(mem_held, at, np.array(mem, dtype=np.int64))
    if cells:
        np.add.at(gpu_held.reshape(-1), np.array(cells, dtype=np.int64), np.array(milli, dtype=np.int64))
    for arr in (cpu_held, mem_held, gpu_held):
        arr.flags.writeable = False
    return Held(lay, cpu_held, mem_held, gpu_held, tuple(tally.values()), outside), tally
