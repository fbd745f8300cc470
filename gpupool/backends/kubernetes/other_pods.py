"""GPUs that other schedulers' pods hold on the pool's nodes: used capacity gpupool never hands out.

A pod placed by kube-scheduler (or any scheduler but gpupool) that asks for
``nvidia.com/gpu`` gets its GPUs from the node's device plugin, which gpupool
does not see. So each such pod, in any namespace, bound to a pool node and not
finished, takes that many of the node's GPUs out of what gpupool gives away.
Which GPU ids it is shown holding is chosen by gpupool, deterministically and
stickily: the node's highest-indexed GPUs that no other such pod holds, pods
taken in order of creation (then namespace/name), and a pod keeps the GPUs it
was first shown on while it lives. gpupool's own placement fills nodes from
their lowest-indexed GPUs, so the two meet only on a full node.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kubernetes import client

from gpupool.backends.kubernetes import objects as ob
from gpupool.backends.kubernetes.foreign import gpus_asked
from gpupool.backends.kubernetes.health import Health
from gpupool.backends.kubernetes.objects import Obj
from gpupool.backends.kubernetes.watcher import ListWatch
from gpupool.policy.model import MILLI, Assignment, Kind, Node, Request, Workload

log = logging.getLogger("gpupool.backends.kubernetes")

OTHER_PROJECT = "\x00other scheduler"
"""The project of other schedulers' pods in the policy's snapshot: not a real project's name (a NUL), so
the engine counts them as capacity held by no project, places around them and never pauses them."""
OTHER_LABEL = "(other scheduler)"


@dataclass(frozen=True)
class OtherPod:
    """One other scheduler's pod holding GPUs: ``<namespace>/<name>``, its node, how many GPUs."""

    uid: str
    text: str
    node: str
    gpus: int
    created: float
    claims: bool = False  # it uses ResourceClaims: the devices allocated to it are the GPUs it holds


@dataclass(frozen=True)
class Holding:
    """GPUs an other scheduler's pod is shown holding."""

    pod: OtherPod
    gpu_ids: tuple[str, ...]

    @property
    def holder(self) -> str:
        """``<namespace>/<name>`` of the pod (an :class:`gpupool.backends.base.OutsideHolding`)."""
        return self.pod.text


def read_other(pod: Obj) -> OtherPod | None:
    """An other scheduler's pod (its JSON) as a GPU holder, or None when it asks for no GPU."""
    n = gpus_asked(pod)
    node = ob.node_name(pod)
    claims = bool(ob.spec(pod).get("resourceClaims"))
    if (n <= 0 and not claims) or not node:
        return None
    created = ob.creation_time(pod)
    return OtherPod(ob.uid(pod), f"{ob.namespace(pod)}/{ob.name(pod)}", node, n,
                    created.timestamp() if created is not None else 0.0, claims)


