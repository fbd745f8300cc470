"""A pod's disruption: its end asked for by someone, not reached by its container on its own (pure).

A container that exits because its pod was deleted (SIGTERM: 143, or 0 from a
command that checkpoints on SIGTERM, as gpupool asks), evicted by its kubelet
(node pressure: 137) or marked for disruption has not finished its work: its
exit status is not the job's result. What the pod shows of it:

- a ``DisruptionTarget`` condition (Kubernetes 1.26 on; its ``reason`` says who:
  the Eviction API, the taint manager, a preemption, the pod GC, the kubelet);
- ``status.reason: Evicted`` (the kubelet's node-pressure eviction: the pod is
  Failed, never deleted by it);
- a ``deletionTimestamp`` (``kubectl delete``, the Eviction API before 1.26, the
  taint manager's NoExecute eviction, a descheduler, or gpupool's own stop).

Who asked is not on the pod: gpupool's own stops are in its store (a job's
stop intent), so the core alone tells them from others'
(:class:`gpupool.backends.base.Interrupted` kind ``"disrupted"``).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from gpupool.backends.kubernetes import objects as ob
from gpupool.backends.kubernetes.objects import Obj

DISRUPTION_TARGET = "DisruptionTarget"
EVICTED = "Evicted"
DELETED = "Deleted"
"""The cause of a deletion with no ``DisruptionTarget`` condition (what this module calls it)."""

_BY_REASON = {
    "EvictionByEvictionAPI": "was evicted through the Eviction API (a drain or a descheduler)",
    "DeletionByTaintManager": "was evicted by the taint manager (a NoExecute taint on its node)",
    "PreemptionByScheduler": "was preempted by another scheduler",
    "PreemptionByKubeScheduler": "was preempted by another scheduler",
    "DeletionByPodGC": "was deleted by the pod garbage collector (its node is gone)",
    "TerminationByKubelet": "was terminated by its kubelet (node pressure or a node shutdown)",
}


@dataclass(frozen=True)
class Disruption:
    """What ended (or is ending) a pod from outside its container.

    ``cause``: the ``DisruptionTarget`` reason, ``Evicted`` or ``Deleted``;
    ``what``: that in words, after "its pod X" (``was evicted by ...``);
    ``since``: when it began (a container that finished in an earlier second
    ended on its own), or None when any end the pod shows is its doing (the
    kubelet's eviction: it kills a running container, never a finished one).
    """

    cause: str
    what: str
    since: dt.datetime | None


def _target(pod: Obj) -> Obj | None:
    for c in ob.conditions(pod):
        if c.get("type") == DISRUPTION_TARGET and c.get("status") == "True":
            return c
    return None


def _asked(pod: Obj) -> dt.datetime | None:
    """The deletion's start: its timestamp is when it is due (asked for + the grace)."""
    deleted = ob.deletion_time(pod)
    return deleted - dt.timedelta(seconds=ob.deletion_grace_s(pod)) if deleted is not None else None


def disruption(pod: Obj) -> Disruption | None:
    """How the pod is being (or was) disrupted, or None: no one but its container ends it."""
    asked = _asked(pod)
    target = _target(pod)
    if target is not None:
        reason = str(target.get("reason") or "")
        what = _BY_REASON.get(reason, f"was marked for disruption ({reason or 'no reason given'})")
        message = str(target.get("message") or "").strip()
        since = ob.parse_time(target.get("lastTransitionTime"))
        if asked is not None:
            since = min(since, asked) if since is not None else asked
        return Disruption(reason, f"{what}: {message}" if message else what, since)
    status = ob.status(pod)
    if status.get("reason") == EVICTED:
        node = ob.node_name(pod)
        message = str(status.get("message") or "").strip()
        what = f"was evicted by the kubelet of node {node}" if node else "was evicted by its kubelet"
        return Disruption(EVICTED, f"{what} ({message})" if message else what, None)
    if asked is not None:
        return Disruption(DELETED, "was deleted by someone else, not gpupool (kubectl delete, an eviction, "
                                   "a NoExecute taint or a descheduler)", asked)
    return None


def ended_before(finished: dt.datetime | None, d: Disruption) -> bool:
    """Whether a container that finished at ``finished`` ended before the disruption reached it.

    Compared in whole seconds (the kubelet's ``finishedAt`` and the deletion's
    timestamp are): a container that ends within the very second of the
    disruption counts as disrupted, so it resumes from its checkpoint rather
    than give a result that may be the disruption's.
    """
    if finished is None or d.since is None:
        return False
    return finished.replace(microsecond=0) < d.since.replace(microsecond=0)
