"""What one cycle leaves for the next to start from: a :class:`PolicyCache` that the caller owns.

The policy is a pure function of its snapshot, but a caller that asks it
every few seconds about nearly the same pool and queue can spare it work: the
same node objects mean the same hardware tables, the same request objects the
same interned shapes, and the running jobs of the last count need only the
difference counted. Those carries live in one object the caller creates and
hands to every call (``schedule(snapshot, cache)``; the service keeps one for
its lifetime), never in module state: two callers never share one unless
they choose to, and a call without one (``cache=None``) starts from nothing.
Either way the decisions are the same (tests/test_golden_decisions.py runs
chained cycles both ways); only the time differs.

Inside a call the cache is found through a context variable set for the
call's duration (:func:`using`), so the phases that read it (interning, the
held count, the node facts) need not pass it along. Code that builds
placement states outside a cycle (tests, benchmarks) gets a fresh cache per
entry point (:func:`scoped`) unless it sets one itself with :func:`using`.

One cache serves one cycle at a time: a caller running cycles concurrently
gives each its own.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar


@dataclass(eq=False)
class PolicyCache:
    """The carries from one cycle to the next (see the module's note); its contents are the policy's own."""

    interned: dict[int, Any] = field(default_factory=dict)
    """id(request object) -> (that object, the request it was interned to): :mod:`gpupool.policy.interning`."""
    held: dict[int, Any] = field(default_factory=dict)
    """id(layout) -> the last count of what running work holds there: :mod:`gpupool.policy.held`."""
    node_facts: dict[str, list[tuple[tuple[Any, ...], object]]] = field(default_factory=dict)
    """kind -> (node objects, what was built from them): :mod:`gpupool.policy.nodecache`."""


_active: ContextVar[PolicyCache | None] = ContextVar("gpupool_policy_cache", default=None)


def active() -> PolicyCache:
    """The cache of the call in progress; outside any, a fresh one (so nothing is carried)."""
    cache = _active.get()
    return cache if cache is not None else PolicyCache()


@contextmanager
def using(cache: PolicyCache) -> Iterator[PolicyCache]:
    """Make ``cache`` the active one for the ``with`` block."""
    token = _active.set(cache)
    try:
        yield cache
    finally:
        _active.reset(token)


@contextmanager
def scope() -> Iterator[PolicyCache]:
    """The active cache, or a fresh one for the ``with`` block (an entry point used outside a cycle)."""
    cache = _active.get()
    if cache is not None:
        yield cache
        return
    with using(PolicyCache()) as fresh:
        yield fresh


F = TypeVar("F", bound=Callable[..., Any])


def scoped(fn: F) -> F:
    """Run ``fn`` in :func:`scope`: what it builds from the same nodes within one call is built once."""
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if _active.get() is not None:
            return fn(*args, **kwargs)
        with using(PolicyCache()):
            return fn(*args, **kwargs)
    return call  # type: ignore[return-value]