class OtherPods:
    """A cluster-wide list+watch of bound, unfinished pods that other schedulers placed and that hold GPUs."""

    def __init__(self, api: client.CoreV1Api, scheduler_name: str, health: Health) -> None:
        self._lock = threading.Lock()
        self._pods: dict[str, OtherPod] = {}  # by uid (watch thread writes)
        self._changed = True
        self._sticky: dict[str, tuple[str, ...]] = {}  # uid -> GPU ids it was shown on (loop side)
        self.holdings: tuple[Holding, ...] = ()
        self.claimed_gpus: Callable[[str], tuple[str, ...]] = lambda uid: ()
        """Pod uid -> the GPU ids its DRA claims were allocated (dra_allocation.py): exact, not chosen here."""
        """The current holdings (set by :meth:`refresh` on the core's loop)."""
        selector = (f"spec.nodeName!=,spec.schedulerName!={scheduler_name},"
                    "status.phase!=Succeeded,status.phase!=Failed")
        self.watch = ListWatch("other-pods", api.list_pod_for_all_namespaces, self._on_reset, self._on_event,
                               health, field_selector=selector)

    def start(self) -> None:
        self.watch.start()

    def close(self) -> None:
        self.watch.stop(wait_s=0.5)

    def _on_reset(self, items: list[Obj]) -> None:
        seen = {}
        for p in items:
            o = read_other(p)
            if o is not None:
                seen[o.uid] = o
        with self._lock:
            if seen != self._pods:
                self._pods = seen
                self._changed = True

    def _on_event(self, kind: str, pod: Obj) -> None:
        o = None if kind == "DELETED" else read_other(pod)
        uid = ob.uid(pod)
        with self._lock:
            if o is None:
                if self._pods.pop(uid, None) is not None:
                    self._changed = True
            elif self._pods.get(uid) != o:
                self._pods[uid] = o
                self._changed = True

    def touch(self) -> None:
        """Something its holdings depend on changed elsewhere (a claim's allocation): recompute at the next refresh."""
        with self._lock:
            self._changed = True

    def refresh(self, nodes: Iterable[Node], force: bool = False) -> bool:
        """Recompute the holdings on ``nodes`` (the pool) after a change; True when they changed."""
        with self._lock:
            if not (self._changed or force):
                return False
            self._changed = False
            pods = sorted(self._pods.values(), key=lambda o: (o.created, o.text))
        held = assign(nodes, pods, self._sticky, self.claimed_gpus)
        self._sticky = {h.pod.uid: h.gpu_ids for h in held}
        if held == self.holdings:
            return False
        self.holdings = held
        return True

    def workloads(self) -> tuple[Workload, ...]:
        """The holdings as running workloads of no project, for the policy's snapshot."""
        return tuple(Workload(id=f"other:{h.pod.uid}", project=OTHER_PROJECT, kind=Kind.TRAIN,
                              request=Request(gpus=len(h.gpu_ids)),
                              assignment=Assignment(h.pod.node, tuple((g, MILLI) for g in h.gpu_ids)),
                              started_at=h.pod.created)
                     for h in self.holdings if h.gpu_ids)


def assign(nodes: Iterable[Node], pods: list[OtherPod], sticky: dict[str, tuple[str, ...]],
           claimed: Callable[[str], tuple[str, ...]] = lambda uid: ()) -> tuple[Holding, ...]:
    """Which GPU ids each pod is shown holding (pure; ``pods`` in creation order).

    A pod keeps the ids it had while they are still its node's and no earlier
    pod took them; the others get the highest-indexed GPUs still free. A node
    asked for more GPUs than it has (the device plugin would not allow it)
    gives what is left, and the rest is logged.
    """
    by_node = {n.name: n for n in nodes}
    taken: dict[str, set[str]] = {}
    out: list[Holding] = []
    later: list[OtherPod] = []
    for o in [o for o in pods if o.claims]:  # DRA: the devices allocated to it, exactly
        node = by_node.get(o.node)
        if node is not None:
            ids = {g.id for g in node.gpus}
            got = tuple(dict.fromkeys(g for g in claimed(o.uid) if g in ids))
            taken.setdefault(o.node, set()).update(got)
            out.append(Holding(o, got))
    for o in [o for o in pods if not o.claims]:
        node = by_node.get(o.node)
        if node is None:
            continue  # not a pool node: nothing of ours to count
        ids = {g.id for g in node.gpus}
        have = sticky.get(o.uid, ())
        used = taken.setdefault(o.node, set())
        if len(have) == o.gpus and set(have) <= ids and not used & set(have):
            used.update(have)
            out.append(Holding(o, have))
        else:
            later.append(o)
    for o in later:
        node = by_node[o.node]
        used = taken.setdefault(o.node, set())
        free = [g.id for g in sorted(node.gpus, key=lambda g: -g.index) if g.id not in used]
        got = tuple(free[:o.gpus])
        if len(got) < o.gpus:
            log.warning("pod %s asks for %d GPUs on node %s, which has only %d left", o.text, o.gpus, o.node,
                        len(got))
        used.update(got)
        out.append(Holding(o, got))
    out.sort(key=lambda h: (h.pod.created, h.pod.text))
    return tuple(out)
