"""One request object per distinct request shape in a cycle, helped by the last cycle's answer.

The engine keys its per-cycle memos by ``id()`` of an interned request, so
that equal shapes share them and no lookup rehashes a dataclass. Interning
means hashing and comparing each distinct request *object* of the pending
queue; the service builds one object per job, so at 10,000 queued jobs that
is 10,000 dataclass hashes and equality tests a cycle (the largest single
line of a steady cycle's profile), although the same objects come back
cycle after cycle (the service hands over the very same frozen workload for
a job that did not change, as :mod:`gpupool.policy.held` relies on).

So the answer for each object is kept for the next cycle (in the caller's
:class:`~gpupool.policy.cache.PolicyCache`), by identity: an
object seen last cycle is known to equal the request it was interned to then,
and only that one is hashed again (once per shape and cycle) to find this
cycle's interned request. The carry keeps its objects alive, so an id is
never reused by another object while it is in the carry. Equal shapes always
get one interned request within a cycle, whichever of them came first, so
the decisions are exactly those of interning from scratch.
"""

from __future__ import annotations

from gpupool.policy.cache import PolicyCache, active
from gpupool.policy.model import Request


class Interner:
    """Interns the requests of one cycle; :meth:`keep` hands its answers to the next cycle."""

    def __init__(self, cache: PolicyCache | None = None) -> None:
        """``cache``: where the last cycle's answers are and this cycle's go (default: the active one)."""
        self.canon: dict[Request, Request] = {}
        """Each distinct request shape -> the one object that stands for it this cycle."""
        self._cache = cache if cache is not None else active()
        self._carry: dict[int, tuple[Request, Request]] = self._cache.interned
        self._fixed: dict[int, Request] = {}  # id(a request interned last cycle) -> its stand-in this cycle
        self._next: dict[int, tuple[Request, Request]] = {}

    def intern(self, r: Request) -> Request:
        """The request that stands for ``r``'s shape this cycle (call once per distinct object)."""
        hit = self._carry.get(id(r))
        if hit is not None and hit[0] is r:
            earlier = hit[1]
            req = self._fixed.get(id(earlier))
            if req is None:  # (hashed once per shape and cycle)
                req = self._fixed[id(earlier)] = self.canon.setdefault(earlier, earlier)
        else:
            req = self.canon.setdefault(r, r)
        self._next[id(r)] = (r, req)
        return req

    def keep(self) -> None:
        """Hand this cycle's answers to the next one (only objects of this cycle's queue are kept)."""
        self._cache.interned = self._next
