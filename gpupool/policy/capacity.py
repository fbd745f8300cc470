"""Free capacity for one cycle: the placement states of each pool, kept in step.

A node may serve both the build and the train pool, so the engine keeps one
:class:`~gpupool.policy.placement.FreeState` per pool and mirrors every
commit and release into each state that holds the node. Beside them it keeps a
small :class:`Ledger` of free CPU, memory and GPU share per node: the placement
contract answers "where does this fit", but reclaim and the starvation rule
also need "would this fit on *that* node" and "which node is closest to
fitting", cheaply and without asking placement to search the whole pool.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from gpupool.policy.cache import scoped
from gpupool.policy.held import Held, held_by
from gpupool.policy.model import MILLI, Assignment, Gpu, Node, Request, Workload
from gpupool.policy.nodecache import for_nodes
from gpupool.policy.placement import FreeState
from gpupool.policy.placement_layout import layout_of
from gpupool.policy.placement_rules import rule_masks


def memory_milli(memory_mib: int, gpu: Gpu) -> int:
    """The share of ``gpu`` that ``memory_mib`` of its memory is, rounded up."""
    if gpu.memory_mib <= 0:
        return gpu.capacity_milli + 1
    return -(-memory_mib * MILLI // gpu.memory_mib)


class _NodeFacts:
    """What the ledger reads from the node list alone (shared by cycles over the same nodes, never written to)."""

    def __init__(self, nodes: tuple[Node, ...]) -> None:
        self.nodes = {n.name: n for n in nodes}
        self.order = {n.name: i for i, n in enumerate(nodes)}
        self.capacity = {g.id: g.capacity_milli for n in nodes for g in n.gpus}
        self.rules = rule_masks(nodes)
        self.repels = self.rules.repels  # some node's taint keeps work without tolerations off it


class Ledger:
    """Free CPU, memory and per-GPU share of every node, updated in place."""

    @scoped
    def __init__(self, nodes: Sequence[Node], running: Iterable[Workload] = (), held: Held | None = None) -> None:
        """The nodes less what ``running`` holds, or less ``held`` (a count over exactly ``nodes``)."""
        facts = for_nodes("ledger", nodes, _NodeFacts)
        self.nodes, self.order, self.capacity = facts.nodes, facts.order, facts.capacity  # read-only
        self._rules, self.repels = facts.rules, facts.repels
        # per node: GPUs wholly free (kept in step by _add, so "how many whole GPUs" is a lookup)
        self.whole: dict[str, int] = {}
        self.version: dict[str, int] = {}  # per node, bumped on every change (for the memos)
        self._ever: dict[tuple[str, int], tuple[Request, bool]] = {}
        self._room: dict[tuple[str, int], tuple[Request, int, tuple[int, int, int, int]]] = {}
        if held is not None:
            if held.layout is not layout_of(tuple(nodes)):
                raise ValueError("held capacity was counted over another node list than the ledger's")
            self._from_held(held)
        else:
            self._subtract(nodes, running)

    def _from_held(self, held: Held) -> None:
        """Free amounts from a count the placement states were built from (dicts from its arrays)."""
        lay = held.layout
        names = lay.names
        self.cpu = dict(zip(names, (lay.cpu_total - held.cpu).tolist(), strict=True))
        self.mem = dict(zip(names, (lay.mem_total - held.mem).tolist(), strict=True))
        free = lay.cap - held.gpu
        self.whole = dict(zip(names, ((free >= lay.cap) & (lay.cap > 0)).sum(axis=1).tolist(), strict=True))
        # per node: free share per GPU id, in slot order (padding slots have no id and are left out)
        self.gpu = {name: dict(zip(ids, row, strict=False))
                    for name, ids, row in zip(names, lay.gpu_ids, free.tolist(), strict=True)}

    def _subtract(self, nodes: Sequence[Node], running: Iterable[Workload]) -> None:
        """Free amounts counted here, leniently: work on unknown nodes or GPUs holds nothing.

        (Used when no placement state covers every node, e.g. nothing is
        pending, or build-only and train-only nodes: those states count per pool.)
        """
        self.cpu = {n.name: n.cpu_milli for n in nodes}
        self.mem = {n.name: n.memory_mib for n in nodes}
        self.gpu = {n.name: {g.id: g.capacity_milli for g in n.gpus} for n in nodes}
        cpu, mem, gpu = self.cpu, self.mem, self.gpu
        for w in running:
            a = w.assignment
            if a is None:
                continue
            free = gpu.get(a.node)
            if free is None:
                continue
            r = w.request
            cpu[a.node] -= r.cpu_milli
            mem[a.node] -= r.memory_mib
            for gid, milli in a.gpus:
                if gid in free:
                    free[gid] -= milli
        capacity = self.capacity
        self.whole = {
            name: sum(1 for gid, left in free.items() if left >= capacity[gid] > 0) for name, free in gpu.items()
        }

    def take(self, assignment: Assignment, request: Request) -> None:
        self._add(assignment, request, -1)

    def give(self, assignment: Assignment, request: Request) -> None:
        self._add(assignment, request, 1)

    def _add(self, assignment: Assignment, request: Request, sign: int) -> None:
        name = assignment.node
        free = self.gpu.get(name)
        if free is None:
            return
        self.version[name] = self.version.get(name, 0) + 1
        self.cpu[name] += sign * request.cpu_milli
        self.mem[name] += sign * request.memory_mib
        capacity = self.capacity
        whole = 0
        for gid, milli in assignment.gpus:
            before = free.get(gid)
            if before is not None:
                after = free[gid] = before + sign * milli
                cap = capacity[gid]
                if cap > 0:
                    whole += (after >= cap) - (before >= cap)
        if whole:
            self.whole[name] += whole

    def _gpus(self, name: str, request: Request) -> Sequence[Gpu]:
        models = request.gpu_models
        if not models:
            return self.nodes[name].gpus
        return [g for g in self.nodes[name].gpus if g.model in models]

    def allows(self, name: str, request: Request) -> bool:
        """Whether ``request``'s placement rules (and the node's taints) let it onto node ``name``."""
        if request.rules is None and not self.repels:
            return True
        mask = self._rules.mask(request.rules)
        return mask is None or bool(mask[self.order[name]])

    def fits(self, name: str, request: Request) -> bool:
        """Whether ``request`` fits on node ``name`` as it is now (whole GPUs on one node, where its rules allow)."""
        if self.cpu[name] < request.cpu_milli or self.mem[name] < request.memory_mib:
            return False
        if (request.rules is not None or self.repels) and not self.allows(name, request):
            return False
        free = self.gpu[name]
        if request.gpus:
            if not request.gpu_models:
                return self.whole[name] >= request.gpus
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
        """Whether ``request`` fits on node ``name`` were it empty (memoised: nodes do not change)."""
        key = (name, id(request))
        hit = self._ever.get(key)
        if hit is not None and hit[0] is request:
            return hit[1]
        ok = self._could_ever_fit(name, request)
        self._ever[key] = (request, ok)
        return ok

    def _could_ever_fit(self, name: str, request: Request) -> bool:
        node = self.nodes[name]
        if node.cpu_milli < request.cpu_milli or node.memory_mib < request.memory_mib:
            return False
        if not self.allows(name, request):
            return False
        gpus = self._gpus(name, request)
        if request.gpus:
            return sum(1 for g in gpus if g.capacity_milli > 0) >= request.gpus
        if request.gpu_milli:
            return any(g.capacity_milli >= request.gpu_milli for g in gpus)
        if request.gpu_memory_mib:
            return any(0 < memory_milli(request.gpu_memory_mib, g) <= g.capacity_milli for g in gpus)
        return True

    def headroom(self, name: str, request: Request) -> tuple[int, int, int, int]:
        """(whole free GPUs, largest free share, free CPU, free memory) on node ``name`` for ``request``'s models.

        Memoised per node until something on the node changes.
        """
        key = (name, id(request))
        hit = self._room.get(key)
        version = self.version.get(name, 0)
        if hit is not None and hit[0] is request and hit[1] == version:
            return hit[2]
        room = self._headroom(name, request)
        self._room[key] = (request, version, room)
        return room

    def _headroom(self, name: str, request: Request) -> tuple[int, int, int, int]:
        free = self.gpu[name]
        if not request.gpu_models:
            return (self.whole[name], max(free.values(), default=0), self.cpu[name], self.mem[name])
        gpus = self._gpus(name, request)
        whole = sum(1 for g in gpus if free[g.id] >= g.capacity_milli > 0)
        share = max((free[g.id] for g in gpus), default=0)
        return (whole, share, self.cpu[name], self.mem[name])

    def node_free(self, name: str) -> tuple[int, int, dict[str, int]]:
        """A copy of what is free on node ``name`` (to compare with later)."""
        return (self.cpu[name], self.mem[name], dict(self.gpu[name]))

    def grew(self, name: str, before: tuple[int, int, dict[str, int]]) -> bool:
        """Whether anything on node ``name`` is freer now than in ``before``."""
        cpu, mem, gpus = before
        if self.cpu[name] > cpu or self.mem[name] > mem:
            return True
        return any(free > gpus.get(gid, 0) for gid, free in self.gpu[name].items())

    def assign_on(self, name: str, request: Request) -> Assignment | None:
        """Seat ``request`` on node ``name`` (after reclaim made room there), or None if it does not fit.

        Whole GPUs: the topology group with the fewest free GPUs that still
        holds the request (keeps bigger groups whole), lowest index first; a
        fraction: the fitting GPU with the least free share (best fit).
        """
        if not self.fits(name, request):
            return None
        free = self.gpu[name]
        gpus = sorted(self._gpus(name, request), key=lambda g: (g.index, g.id))
        if request.gpus:
            whole = [g for g in gpus if free[g.id] >= g.capacity_milli > 0]
            groups: dict[str, list[Gpu]] = {}
            for g in whole:
                groups.setdefault(g.topology_group, []).append(g)
            fitting = [members for members in groups.values() if len(members) >= request.gpus]
            if fitting:
                chosen = min(fitting, key=lambda m: (len(m), m[0].index))[: request.gpus]
            else:
                chosen = whole[: request.gpus]
            return Assignment(name, tuple((g.id, g.capacity_milli) for g in chosen))
        if request.gpu_milli or request.gpu_memory_mib:
            options = []
            for g in gpus:
                need = request.gpu_milli or memory_milli(request.gpu_memory_mib, g)
                if 0 < need <= free[g.id] and need <= g.capacity_milli:
                    options.append((free[g.id], g.index, g.id, need))
            _, _, gid, need = min(options)
            return Assignment(name, ((gid, need),))
        return Assignment(name, ())

    def free_gpus_text(self, name: str) -> str:
        free = self.gpu[name]
        whole = sum(1 for g in self.nodes[name].gpus if free[g.id] >= g.capacity_milli > 0)
        return f"{whole} of {len(self.nodes[name].gpus)} GPUs free"


class Capacity:
    """The per-pool placement states and the ledger, changed together."""

    @scoped
    def __init__(
        self,
        nodes: Sequence[Node],
        running: Sequence[Workload],
        pools: Iterable[str],
        policy: str,
        active: Iterable[str] | None = None,
        expect: Mapping[str, Sequence[Request]] | None = None,
    ) -> None:
        """``active``: the pools that get a placement state (default: all); a pool with
        nothing pending needs none, and every state costs time on each commit.
        ``expect``: per pool, the requests it may be asked to place (see FreeState.from_nodes)."""
        pools = tuple(pools)
        expect = expect or {}
        self.pool_nodes = {p: [n.name for n in nodes if p in n.pools] for p in pools}
        # what running work holds: counted once per distinct pool node list (usually one list, every
        # node, for both pools), carried from the last cycle (gpupool/policy/held.py)
        self.states = {}
        ledger_held = None
        # True when a pool has every node and no running job sits on a node outside the list (known
        # from its count; False when not known): lets per-job "is its node still here" checks go
        self.every_job_on_a_node = False
        counted: dict[int, Held] = {}  # id(layout) -> its count (pools over the same nodes share a layout)
        for p in (pools if active is None else active):
            chosen = [n for n in nodes if p in n.pools]
            lay = layout_of(tuple(chosen))
            held = counted.get(id(lay))
            if held is None:
                held = counted[id(lay)] = held_by(chosen, running)
            if len(chosen) == len(nodes):
                ledger_held = held
                self.every_job_on_a_node = held.outside == 0
            self.states[p] = FreeState.from_nodes(chosen, running, None, policy, expect=expect.get(p, ()), held=held)
        self.ledger = Ledger(nodes, running, held=ledger_held)
        self.node_pools: dict[str, list[str]] = {}
        self._index_states()
        self.generation = 0  # bumped whenever free capacity grows within the cycle (see Ledger.grew)

    def _index_states(self) -> None:
        self.node_pools = {}
        for p in self.states:
            for name in self.pool_nodes[p]:
                self.node_pools.setdefault(name, []).append(p)

    def drop(self, pool: str) -> None:
        """Forget ``pool``'s placement state (no more placements there this cycle)."""
        self.states.pop(pool, None)
        self._index_states()

    def find(self, pool: str, request: Request) -> Assignment | None:
        return self.states[pool].find(request)

    def fits_empty(self, pool: str, request: Request) -> bool:
        return self.states[pool].fits_empty(request)

    def commit(self, assignment: Assignment, request: Request) -> None:
        for p in self.node_pools.get(assignment.node, ()):
            self.states[p].commit(assignment, request)
        self.ledger.take(assignment, request)

    def release(self, assignment: Assignment, request: Request) -> None:
        """Give capacity back. The caller bumps ``generation`` if the cycle ends up with more room."""
        for p in self.node_pools.get(assignment.node, ()):
            self.states[p].release(assignment, request)
        self.ledger.give(assignment, request)

    def block(self, name: str) -> None:
        """Take everything still free on node ``name`` so nothing else lands there this cycle."""
        led = self.ledger
        gpus = tuple((gid, free) for gid, free in led.gpu[name].items() if free > 0)
        filler = Request(cpu_milli=max(led.cpu[name], 0), memory_mib=max(led.mem[name], 0))
        self.commit(Assignment(name, gpus), filler)
