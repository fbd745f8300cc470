"""Where a workload goes: free-capacity bookkeeping and placement policies.

The engine builds one :class:`FreeState` per scheduling cycle from the pool's
nodes and the running workloads, then asks :meth:`FreeState.find` for a place
for each pending request (up to ~10k times a cycle) and :meth:`FreeState.commit`
for the ones it starts. Everything a query needs is kept in numpy arrays over
nodes (free share per GPU, free CPU and memory, count of whole free GPUs, the
largest free share) and refreshed one node row at a time on commit/release, so
a query is a handful of vectorised operations instead of a Python loop over
every node. A request that found no place is remembered until capacity is
released, so a long queue on a full cluster costs one dictionary lookup per job.

Policies (``FreeState.from_nodes(..., policy=...)``):

``default``
    Ours (:mod:`gpupool.policy.placement_capacity`): a request goes where it
    destroys the least GPU share that the coming work could still use, counting
    the CPU left next to free GPUs and the remainders fractions leave, with the
    request mix learned from running and requested work, plus the FGD term
    (weighted up as the learned share of GPU volume in multi-GPU gangs grows).
    It keeps whole GPUs and whole nodes free for large jobs and stops CPU-heavy
    work from stranding GPUs; ties go to the node left fullest.
``fgd``
    Fragmentation Gradient Descent (Weng et al., ATC'23) as a baseline
    (:mod:`gpupool.policy.placement_frag`): least increase of expected
    fragmentation as the authors' simulator scores it (an integer score, so
    near-equal increases tie), ties by node order, no packing tie-break.
``bestfit``
    The FGD paper's BestFit baseline: node score
    ``int(100 * (1 - (0.5 * cpu_after / 128000 + 0.5 * gpu_after / 8000)))``,
    highest wins; a fraction goes on the fitting GPU with the least free share.
``firstfit``
    The first node (in node order) that fits; lowest-index GPUs.

All policies: a whole-GPU request takes ``gpus`` whole free GPUs on one node,
in one topology group when any node can offer that; ties are broken by a fixed
node order (the node list order, or ``tie_rank``), never by hash order.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from gpupool.policy.cache import scoped
from gpupool.policy.held import Held, held_by
from gpupool.policy.model import Assignment, Node, Request, Workload
from gpupool.policy.placement_capacity import CapacityModel
from gpupool.policy.placement_frag import FragModel
from gpupool.policy.placement_layout import layout_of
from gpupool.policy.placement_rules import preferred_first, rule_masks
from gpupool.policy.placement_scoring import MeasureScorer
from gpupool.policy.placement_shapes import request_shape
from gpupool.wire.errors import InvalidRequest

POLICIES = ("default", "fgd", "bestfit", "firstfit")

FITS_EMPTY_KEEP = 10_000  # requests whose "fits an empty pool" answer is kept with the layout

# BestFit's normalisers are the paper's (the largest openb node: 128 cores, 8 GPUs).
_BESTFIT_CPU = 128_000.0
_BESTFIT_GPU = 8_000.0


def _check_request(request: Request) -> None:
    """Refuse a request that sets more than one GPU form or a nonsense amount."""
    forms = (request.gpus > 0) + (request.gpu_milli > 0) + (request.gpu_memory_mib > 0)
    if forms > 1:
        raise InvalidRequest("a request asks for whole GPUs, a GPU fraction or GPU memory, not several")
    if request.gpus < 0 or request.gpu_milli < 0 or request.gpu_memory_mib < 0:
        raise InvalidRequest("GPU amounts in a request cannot be negative")
    if request.gpu_milli > 1000:
        raise InvalidRequest(f"a GPU fraction is at most one GPU (got {request.gpu_milli} milli)")
    if request.cpu_milli < 0 or request.memory_mib < 0:
        raise InvalidRequest("CPU and memory in a request cannot be negative")


class FreeState:
    """Mutable free capacity of one pool for one scheduling cycle.

    Build it with :meth:`from_nodes`. Arrays are indexed ``[node, slot]`` where
    ``slot`` is the GPU's position on its node; nodes with fewer GPUs than the
    widest node are padded with slots of capacity 0 that never fit anything.
    """

    DISTINCT_MIN = 96  # fewer candidates: scoring duplicate states costs less than finding them

    _maxima: tuple[int, int, int, int] | None  # see _global_max (reset whenever free capacity changes)

    @scoped
    def __init__(
        self,
        nodes: Sequence[Node],
        policy: str = "default",
        tie_rank: Sequence[int] | None = None,
        workload: Iterable[Request] | None = None,
        *,
        expect: Iterable[Request] = (),
        build: bool = True,
    ) -> None:
        """See :meth:`from_nodes` (``build=False``: the caller rebuilds the policy's tables itself)."""
        if policy not in POLICIES:
            raise InvalidRequest(f"unknown placement policy {policy!r}; known: {', '.join(POLICIES)}")
        self.policy = policy
        self.nodes = tuple(nodes)
        lay = layout_of(self.nodes)
        n = len(self.nodes)
        self.names = lay.names
        self.node_index = lay.node_index
        self.cpu_total, self.mem_total = lay.cpu_total, lay.mem_total
        self.models = lay.models
        self.gpu_ids = lay.gpu_ids
        self.gpu_slot = lay.gpu_slot
        self._gpu_caps = lay.gpu_caps
        self.gpus_alike = lay.gpus_alike
        self.cap, self.gpu_mem, self.model_id, self.topo_id, self.valid = (
            lay.cap, lay.gpu_mem, lay.model_id, lay.topo_id, lay.valid)
        self.whole_slot = lay.whole_slot  # valid slots of capacity above 0: what whole-GPU work may take
        self.has_memory = lay.has_memory
        self.free = self.cap.copy()
        self.cpu_free = self.cpu_total.copy()
        self.mem_free = self.mem_total.copy()
        self.whole_free = np.zeros(n, dtype=np.int64)
        self.max_share = np.zeros(n, dtype=np.int64)
        self.max_groups = int(self.topo_id.max()) + 1 if n else 0
        rank = np.arange(n) if tie_rank is None else np.asarray(tie_rank, dtype=np.int64)
        if rank.shape != (n,):
            raise InvalidRequest("tie_rank must give one rank per node")
        self.tie_rank = rank
        self._rank_is_order = bool(np.array_equal(rank, np.arange(n)))
        self._model_masks: dict[frozenset[str], np.ndarray] = {}
        self.rules = rule_masks(self.nodes)  # the nodes each request's placement rules allow
        self._pref_ranks: dict[object, np.ndarray | None] = {}
        self._failed: dict[Request, int] = {}
        self._release_version = 0
        self._version = 0  # bumped by every commit/release: a found place stays valid until then
        self._found: dict[Request, tuple[int, Assignment]] = {}
        self.pair_cache: tuple | None = None  # see placement_candidates.fraction_pairs
        self.node_class = lay.node_class
        self._fits_empty = lay.fits_empty  # shared by every state over this hardware
        self._state_ids: dict[tuple, int] = {}
        self._refresh_all()
        self.frag: MeasureScorer | None = None
        if policy == "fgd":
            self.frag = FragModel(self, fixed=workload, expect=expect, build=build)
        elif policy == "default":
            self.frag = CapacityModel(self, fixed=workload, expect=expect, build=build)

    # ------------------------------------------------------------ building

    @classmethod
    @scoped
    def from_nodes(
        cls,
        nodes: Sequence[Node],
        running: Iterable[Workload],
        pool: str | None = None,
        policy: str = "default",
        *,
        tie_rank: Sequence[int] | None = None,
        workload: Iterable[Request] | None = None,
        expect: Iterable[Request] = (),
        held: Held | None = None,
    ) -> FreeState:
        """Free capacity of ``pool`` (None: every node) once ``running`` is subtracted.

        ``tie_rank`` (optional) orders nodes for tie-breaking (lower first);
        ``workload`` (optional) fixes the request mix the fragmentation policies
        aim at; without it they learn the mix from running and requested work.
        ``expect`` (optional): the requests :meth:`find` may be asked about (the
        engine passes its pending queue). It changes no choice; the
        fragmentation-aware policies size their tables for those types once,
        instead of rebuilding them at each new type.
        Running workloads on nodes outside the pool, or on GPUs no longer in it,
        are skipped: they hold nothing this state hands out.
        ``held`` (optional): what ``running`` holds, counted over exactly the
        pool's nodes (:func:`~gpupool.policy.held.held_by`); ``running`` is
        then not read. The engine counts once per pool and cycle, and builds the
        ledger from the count of a pool that has every node.
        """
        chosen = [nd for nd in nodes if pool is None or pool in nd.pools]
        if held is None:
            held = held_by(chosen, running)
        elif held.layout is not layout_of(tuple(chosen)):
            raise ValueError("held capacity was counted over another node list than the pool's")
        state = cls(chosen, policy=policy, tie_rank=tie_rank, workload=workload, expect=expect, build=False)
        state.free -= held.gpu
        state.cpu_free -= held.cpu
        state.mem_free -= held.mem
        state._refresh_all()
        if state.frag is not None:
            state.frag.observe_counts(held.counts)
            state.frag.rebuild()
        return state

    # ------------------------------------------------------------ bookkeeping

    def _refresh_all(self) -> None:
        full = (self.free == self.cap) & self.whole_slot
        self.whole_free = full.sum(axis=1)
        self.max_share = np.where(self.valid, self.free, 0).max(axis=1) if len(self.names) else self.max_share
        self.free_or_neg = np.where(self.valid, self.free, -1)
        self.part_share = (np.where(self.valid & (self.free < self.cap), self.free, 0).max(axis=1)
                           if len(self.names) else self.max_share.copy())
        # (_key_of for every node, with the row work done in numpy: this runs at every state's build)
        ids = self._state_ids
        keys = zip(self.node_class.tolist(), self.cpu_free.tolist(), map(tuple, np.sort(self.free, axis=1).tolist()),
                   strict=True)
        self.state_key = np.array([ids.setdefault(key, len(ids)) for key in keys], dtype=np.int64)
        self._maxima = None

    def _refresh_row(self, i: int) -> None:
        # plain Python: a node has a handful of GPUs, and this runs on every commit
        row = self.free[i].tolist()
        caps = self._gpu_caps[i]
        shares = row[: len(caps)]
        self.whole_free[i] = sum(1 for f, c in zip(shares, caps, strict=True) if f == c and c > 0)
        self.max_share[i] = max(shares, default=0)
        self.free_or_neg[i, : len(caps)] = shares
        # (as _refresh_all: untouched GPUs and empty slots count 0)
        part = [f if f < c else 0 for f, c in zip(shares, caps, strict=True)] + [0] * (len(row) - len(caps))
        self.part_share[i] = max(part, default=0)
        self.state_key[i] = self._key_of(i, row)
        self._maxima = None

    def _key_of(self, i: int, row: list[int] | None = None) -> int:
        """Small id shared by nodes in identical states (same hardware, same free CPU and GPU shares).

        Such nodes score alike under every policy, so the scorers evaluate one of
        each (the first by tie rank) instead of all of them. Free memory is left
        out: it is only ever a yes/no test (done before, on every node), no policy
        scores it, and leaving it out makes far fewer distinct states.
        """
        if row is None:
            row = self.free[i].tolist()
        key = (int(self.node_class[i]), int(self.cpu_free[i]), tuple(sorted(row)))
        return self._state_ids.setdefault(key, len(self._state_ids))

    def _global_max(self) -> tuple[int, int, int, int]:
        """(most whole free GPUs, largest free share, most free CPU, most free memory) on any node."""
        if self._maxima is None:
            if not self.names:
                self._maxima = (0, 0, -1, -1)
            else:
                self._maxima = (int(self.whole_free.max()), int(self.max_share.max()),
                                int(self.cpu_free.max()), int(self.mem_free.max()))
        return self._maxima

    def _apply(self, assignment: Assignment, request: Request, sign: int) -> int:
        i = self.node_index.get(assignment.node)
        if i is None:
            raise InvalidRequest(f"node {assignment.node!r} is not in this pool")
        self.cpu_free[i] += sign * request.cpu_milli
        self.mem_free[i] += sign * request.memory_mib
        for gid, milli in assignment.gpus:
            slot = self.gpu_slot.get(gid)
            if slot is None:
                continue  # a GPU gone from the inventory holds nothing we hand out
            if slot[0] != i:
                raise InvalidRequest(f"GPU {gid!r} is not on node {assignment.node!r}")
            self.free[slot] += sign * milli
        return i

    def commit(self, assignment: Assignment, request: Request) -> None:
        """Take ``assignment``'s capacity (after :meth:`find` chose it)."""
        hit = self._found.get(request)
        fresh = hit is not None and hit[0] == self._version and hit[1] == assignment
        i = self._apply(assignment, request, sign=-1)
        self._version += 1
        self._refresh_row(i)
        if self.frag is not None:
            # the place find() just chose: its scorer already knows the node's new row
            self.frag.update_row(i, request if fresh else None)

    def release(self, assignment: Assignment, request: Request) -> None:
        """Give back what :meth:`commit` took (e.g. a job the engine pauses)."""
        i = self._apply(assignment, request, sign=+1)
        self._refresh_row(i)
        self._release_version += 1
        self._version += 1
        if self.frag is not None:
            self.frag.update_row(i)

    # ------------------------------------------------------------ queries

    def _model_mask(self, models: frozenset[str]) -> np.ndarray:
        """GPU slots whose model is allowed (cached per model set)."""
        mask = self._model_masks.get(models)
        if mask is None:
            ids = [self.models[m] for m in sorted(models) if m in self.models]
            mask = np.isin(self.model_id, ids) & self.valid
            self._model_masks[models] = mask
        return mask

    def _need_per_gpu(self, request: Request) -> np.ndarray | int:
        """Milli a fractional/memory request takes on each GPU (memory: per GPU size)."""
        if request.gpu_memory_mib:
            need = -(-request.gpu_memory_mib * 1000 // self.gpu_mem)
            # (a GPU that reports no memory size never holds a memory request)
            return np.where((need <= self.cap) & self.has_memory, need, np.iinfo(np.int64).max)
        return request.gpu_milli

    def _gpu_ok(self, request: Request, free: np.ndarray, cap: np.ndarray) -> tuple[np.ndarray, Any]:
        """(usable GPU slots, node mask) for a GPU request on the given free matrix."""
        if request.gpus:
            ok = (free == cap) & self.whole_slot
            if request.gpu_models:
                ok &= self._model_mask(request.gpu_models)
            return ok, ok.sum(axis=1) >= request.gpus
        ok = free >= self._need_per_gpu(request)
        ok &= self.valid
        if request.gpu_models:
            ok &= self._model_mask(request.gpu_models)
        return ok, ok.any(axis=1)

    def closest(self, request: Request, skip: Iterable[str] = ()) -> str | None:
        """The node nearest to holding a GPU ``request`` now, among those that would hold it empty.

        Nearest: most whole free GPUs of an allowed model (for a fraction or a
        memory request: the largest free share on one), then the most free CPU,
        then memory; ties by node order. Nodes in ``skip`` are left out. The
        starvation rule reserves this node for a job that waited too long.
        """
        allowed = self.valid
        if request.gpu_models:
            allowed = allowed & self._model_mask(request.gpu_models)
        if request.gpu_memory_mib:
            allowed = allowed & self.has_memory
        ok = (self.cpu_total >= request.cpu_milli) & (self.mem_total >= request.memory_mib)
        if request.gpus:
            whole = allowed & self.whole_slot
            ok &= whole.sum(axis=1) >= request.gpus
            score = ((self.free >= self.cap) & whole).sum(axis=1)
        else:
            need = self._need_per_gpu(request)
            ok &= (allowed & (self.cap >= need) & (self.cap > 0)).any(axis=1)
            # the largest free share on an allowed GPU, over-full ones (below 0) included
            score = np.where(allowed, self.free, np.iinfo(np.int64).min).max(axis=1) if len(ok) else ok
        for name in skip:
            i = self.node_index.get(name)
            if i is not None:
                ok[i] = False
        ruled = self.allowed(request)
        if ruled is not None:
            ok &= ruled
        idx = np.flatnonzero(ok)
        if not len(idx):
            return None
        best = np.lexsort((-idx, self.mem_free[idx], self.cpu_free[idx], score[idx]))[-1]
        return self.names[int(idx[best])]

    def replicas_fit(self, request: Request, empty: bool = False) -> np.ndarray:
        """Per node, how many copies of a whole-GPU ``request`` fit now (``empty``: on the node were it empty).

        A multi-node gang's replicas may share a node; this is what the gang
        planner (:mod:`gpupool.policy.gangs`) spreads them over, in one
        vectorised pass instead of one :meth:`find` per replica and node.
        """
        if empty:
            free, cpu, mem = self.cap, self.cpu_total, self.mem_total
        else:
            free, cpu, mem = self.free, self.cpu_free, self.mem_free
        if request.gpu_models or empty:
            ok = (free >= self.cap) & self.whole_slot
            if request.gpu_models:
                ok &= self._model_mask(request.gpu_models)
            whole = ok.sum(axis=1)
        else:
            whole = self.whole_free
        room = whole // max(request.gpus, 1)
        if request.cpu_milli:
            room = np.minimum(room, np.maximum(cpu, 0) // request.cpu_milli)
        if request.memory_mib:
            room = np.minimum(room, np.maximum(mem, 0) // request.memory_mib)
        allowed = self.allowed(request)
        if allowed is not None:
            room = np.where(allowed, room, 0)
        return np.maximum(room, 0)

    def allowed(self, request: Request) -> np.ndarray | None:
        """The nodes ``request``'s placement rules allow (node taints included); None when all are."""
        if request.rules is None and not self.rules.repels:
            return None
        return self.rules.mask(request.rules)

    def fits_empty(self, request: Request) -> bool:
        """Whether ``request`` could ever fit in this pool if everything were free.

        The answer depends on the hardware alone, so it is kept with the layout
        and outlives the cycle (a queue asks it for each of its shapes, every cycle).
        """
        known = self._fits_empty.get(request)
        if known is not None:
            return known
        _check_request(request)
        if len(self._fits_empty) >= FITS_EMPTY_KEEP:
            self._fits_empty.clear()
        known = self._fits_empty[request] = self._fits_when_empty(request)
        return known

    def _fits_when_empty(self, request: Request) -> bool:
        return bool(self.rows_fitting(request, empty=True).any())

    def rows_fitting(self, request: Request, empty: bool, ruled: bool = True) -> np.ndarray:
        """Per node, whether ``request`` fits (``empty``: were the node empty); ``ruled``: where its rules allow.

        The plain, unhurried form of :meth:`find`'s test: for answers kept per
        shape (whether it could ever fit, why it cannot), not for the hot path.
        """
        if empty:
            free, cpu, mem = self.cap, self.cpu_total, self.mem_total
        else:
            free, cpu, mem = self.free, self.cpu_free, self.mem_free
        mask = (cpu >= request.cpu_milli) & (mem >= request.memory_mib)
        if request.gpus or request.gpu_milli or request.gpu_memory_mib:
            _, gmask = self._gpu_ok(request, free, self.cap)
            mask &= gmask
        allowed = self.allowed(request) if ruled else None
        if allowed is not None:
            mask &= allowed
        return mask

    def find(self, request: Request) -> Assignment | None:
        """The best place for ``request`` under the policy, or None; commits nothing."""
        _check_request(request)
        if self.frag is not None:
            self.frag.observe(request)
        if self._failed.get(request) == self._release_version:
            return None
        hit = self._found.get(request)
        if hit is not None and hit[0] == self._version:
            return hit[1]
        if self._maxima is not None:  # known since a request failed: rule out at once what fits nowhere
            most_whole, most_share, most_cpu, most_mem = self._maxima
            if (request.gpus > most_whole or request.gpu_milli > most_share or request.cpu_milli > most_cpu
                    or request.memory_mib > most_mem):
                self._failed[request] = self._release_version
                return None
        mask = (self.cpu_free >= request.cpu_milli) & (self.mem_free >= request.memory_mib)
        ok = None
        if request.gpus:
            if request.gpu_models:
                ok, gmask = self._gpu_ok(request, self.free, self.cap)
                mask &= gmask
            else:
                mask &= self.whole_free >= request.gpus
        elif request.gpu_milli and not request.gpu_models:
            mask &= self.max_share >= request.gpu_milli
        elif request.gpu_milli or request.gpu_memory_mib:
            ok, gmask = self._gpu_ok(request, self.free, self.cap)
            mask &= gmask
        rank = None
        if request.rules is not None or self.rules.repels or self.rules.soft_taints:
            allowed = self.rules.mask(request.rules)
            if allowed is not None:
                mask &= allowed
            rank = self._pref_rank(request)
        cand = mask.nonzero()[0]
        if cand.size == 0:
            self._failed[request] = self._release_version
            self._global_max()  # a full pool: the next requests are likely to fail too
            return None
        if rank is None:
            i, slots = self._pick(cand, ok, request)
        else:  # preferred nodes win ties: they come first in tie order for this request
            kept = self.tie_rank, self._rank_is_order
            self.tie_rank, self._rank_is_order = rank, False
            try:
                i, slots = self._pick(cand, ok, request)
            finally:
                self.tie_rank, self._rank_is_order = kept
        found = self._assignment(i, slots, request)
        if len(self._found) > 4096:
            self._found.clear()
        self._found[request] = (self._version, found)
        return found

    def _pick(self, cand: np.ndarray, ok: np.ndarray | None, request: Request) -> tuple[int, list[int]]:
        """(node, GPU slots) among the nodes ``cand`` where the request fits (``ok``: usable slots, all rows)."""
        cand = self._distinct(cand)
        if request.gpus > 1 and self.max_groups > 1:
            cand = self._prefer_one_group(cand, request)
        if ok is None and request.gpu_milli:
            ok = self._gpu_ok_rows(cand, request)
        elif ok is not None:
            ok = ok[cand]
        # (plain whole-GPU work: None, its GPUs are looked up on the chosen node only)
        return self._choose(cand, ok, request)

    def _pref_rank(self, request: Request) -> np.ndarray | None:
        """Tie order for a request that would rather have some nodes (preferred affinity, PreferNoSchedule).

        Preferred nodes first, then the usual tie order: a preference decides
        only between places the policy scores alike, so packing is untouched.
        """
        rules = request.rules
        if rules not in self._pref_ranks:
            self._pref_ranks[rules] = preferred_first(self.rules.scores(rules), self.tie_rank)
        return self._pref_ranks[rules]

    def _distinct(self, cand: np.ndarray) -> np.ndarray:
        """One candidate per distinct node state: the first in tie order (result in node order).

        Nodes in the same state score alike under every policy and ties go by tie
        rank, so dropping the others changes no answer and saves most of the
        scoring work on large, uniform clusters.
        """
        if cand.size < self.DISTINCT_MIN:
            return cand
        keys = self.state_key[cand]
        # by state, then tie rank, then node order (both sorts are stable and cand is ascending,
        # so with tie ranks in node order sorting by state alone is the same order)
        if self._rank_is_order:
            order = keys.argsort(kind="stable")
        else:
            order = np.lexsort((self.tie_rank[cand], keys))
        by_state = keys[order]
        first = np.empty(by_state.size, dtype=bool)
        first[0] = True
        np.not_equal(by_state[1:], by_state[:-1], out=first[1:])
        if first.all():
            return cand
        return np.sort(cand[order[first]])

    def _gpu_ok_rows(self, cand: np.ndarray, request: Request) -> np.ndarray:
        """GPU slots with room for a fraction, on the candidate rows only (cheaper than all rows)."""
        return (self.free[cand] >= request.gpu_milli) & self.valid[cand]

    def whole_usable(self, i: int, request: Request) -> np.ndarray:
        """Slots of node ``i`` wholly free (and of an allowed model) for whole-GPU work."""
        ok = (self.free[i] == self.cap[i]) & self.whole_slot[i]
        if request.gpu_models:
            ok &= self._model_mask(request.gpu_models)[i]
        return np.flatnonzero(ok)

    def _prefer_one_group(self, cand: np.ndarray, request: Request) -> np.ndarray:
        """Keep only nodes that can seat a multi-GPU request inside one topology group, if any can."""
        full = (self.free[cand] == self.cap[cand]) & self.whole_slot[cand]
        if request.gpu_models:
            full &= self._model_mask(request.gpu_models)[cand]
        topo = self.topo_id[cand]
        best = np.zeros(cand.size, dtype=np.int64)
        for grp in range(self.max_groups):
            best = np.maximum(best, (full & (topo == grp)).sum(axis=1))
        one = best >= request.gpus
        return cand[one] if one.any() else cand

    # ------------------------------------------------------------ choosing

    def _choose(self, cand: np.ndarray, ok: np.ndarray | None, request: Request) -> tuple[int, list[int]]:
        """Pick (node, GPU slots) among candidate nodes.

        ``ok`` marks usable slots per candidate; None for CPU-only work and for
        whole GPUs of any model (any wholly free GPU will do: see :meth:`whole_usable`).
        """
        if self.policy == "firstfit":
            k = int(np.argmin(self.tie_rank[cand]))
            return int(cand[k]), self._slots(int(cand[k]), ok[k] if ok is not None else None, request)
        if self.policy == "bestfit":
            return self._choose_bestfit(cand, ok, request)
        assert self.frag is not None
        return self.frag.choose(cand, ok, request, pack_ties=self.policy == "default")

    def _choose_bestfit(self, cand: np.ndarray, ok: np.ndarray | None, request: Request) -> tuple[int, list[int]]:
        gpu_take = request.gpus * 1000 if request.gpus else request.gpu_milli
        if request.gpu_memory_mib:
            gpu_take = 0  # per-GPU; BestFit is defined for milli requests, score as if free
        gpu_after = np.where(self.valid[cand], self.free[cand], 0).sum(axis=1) - gpu_take
        cpu_after = self.cpu_free[cand] - request.cpu_milli
        score = (100.0 * (1.0 - (0.5 * cpu_after / _BESTFIT_CPU + 0.5 * gpu_after / _BESTFIT_GPU))).astype(np.int64)
        order = np.lexsort((self.tie_rank[cand], -score))
        k = int(order[0])
        i = int(cand[k])
        return i, self._slots(i, ok[k] if ok is not None else None, request, least_free=True)

    def _slots(self, i: int, ok_row: np.ndarray | None, request: Request, least_free: bool = False) -> list[int]:
        """GPU slots on node ``i`` for the request (empty for CPU-only work)."""
        if request.gpus:
            usable = np.flatnonzero(ok_row) if ok_row is not None else self.whole_usable(i, request)
            return self.whole_slots(i, usable, request.gpus)
        if ok_row is None:
            return []
        usable = np.flatnonzero(ok_row)
        if least_free:
            free = self.free[i, usable]
            return [int(usable[int(np.argmin(free))])]
        return [int(usable[0])]

    def whole_slots(self, i: int, usable: np.ndarray, n: int) -> list[int]:
        """``n`` whole free GPUs on node ``i``: inside one topology group when one has room.

        Among groups that can hold the request the one with the fewest free GPUs is
        used (it keeps larger groups intact); else GPUs come from the fullest-free
        groups first. Within a group, lowest slot first.
        """
        if n == 1 or self.max_groups <= 1:
            return [int(s) for s in usable[:n]]
        by_group: dict[int, list[int]] = {}
        for s in usable:
            by_group.setdefault(int(self.topo_id[i, s]), []).append(int(s))
        fitting = [g for g, slots in by_group.items() if len(slots) >= n]
        if fitting:
            g = min(fitting, key=lambda x: (len(by_group[x]), by_group[x][0]))
            return by_group[g][:n]
        groups = sorted(by_group.values(), key=lambda slots: (-len(slots), slots[0]))
        picked = [s for slots in groups for s in slots][:n]
        return sorted(picked)

    def _assignment(self, i: int, slots: list[int], request: Request) -> Assignment:
        gpus = []
        for s in slots:
            if request.gpus:
                milli = int(self.cap[i, s])
            elif request.gpu_memory_mib:
                milli = math.ceil(request.gpu_memory_mib * 1000 / int(self.gpu_mem[i, s]))
            else:
                milli = request.gpu_milli
            gpus.append((self.gpu_ids[i][s], milli))
        return Assignment(node=self.names[i], gpus=tuple(gpus))

    # ------------------------------------------------------------ reporting

    def free_gpu_milli(self) -> int:
        """Free milli-GPU summed over the pool (for reports and tests)."""
        return int(np.where(self.valid, self.free, 0).sum())

    def shape_of(self, request: Request) -> tuple | None:
        """The fragmentation model's key for a request (exposed for tests)."""
        return request_shape(request)
