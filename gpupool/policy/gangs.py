"""Multi-node gangs: N replicas x G whole GPUs that start together or not at all.

A distributed training job (torchrun, Horovod) is useless in part: a replica
that runs while its peers wait holds GPUs and blocks at the first collective.
So the snapshot carries one :class:`~gpupool.policy.model.Workload` per
replica, linked by ``gang`` and ``gang_size``, each with its own single-node
assignment (capacity, the held count and the service's bookkeeping stay per
replica), and this module makes the engine treat the replicas as one job:

* **All or nothing, in one cycle.** The gang takes its turn in the fair
  order as its first replica would (priority, fair order, submission, id);
  every replica is placed in that turn or none is. Nothing is held for a
  gang that does not fit (no partial holds that starve others), except a
  starvation reservation (below).
* **Never partly running.** A snapshot where some replicas run and others
  are pending (a replica was lost) pauses the running ones so the gang
  restarts whole; pending replicas whose peers are missing from the snapshot
  wait. Running replicas whose peers are gone (the job is ending, replicas
  exit one by one) are left alone.
* **Quotas count every replica**: the gang's need is replicas x G, for the
  guarantee passes, limits and fair share.
* **Topology**: replicas go on as few nodes as possible, packed onto a node
  before spreading, within one node group (``Node.group``: a rack, a switch)
  when one group can hold them all (:func:`~gpupool.policy.gang_nodes.choose_nodes`).
* **Reclaim**: a gang is one victim; pausing it pauses every replica and
  counts all their GPUs against the victim project's guarantee. A gang
  claimant finds room for every replica (on several nodes if need be)
  before anything is paused (:mod:`gpupool.policy.gang_reclaim`).
* **Starvation**: a gang waiting longer than ``starvation_s`` reserves the
  nodes closest to holding all its replicas (one reservation, several
  nodes), so small jobs cannot keep taking the room it needs.

Which replicas form a gang, and the gangs that cannot take a turn at all,
is sorted out as the cycle opens (:mod:`gpupool.policy.gang_setup`); here is
a gang's turn in a training pass (:class:`GangTurns`, a phase object the
training pass calls), which seats the gang or asks gang reclaim
(:mod:`gpupool.policy.gang_reclaim`) for room. Everything here is skipped
when no workload of the snapshot is in a gang, so work without gangs is
decided exactly as before.
"""

from __future__ import annotations

import numpy as np

from gpupool.policy import reasons as txt
from gpupool.policy.cycle_state import CycleState
from gpupool.policy.gang import Gang
from gpupool.policy.gang_actions import gang_groups, seat_gang, wait_all
from gpupool.policy.gang_nodes import choose_nodes
from gpupool.policy.gang_reclaim import GangReclaim
from gpupool.policy.memo import FailureMemo
from gpupool.policy.model import TRAIN_POOL, Project, Request, Workload


