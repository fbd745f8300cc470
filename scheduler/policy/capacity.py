"""Free capacity for one cycle: the placement states of each pool, kept in step.

A node may serve both the build and the train pool, so the engine keeps one
:class:`~scheduler.policy.placement.FreeState` per pool and mirrors every
commit and release into each state that holds the node. Beside them it keeps a
small :class:`Ledger` of free CPU, memory and GPU share per node: the placement
contract answers "where does this fit", but reclaim and the starvation rule
also need "would this fit on *that* node" and "which node is closest to
fitting", cheaply and without asking placement to search the whole pool.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from scheduler.policy.model import MILLI, Assignment, Gpu, Node, Request, Workload
from scheduler.policy.placement import FreeState


def memory_milli(memory_mib: int, gpu: Gpu) -> int:
    """The share of ``gpu`` that ``memory_mib`` of its memory is, rounded up."""
    if gpu.memory_mib <= 0:
        return gpu.capacity_milli + 1
    return -(-memory_mib * MILLI // gpu.memory_mib)


class Ledger:
    """Free CPU, memory and per-GPU share of every node, updated in place."""

    def __init__(self, nodes: Sequence[Node], running: Iterable[Workload]) -> None:
        self.nodes = {n.name: n for n in nodes}
        self.order = {n.name: i for i, n in enumerate(nodes)}
        self.cpu = {n.name: n.cpu_milli for n in nodes}
        self.mem = {n.name: n.memory_mib for n in nodes}
        self.gpu = {n.name: {g.id: g.capacity_milli for g in n.gpus} for n in nodes}
        for w in running:
            if w.assignment is not None:
                self.take(w.assignment, w.request)

    def take(self, assignment: Assignment, request: Request) -> None:
        self._add(assignment, request, -1)

    def give(self, assignment: Assignment, request: Request) -> None:
        self._add(assignment, request, 1)

    def _add(self, assignment: Assignment, request: Request, sign: int) -> None:
        name = assignment.node
        free = self.gpu.get(name)
        if free is None:
            return
        self.cpu[name] += sign * request.cpu_milli
        self.mem[name] += sign * request.memory_mib
        for gid, milli in assignment.gpus:
            if gid in free:
                free[gid] += sign * milli

    def _gpus(self, name: str, request: Request) -> list[Gpu]:
        models = request.gpu_models
        return [g for g in self.nodes[name].gpus if not models or g.model in models]

    def fits(self, name: str, request: Request) -> bool:
        """Whether ``request`` fits on node ``name`` as it is now (whole GPUs on one node)."""
        if self.cpu[name] < request.cpu_milli or self.mem[name] < request.memory_mib:
            return False
        free = self.gpu[name]
        if request.gpus:
            whole = sum(1 for g in self._gpus(name, request) if free[g.id] >= g.capacity_milli > 0)
            return whole >= request.gpus
        if request.gpu_milli:
            return any(free[g.id] >= request.gpu_milli for g in self._gpus(name, request))
        if request.gpu_memory_mib:
            return any(
                0 < memory_milli(request.gpu_memory_mib, g) <= free[g.id] for g in self._gpus(name, request)
            )
        return True

    def could_ever_fit(self, name: str, request: Request) -> bool:
        """Whether ``request`` fits on node ``name`` were it empty."""
        node = self.nodes[name]
        if node.cpu_milli < request.cpu_milli or node.memory_mib < request.memory_mib:
            return False
        gpus = self._gpus(name, request)
        if request.gpus:
            return sum(1 for g in gpus if g.capacity_milli > 0) >= request.gpus
        if request.gpu_milli:
            return any(g.capacity_milli >= request.gpu_milli for g in gpus)
        if request.gpu_memory_mib:
            return any(0 < memory_milli(request.gpu_memory_mib, g) <= g.capacity_milli for g in gpus)
        return True

    def closeness(self, name: str, request: Request) -> tuple[int, int, int]:
        """How close node ``name`` is to fitting ``request`` (larger is closer).

        Whole-GPU requests count the fully free GPUs of an allowed model;
        fractional ones the largest free share on one allowed GPU. CPU and
        memory free break ties.
        """
        free = self.gpu[name]
        gpus = self._gpus(name, request)
        if request.gpus:
            gpu_score = sum(1 for g in gpus if free[g.id] >= g.capacity_milli > 0)
        else:
            gpu_score = max((free[g.id] for g in gpus), default=0)
        return (gpu_score, self.cpu[name], self.mem[name])

    def free_gpus_text(self, name: str) -> str:
        free = self.gpu[name]
        whole = sum(1 for g in self.nodes[name].gpus if free[g.id] >= g.capacity_milli > 0)
        return f"{whole} of {len(self.nodes[name].gpus)} GPUs free"


class Capacity:
    """The per-pool placement states and the ledger, changed together."""

    def __init__(
        self, nodes: Sequence[Node], running: Sequence[Workload], pools: Iterable[str], policy: str
    ) -> None:
        self.states = {p: FreeState.from_nodes(nodes, running, p, policy) for p in pools}
        self.pool_nodes = {p: [n.name for n in nodes if p in n.pools] for p in self.states}
        self.node_pools: dict[str, list[str]] = {}
        for p, names in self.pool_nodes.items():
            for name in names:
                self.node_pools.setdefault(name, []).append(p)
        self.ledger = Ledger(nodes, running)
        self.generation = 0  # bumped whenever capacity grows within the cycle

    def find(self, pool: str, request: Request) -> Assignment | None:
        return self.states[pool].find(request)

    def fits_empty(self, pool: str, request: Request) -> bool:
        return self.states[pool].fits_empty(request)

    def commit(self, assignment: Assignment, request: Request) -> None:
        for p in self.node_pools.get(assignment.node, ()):
            self.states[p].commit(assignment, request)
        self.ledger.take(assignment, request)

    def release(self, assignment: Assignment, request: Request) -> None:
        for p in self.node_pools.get(assignment.node, ()):
            self.states[p].release(assignment, request)
        self.ledger.give(assignment, request)
        self.generation += 1

    def block(self, name: str) -> None:
        """Take everything still free on node ``name`` so nothing else lands there this cycle."""
        led = self.ledger
        gpus = tuple((gid, free) for gid, free in led.gpu[name].items() if free > 0)
        filler = Request(cpu_milli=max(led.cpu[name], 0), memory_mib=max(led.mem[name], 0))
        self.commit(Assignment(name, gpus), filler)
