"""A Kubernetes Node (its JSON) -> the pool's view of it (pure: no API calls).

A node is in the pool when its allocatable ``nvidia.com/gpu`` is above 0 and
it may take work: Ready, not cordoned, without the node controller's
``node.kubernetes.io/*`` NoSchedule/NoExecute taints. A GPU node's
``nvidia.com/gpu`` taint (common: it keeps CPU pods off GPU nodes) is one
every pod gpupool places accepts (ours tolerate it). Every other taint, and
the node's labels, go to the policy as they are: a job lands on a tainted
node only when it tolerates the taint, and only on nodes its nodeSelector and
node affinity allow (docs/kubernetes.md, "Placement rules").
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from typing import Any

from kubernetes.utils import parse_quantity

from gpupool.backends.kubernetes import objects as ob
from gpupool.backends.kubernetes.dra_slices import DRA_NODE_LABEL, DraNode
from gpupool.backends.kubernetes.names import (
    GPU_MEMORY_LABEL,
    GPU_PRODUCT_LABEL,
    GPU_RESOURCE,
    GPUS_ANNOTATION,
    POOL_LABEL,
    RACK_LABEL,
    ZONE_LABEL,
)
from gpupool.backends.kubernetes.objects import Obj
from gpupool.inventory import GpuInfo
from gpupool.inventory.nvml import normalize_model
from gpupool.policy.model import BUILD_POOL, TRAIN_POOL, Gpu, Node
from gpupool.policy.node_rules import EFFECTS, Taint

log = logging.getLogger("gpupool.backends.kubernetes")

MIB = 1024 * 1024
POOLS = {"build": frozenset({BUILD_POOL}), "train": frozenset({TRAIN_POOL}),
         "both": frozenset({BUILD_POOL, TRAIN_POOL})}
_CONTROLLER_TAINT = "node.kubernetes.io/"


@dataclass(frozen=True)
class PoolNode:
    """One GPU node as the pool sees it; ``problem`` says why it takes no work ("" when it does)."""

    name: str
    gpus: tuple[GpuInfo, ...]
    pools: frozenset[str]
    cpu_milli: int
    memory_mib: int
    problem: str = ""
    group: str = ""  # rack or switch (label gpupool.io/rack, else topology.kubernetes.io/zone); "" unknown
    labels: tuple[tuple[str, str], ...] = ()  # the node's labels, sorted: what nodeSelector and affinity read
    taints: tuple[Taint, ...] = ()  # its taints that placement weighs (see placement_taints)
    # no kubelet will finish its pods (Ready is not True): its pods are deleted for good after the grace. Apart
    # from ``problem``, which names only the first reason: a dead node an admin has also cordoned is still lost.
    lost: bool = False

    def policy_node(self) -> Node:
        """The policy's Node (memory in MiB)."""
        return Node(self.name, self.cpu_milli, self.memory_mib,
                    tuple(Gpu(g.id, g.index, g.model, g.memory // MIB, g.topology_group) for g in self.gpus),
                    self.pools, self.group, self.labels, self.taints)


def read_node(node: Obj, dra: DraNode | None = None) -> PoolNode | None:
    """The pool's view of a Node (its JSON), or None when it has no GPU (not ours to schedule).

    ``dra``: its GPUs as the DRA driver's ResourceSlices publish them
    (:mod:`.dra_slices`); when there are some they are its GPUs, with or
    without ``nvidia.com/gpu`` in its allocatable.
    """
    dra_gpus = dra.gpus if dra is not None else ()
    alloc = ob.allocatable(node)
    try:
        count = int(parse_quantity(alloc.get(GPU_RESOURCE, "0")))
    except (ValueError, TypeError):
        count = 0
    if count <= 0 and not dra_gpus:
        return None
    name = ob.name(node)
    labels = ob.labels(node)
    annotations = ob.annotations_of(node)
    mem_mib = _int(labels.get(GPU_MEMORY_LABEL), 0)
    product = labels.get(GPU_PRODUCT_LABEL, "")
    model = normalize_model(product.replace("NVIDIA-", "NVIDIA ", 1), mem_mib * MIB) if product else "unknown"
    gpus = dra_gpus or _annotated_gpus(name, annotations.get(GPUS_ANNOTATION), model, mem_mib) or tuple(
        GpuInfo(f"{name}/gpu{i}", i, model, mem_mib * MIB) for i in range(count))
    if dra_gpus:  # (the policy's view only: a claimed pod is placed on such nodes)
        labels = {**labels, DRA_NODE_LABEL: dra.kind if dra is not None else ""}
    pool_value = labels.get(POOL_LABEL, "both")
    pools = POOLS.get(pool_value)
    problem = ""
    if pools is None:
        pools = POOLS["both"]
        problem = f"label {POOL_LABEL}={pool_value!r} is not build, train or both"
    group = labels.get(RACK_LABEL) or labels.get(ZONE_LABEL) or ""
    return PoolNode(name, gpus, pools, _milli(alloc.get("cpu")), _mib(alloc.get("memory")),
                    problem or _not_schedulable(node), group, tuple(sorted((str(k), str(v)) for k, v in labels.items())),
                    placement_taints(node), _ready(node) != "True")


def placement_taints(node: Obj) -> tuple[Taint, ...]:
    """The taints a job must tolerate to land on the node: all but the node controller's (those take the
    node out of the pool) and ``nvidia.com/gpu`` (which every pod gpupool places tolerates)."""
    out = []
    for t in ob.taints(node):
        key, effect = str(t.get("key") or ""), str(t.get("effect") or "")
        if key.startswith(_CONTROLLER_TAINT) or key == GPU_RESOURCE or effect not in EFFECTS:
            continue
        out.append(Taint(key, str(t.get("value") or ""), effect))
    return tuple(sorted(out, key=lambda t: (t.key, t.effect, t.value)))


def _not_schedulable(node: Obj) -> str:
    """Why the node may not take work now ("" when it may)."""
    if ob.unschedulable(node):
        return "cordoned"
    ready = _ready(node)
    if ready == "Unknown":  # the node-lifecycle controller's verdict on a node whose heartbeat stopped
        return "unreachable (its kubelet stopped posting status)"
    if ready != "True":
        return "not ready"
    for t in ob.taints(node):
        key, effect = str(t.get("key") or ""), t.get("effect")
        if key.startswith(_CONTROLLER_TAINT) and effect in ("NoSchedule", "NoExecute"):
            return f"tainted {key}:{effect}"
    return ""


def _ready(node: Obj) -> str:
    """Its Ready condition's status ("True", "False", "Unknown"; "" before its kubelet has posted one)."""
    ready = next((c for c in ob.conditions(node) if c.get("type") == "Ready"), None)
    return str(ready.get("status") or "") if ready is not None else ""


def _annotated_gpus(node: str, text: str | None, model: str, mem_mib: int) -> tuple[GpuInfo, ...]:
    """The node agent's exact GPUs: ``[{"id", "index", "model"?, "memory"? (bytes), "topology_group"?}]``.

    A malformed annotation is logged and ignored (the node falls back to
    ``<node>/gpu<i>``): one bad agent must not take a node out of the pool.
    """
    if not text:
        return ()
    try:
        items = json.loads(text)
        gpus = tuple(
            GpuInfo(str(g["id"]), int(g["index"]), str(g.get("model") or model),
                    int(g.get("memory") or mem_mib * MIB), str(g.get("topology_group") or ""))
            for g in items)
    except (ValueError, TypeError, KeyError) as e:
        log.warning("node %s: ignoring annotation %s (%s)", node, GPUS_ANNOTATION, e)
        return ()
    if len({g.id for g in gpus}) != len(gpus):
        log.warning("node %s: ignoring annotation %s (duplicate GPU ids)", node, GPUS_ANNOTATION)
        return ()
    return tuple(sorted(gpus, key=lambda g: g.index))


def _int(text: str | None, default: int) -> int:
    try:
        return int(str(text))
    except ValueError:
        return default


def _milli(q: Any) -> int:
    try:
        return int(parse_quantity(q) * 1000) if q is not None else 0
    except (ValueError, TypeError):
        return 0


def _mib(q: Any) -> int:
    try:
        return int(parse_quantity(q)) // MIB if q is not None else 0
    except (ValueError, TypeError):
        return 0