class GangTurns:
    """Gangs taking their turns in the training passes (see the module docstring)."""

    def __init__(self, state: CycleState, gang_reclaim: GangReclaim) -> None:
        self.state = state
        self.gang_reclaim = gang_reclaim
        self.gang_failed: FailureMemo[bool] = FailureMemo()  # context: the gang's size (see place_gang)
        self.gang_failed_sizes: list[int] = []
        self.gang_smallest_failed: dict[int, tuple[Request, int]] = {}  # id(request) -> (it, smallest failed size)
        self.gang_texts: dict[tuple, str] = {}
        self.gang_fit_total: dict[tuple, int] = {}  # see place_gang
        # (id(request), project, within, priority) -> ((generation, use, reservers, starts), replicas, reason)
        self.gang_verdicts: dict[tuple, tuple[tuple[int, int, int, int], int, str]] = {}  # see take_turn

    # ------------------------------------------------------------ a gang's turn

    def take_turn(self, w: Workload, first: bool, deferred: list[Workload], starving_from: float) -> None:
        """The gang whose first replica is ``w`` takes its turn in a training pass."""
        st = self.state
        gang = st.gang_led_by[w.id]
        p = st.projects[gang.project]
        need = gang.need
        used = st.usage[p.name]
        g = p.train_guarantee_milli
        within = used < g or used + need <= g
        since = w.paused_at if w.paused_at is not None else w.submitted_at
        if first and not within and since > starving_from:
            deferred.append(w)
            return
        # A gang like one that just waited (the same replicas, no fewer of them, same project, priority;
        # nothing started, paused or reserved since) waits for the same reason, as the training pass's
        # verdict memo does for single jobs: placement and reclaim would fail the same way. A starving
        # gang must still try for a reservation, one in its resume backoff says so itself, and one past
        # its limit says that.
        key = (id(gang.request), p.name, within, w.priority)
        n_reservers = st.n_reservers
        mark = (st.cap.generation, used, n_reservers, len(st.started))
        settled = within or w.paused_at is None or st.now - w.paused_at >= st.cfg.resume_backoff_s
        quiet = n_reservers >= st.cfg.max_reservations or since > starving_from
        limit = p.train_limit_milli
        seen = self.gang_verdicts.get(key)
        if (seen is not None and seen[0] == mark and seen[1] <= gang.size and settled and quiet
                and (limit is None or used + need <= limit)):
            wait_all(st, gang, gang.text + seen[2])
            return
        before = len(st.waits)
        self.schedule_gang(gang, p, within)
        if settled and len(st.waits) > before and st.n_reservers == n_reservers:
            reason = st.waits[-1].reason
            if reason.startswith(gang.text + ":") and (seen is None or seen[0] != mark or gang.size < seen[1]):
                self.gang_verdicts[key] = (mark, gang.size, reason[len(gang.text):])

    def schedule_gang(self, gang: Gang, p: Project, within: bool) -> None:
        """Seat every replica on free room, or by pausing units (gang reclaim), or say why the gang waits."""
        st = self.state
        cfg = st.cfg
        w = gang.leader
        used, need, limit = st.usage[p.name], gang.need, p.train_limit_milli
        if limit is not None and used + need > limit:
            wait_all(st, gang, (
                f"project {p.name} is at its training limit: it uses {txt.gpus(used)} of {txt.gpus(limit)} and "
                f"{gang.text} needs {txt.gpus(need)} (all replicas start together or none)"))
            return
        if not within and w.paused_at is not None and st.now - w.paused_at < cfg.resume_backoff_s:
            wait_all(st, gang, (
                f"{gang.text} was paused {txt.seconds(st.now - w.paused_at)} ago; it resumes on idle GPUs "
                f"only after {txt.seconds(cfg.resume_backoff_s)} (anti-flapping), or sooner within project "
                f"{p.name}'s guarantee"))
            return
        plan = self.place_gang(gang)
        if plan is not None:
            seat_gang(st, gang, plan, "")
            return
        why = self.gang_reclaim.claim_units(gang.pending, gang.request, gang.size, p, within, gang)
        if why is None:
            return
        what = self._gang_no_room(gang)  # (before a reservation blocks nodes)
        reserved = self.reserve_gang(gang)
        wait_all(st, gang, what + ("; " + reserved if reserved is not None else why))

    def place_gang(self, gang: Gang) -> list[tuple[str, int]] | None:
        """Nodes for every replica on free capacity now: [(node, replicas)], or None (nothing is taken).

        Failures are remembered for the rest of the generation (free room
        only shrinks meanwhile): a gang fails when one of no more replicas,
        each asking no more (:mod:`gpupool.policy.memo`), failed.
        """
        st = self.state
        generation = st.cap.generation
        req = gang.request
        memo = self.gang_failed
        if generation != memo.generation:
            self.gang_failed_sizes = []
            self.gang_smallest_failed = {}
        smallest = self.gang_smallest_failed.get(id(req))  # the common case: the same replica shape
        if smallest is not None and smallest[0] is req and smallest[1] <= gang.size:
            return None
        for size in self.gang_failed_sizes:
            if size <= gang.size and memo.get(size, req, generation):
                return None
        # replicas of this shape that fit anywhere now, remembered while nothing starts, is paused or reserved:
        # most gangs of a full cluster fail on it, whatever their size, without a pass over the nodes
        room_key = (id(req), generation, len(st.started), len(st.preempted), len(st.reserved))
        fit_total = self.gang_fit_total.get(room_key)
        state = st.cap.states[TRAIN_POOL]
        picks = None
        if fit_total is None or fit_total >= gang.size:
            room = state.replicas_fit(req)
            if fit_total is None:
                fit_total = self.gang_fit_total[room_key] = int(room.sum())
            if fit_total >= gang.size:
                picks = choose_nodes(room, gang.size, gang_groups(st), state.whole_free)
        if picks is None:
            memo.add(gang.size, req, generation, True)
            if smallest is None or smallest[0] is not req or gang.size < smallest[1]:
                self.gang_smallest_failed[id(req)] = (req, gang.size)
            if gang.size not in self.gang_failed_sizes:
                self.gang_failed_sizes.append(gang.size)
            return None
        return [(state.names[i], n) for i, n in picks]

    def _gang_no_room(self, gang: Gang) -> str:
        """What does not fit, for a waiting gang's reason (kept while nothing is started, paused or reserved)."""
        st = self.state
        key = (id(gang.request), st.cap.generation, len(st.started), len(st.reserved))
        text = self.gang_texts.get(key)
        if text is None:
            text = self.gang_texts[key] = self._gang_no_room_text(gang)
        return f"{gang.text}: {text}"

    def _gang_no_room_text(self, gang: Gang) -> str:
        st = self.state
        state = st.cap.states[TRAIN_POOL]
        room = state.replicas_fit(gang.request)
        nodes = int((room > 0).sum())
        fit = int(room.sum())
        one = txt.describe(gang.request).replace(" on one node", "")
        if fit:
            where = (f"only {nodes} node{'s' if nodes != 1 else ''} ha{'ve' if nodes != 1 else 's'} room for a "
                     f"replica ({one}), {fit} replica{'s' if fit != 1 else ''} would fit")
        else:
            where = f"no node has room for a replica ({one})"
        text = f"{where}; all replicas start together or none"
        if st.reserved:
            text += " (reserved for starving jobs: " + ", ".join(
                f"{node} for {job}" for node, job in sorted(st.reserved.items())) + ")"
        return text

    # ------------------------------------------------------------ starvation

    def reserve_gang(self, gang: Gang) -> str | None:
        """Head-of-line reservation for a starving gang: the nodes closest to holding every replica.

        Nodes that could hold a replica when empty are ranked by the replicas
        that fit now, then whole free GPUs, free CPU, free memory, node order;
        the first ones whose empty room adds up to the gang are reserved,
        within one node group when one can hold the gang. The reservation
        counts as one against ``max_reservations``. Nothing new lands on those
        nodes this cycle, so their room only grows until the gang fits.
        """
        st = self.state
        cfg = st.cfg
        if st.n_reservers >= cfg.max_reservations:
            return None
        w = gang.leader
        since = w.paused_at if w.paused_at is not None else w.submitted_at
        waited = st.now - since
        if waited < cfg.starvation_s:
            return None
        state = st.cap.states[TRAIN_POOL]
        req = gang.request
        empty = state.replicas_fit(req, empty=True)
        now = state.replicas_fit(req)
        ok = empty > 0
        for name in st.reserved:
            i = state.node_index.get(name)
            if i is not None:
                ok[i] = False
        cands = np.flatnonzero(ok)
        if int(empty[cands].sum()) < gang.size:
            return None
        groups = gang_groups(st)

        def ranked(idx: np.ndarray) -> list[int]:
            return sorted(idx.tolist(), key=lambda i: (-int(now[i]), -int(state.whole_free[i]),
                                                        -int(state.cpu_free[i]), -int(state.mem_free[i]), i))

        def take(order: list[int]) -> list[int]:
            out, got = [], 0
            for i in order:
                if got >= gang.size:
                    break
                out.append(i)
                got += int(empty[i])
            return out

        best: tuple[tuple, list[int]] | None = None
        for g in np.unique(groups[cands]).tolist():
            members = cands[groups[cands] == g]
            if int(empty[members].sum()) < gang.size:
                continue
            sel = take(ranked(members))
            key = (-sum(int(now[i]) for i in sel), len(sel), g)
            if best is None or key < best[0]:
                best = (key, sel)
        sel = best[1] if best is not None else take(ranked(cands))
        names = [state.names[i] for i in sel]
        have = ", ".join(f"{n} ({st.cap.ledger.free_gpus_text(n)})" for n in names)
        for n in names:
            st.cap.block(n)
            st.reserved[n] = w.id
        st.n_reservers += 1
        plural = len(names) > 1
        return (
            f"waiting {txt.seconds(waited)}, longer than {txt.seconds(cfg.starvation_s)}: "
            f"node{'s' if plural else ''} {have} {'are' if plural else 'is'} reserved for it and "
            f"take{'' if plural else 's'} no new work until all its replicas fit"
        )
