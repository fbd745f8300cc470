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
    The FGD paper's BestFit baseline (:mod:`gpupool.policy.placement_baselines`):
    node score ``int(100 * (1 - (0.5 * cpu_after / 128000 + 0.5 * gpu_after / 8000)))``,
    highest wins; a fraction goes on the fitting GPU with the least free share.
``firstfit``
    The first node (in node order) that fits; lowest-index GPUs (same module).

All policies: a whole-GPU request takes ``gpus`` whole free GPUs on one node,
in one topology group when any node can offer that; ties are broken by a fixed
node order (the node list order, or ``tie_rank``), never by hash order.

This module keeps the free capacity and answers ``find``; the rest of placement
is in modules of its own: the hardware layout (``placement_layout``), the nodes
rules allow (``placement_rules``), request shapes and the checks on a request
(``placement_shapes``), narrowing the candidates (``placement_candidates``), the
policies' choices (``placement_baselines``, ``placement_scoring`` with the
measures of ``placement_capacity`` and ``placement_frag``), seating a request
on the chosen node (``placement_slots``) and the pool-wide fit questions
(``placement_fit``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

from gpupool.policy import placement_fit as fit
from gpupool.policy.cache import scoped
from gpupool.policy.held import Held, held_by
from gpupool.policy.model import Assignment, Node, Request, Workload
from gpupool.policy.placement_baselines import choose_bestfit, choose_firstfit
from gpupool.policy.placement_candidates import distinct_states, prefer_one_group
from gpupool.policy.placement_capacity import CapacityModel
from gpupool.policy.placement_frag import FragModel
from gpupool.policy.placement_layout import layout_of
from gpupool.policy.placement_rules import preferred_first, rule_masks
from gpupool.policy.placement_scoring import MeasureScorer
from gpupool.policy.placement_shapes import check_request, request_shape
from gpupool.policy.placement_slots import assignment_on
from gpupool.wire.errors import InvalidRequest

POLICIES = ("default", "fgd", "bestfit", "firstfit")

FITS_EMPTY_KEEP = 10_000  # requests whose "fits an empty pool" answer is kept with the layout


class FreeState:
    """Mutable free capacity of one pool for one scheduling cycle.

    Build it with :meth:`from_nodes`. Arrays are indexed ``[node, slot]`` where
    ``slot`` is the GPU's position on its node; nodes with fewer GPUs than the
    widest node are padded with slots of capacity 0 that never fit anything.
    """

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
        self.rank_is_order = bool(np.array_equal(rank, np.arange(n)))
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

    def model_mask(self, models: frozenset[str]) -> np.ndarray:
        """GPU slots whose model is allowed (cached per model set)."""
        mask = self._model_masks.get(models)
        if mask is None:
            ids = [self.models[m] for m in sorted(models) if m in self.models]
            mask = np.isin(self.model_id, ids) & self.valid
            self._model_masks[models] = mask
        return mask

    def closest(self, request: Request, skip: Iterable[str] = ()) -> str | None:
        """The node nearest to holding ``request`` now (:func:`~gpupool.policy.placement_fit.closest`)."""
        return fit.closest(self, request, skip)

    def replicas_fit(self, request: Request, empty: bool = False) -> np.ndarray:
        """Per node, how many copies of a whole-GPU ``request`` fit (:func:`.placement_fit.replicas_fit`)."""
        return fit.replicas_fit(self, request, empty)

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
        check_request(request)
        if len(self._fits_empty) >= FITS_EMPTY_KEEP:
            self._fits_empty.clear()
        known = self._fits_empty[request] = self._fits_when_empty(request)
        return known

    def _fits_when_empty(self, request: Request) -> bool:
        return bool(self.rows_fitting(request, empty=True).any())

    def rows_fitting(self, request: Request, empty: bool, ruled: bool = True) -> np.ndarray:
        """Per node, whether ``request`` fits (:func:`~gpupool.policy.placement_fit.rows_fitting`)."""
        return fit.rows_fitting(self, request, empty, ruled)

    def find(self, request: Request) -> Assignment | None:
        """The best place for ``request`` under the policy, or None; commits nothing."""
        check_request(request)
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
                ok, gmask = fit.gpu_ok(self, request, self.free, self.cap)
                mask &= gmask
            else:
                mask &= self.whole_free >= request.gpus
        elif request.gpu_milli and not request.gpu_models:
            mask &= self.max_share >= request.gpu_milli
        elif request.gpu_milli or request.gpu_memory_mib:
            ok, gmask = fit.gpu_ok(self, request, self.free, self.cap)
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
            kept = self.tie_rank, self.rank_is_order
            self.tie_rank, self.rank_is_order = rank, False
            try:
                i, slots = self._pick(cand, ok, request)
            finally:
                self.tie_rank, self.rank_is_order = kept
        found = assignment_on(self, i, slots, request)
        if len(self._found) > 4096:
            self._found.clear()
        self._found[request] = (self._version, found)
        return found

    def _pick(self, cand: np.ndarray, ok: np.ndarray | None, request: Request) -> tuple[int, list[int]]:
        """(node, GPU slots) among the nodes ``cand`` where the request fits (``ok``: usable slots, all rows)."""
        cand = distinct_states(self, cand)
        if request.gpus > 1 and self.max_groups > 1:
            cand = prefer_one_group(self, cand, request)
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

    def _gpu_ok_rows(self, cand: np.ndarray, request: Request) -> np.ndarray:
        """GPU slots with room for a fraction, on the candidate rows only (cheaper than all rows)."""
        return (self.free[cand] >= request.gpu_milli) & self.valid[cand]

    # ------------------------------------------------------------ choosing

    def _choose(self, cand: np.ndarray, ok: np.ndarray | None, request: Request) -> tuple[int, list[int]]:
        """Pick (node, GPU slots) among candidate nodes.

        ``ok`` marks usable slots per candidate; None for CPU-only work and for
        whole GPUs of any model (any wholly free GPU will do:
        :func:`~gpupool.policy.placement_slots.whole_usable`).
        """
        if self.policy == "firstfit":
            return choose_firstfit(self, cand, ok, request)
        if self.policy == "bestfit":
            return choose_bestfit(self, cand, ok, request)
        assert self.frag is not None
        return self.frag.choose(cand, ok, request, pack_ties=self.policy == "default")

    # ------------------------------------------------------------ reporting

    def free_gpu_milli(self) -> int:
        """Free milli-GPU summed over the pool (for reports and tests)."""
        return int(np.where(self.valid, self.free, 0).sum())

    def shape_of(self, request: Request) -> tuple | None:
        """The fragmentation model's key for a request (exposed for tests)."""
        return request_shape(request)
