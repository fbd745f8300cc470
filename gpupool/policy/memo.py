"""Remembering, within one cycle, which request shapes cannot be served.

While a cycle places work, free capacity only shrinks (until a reclaim leaves
more room than it took, which the caller signals with a new *generation*). So
once a shape fails to fit, it keeps failing; and so does every shape that asks
for at least as much of everything. With thousands of pending jobs of a few
hundred shapes on a full cluster, that turns most placement and reclaim
attempts into a dictionary lookup and a short scan.

Dominance is kept to what is plainly true: same allowed models and placement rules, and the
"GPU level" (a fraction ``f`` counts ``f``; ``n`` whole GPUs count
``1000 * n``, since a whole free GPU has room for any fraction), CPU and
memory each at least as large. GPU-memory requests turn into a share that
depends on the GPU, so they are only remembered exactly.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

from gpupool.policy.model import MILLI, Request
from gpupool.policy.node_rules import NodeRules

T = TypeVar("T")


def gpu_level(req: Request) -> int:
    return req.gpus * MILLI if req.gpus else req.gpu_milli


class FailureMemo(Generic[T]):
    """Failed shapes per context, with a payload (e.g. why it failed) for each."""

    def __init__(self) -> None:
        self.generation = 0
        # keyed by id() for speed; the entry holds the request itself, which keeps the id from
        # being reused by another object and lets a lookup check it is the same request
        self._exact: dict[tuple[Hashable, int], tuple[Request, T]] = {}
        self._frontier: dict[tuple[Hashable, frozenset[str], NodeRules | None], list[tuple[int, int, int, T]]] = {}

    def _sync(self, generation: int) -> None:
        if generation != self.generation:
            self.generation = generation
            self._exact.clear()
            self._frontier.clear()

    def get(self, context: Hashable, req: Request, generation: int) -> T | None:
        """The payload of a remembered failure that implies ``req`` fails too, or None."""
        self._sync(generation)
        hit = self._exact.get((context, id(req)))
        if hit is not None and hit[0] is req:
            return hit[1]
        if req.gpu_memory_mib:
            return None
        frontier = self._frontier.get((context, req.gpu_models, req.rules))
        if frontier:
            level, cpu, mem = gpu_level(req), req.cpu_milli, req.memory_mib
            for f_level, f_cpu, f_mem, payload in frontier:
                if level >= f_level and cpu >= f_cpu and mem >= f_mem:
                    self._exact[(context, id(req))] = (req, payload)
                    return payload
        return None

    def add(self, context: Hashable, req: Request, generation: int, payload: T) -> None:
        """Remember that ``req`` failed in ``context``."""
        self._sync(generation)
        self._exact[(context, id(req))] = (req, payload)
        if req.gpu_memory_mib:
            return
        key = (context, req.gpu_models, req.rules)
        level, cpu, mem = gpu_level(req), req.cpu_milli, req.memory_mib
        frontier = [
            e for e in self._frontier.get(key, []) if not (e[0] >= level and e[1] >= cpu and e[2] >= mem)
        ]
        frontier.append((level, cpu, mem, payload))
        self._frontier[key] = frontier
