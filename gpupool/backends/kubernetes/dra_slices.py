"""GPUs published through ResourceSlices (Dynamic Resource Allocation), per node, kept current by a watch.

NVIDIA's DRA driver publishes each node's GPUs as ``resource.k8s.io/v1``
ResourceSlices of driver ``gpu.nvidia.com``: one pool per node
(``spec.nodeName``), one device per GPU (``gpu-0``...) with attributes
``index``, ``uuid``, ``productName``, ``type`` and capacity ``memory``. Such a
node has no ``nvidia.com/gpu`` in its allocatable, yet its GPUs are real:
this module turns the slices into the node's :class:`GpuInfo` so the node is
in the pool (:func:`gpupool.backends.kubernetes.nodes.read_node` takes them),
and remembers which device each GPU is, so a claim's allocation can name it
(:mod:`gpupool.backends.kubernetes.dra_allocation`).

A pool is read at its newest generation only (a driver republishing its
slices bumps the generation; older slices are leftovers about to go). MIG
devices (``type`` "mig") are left out: gpupool places whole GPUs and shares
them itself.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException
from kubernetes.utils import parse_quantity

from gpupool.backends.kubernetes import objects as ob
from gpupool.backends.kubernetes.health import Health
from gpupool.backends.kubernetes.objects import Obj
from gpupool.backends.kubernetes.watcher import ListWatch
from gpupool.inventory import GpuInfo
from gpupool.inventory.nvml import normalize_model

log = logging.getLogger("gpupool.backends.kubernetes")

DRIVER = "gpu.nvidia.com"
"""The driver (and DeviceClass) whose devices are GPUs to gpupool."""
DRA_NODE_LABEL = "gpupool.io/dra-devices"
"""A label gpupool gives (in the policy's view only; the Node itself is never labelled) to each node whose
GPUs come from ResourceSlices: the kind of its devices, a short hash of what a selector can tell apart
(their count, attributes and capacities, less ``uuid`` and ``index``).

A claimed pod is placed only on nodes of the kinds whose every device its
selectors accept (a node without slices has no device to write into its
claim): one node-affinity expression over this label tells the policy,
whatever the number of nodes, and a node joining later of an accepted kind
is eligible too."""


@dataclass(frozen=True)
class Device:
    """One device of a slice, as a claim's allocation names it and as CEL selectors read it.

    ``attributes`` and ``capacity`` are ``((domain, name, value), ...)``
    sorted (hashable: selector results are memoised per device); capacity in
    base units (bytes for memory).
    """

    node: str
    driver: str
    pool: str
    name: str
    attributes: tuple[tuple[str, str, Any], ...]
    capacity: tuple[tuple[str, str, int], ...]

    def attribute(self, name: str) -> Any:
        """An attribute of the driver's own domain (None when absent)."""
        return next((v for d, n, v in self.attributes if d == self.driver and n == name), None)

    def capacity_of(self, name: str) -> int | None:
        return next((v for d, n, v in self.capacity if d == self.driver and n == name), None)


def _split(key: str, driver: str) -> tuple[str, str]:
    """``gpu.nvidia.com/productName`` -> (domain, name); an unqualified name is the driver's."""
    if "/" in key:
        domain, name = key.rsplit("/", 1)
        return domain, name
    return driver, key


def _attribute_value(v: Obj) -> Any:
    """A DeviceAttribute (one of int, bool, string, version) as a plain value."""
    for k in ("int", "bool", "string", "version"):
        if k in v:
            return v[k]
    return None


def read_devices(slice_: Obj) -> list[Device]:
    """The GPU devices of one ResourceSlice (MIG and other types left out)."""
    spec = ob.spec(slice_)
    driver = str(spec.get("driver") or "")
    node = str(spec.get("nodeName") or "")
    pool = str((spec.get("pool") or {}).get("name") or "")
    out = []
    for d in spec.get("devices") or []:
        attrs = []
        for key, v in (d.get("attributes") or {}).items():
            domain, name = _split(str(key), driver)
            attrs.append((domain, name, _attribute_value(v or {})))
        caps = []
        for key, v in (d.get("capacity") or {}).items():
            domain, name = _split(str(key), driver)
            try:
                caps.append((domain, name, int(parse_quantity((v or {}).get("value", "0")))))
            except (ValueError, TypeError):
                continue
        dev = Device(node, driver, pool, str(d.get("name") or ""), tuple(sorted(attrs, key=lambda a: a[:2])),
                     tuple(sorted(caps)))
        kind = dev.attribute("type")
        if dev.name and (kind is None or kind == "gpu"):
            out.append(dev)
    return out


@dataclass(frozen=True)
class DraNode:
    """A node's GPUs as its slices publish them, and the kind of its devices (:data:`DRA_NODE_LABEL`)."""

    gpus: tuple[GpuInfo, ...]
    kind: str


_PER_DEVICE = ("uuid", "index")


def device_sort(d: Device) -> tuple[Any, ...]:
    """A device less what only it has (``uuid``, ``index``): equal for devices a selector cannot tell apart
    unless it names those."""
    return d.driver, tuple(a for a in d.attributes if a[1] not in _PER_DEVICE), d.capacity


def dra_served(api: client.ApiClient) -> bool:
    """Whether the API server serves ``resource.k8s.io/v1`` (GA in 1.34). An older one answers 404: gpupool then
    watches nothing of DRA rather than report a failing watch for ever. Any other failure (not reachable yet)
    counts as served: the watches retry as every watch does."""
    try:
        client.ResourceV1Api(api).get_api_resources()
    except ApiException as e:
        if e.status == 404:
            log.info("the API server does not serve resource.k8s.io/v1: GPUs claimed through DRA are off")
            return False
    except Exception:
        pass
    return True


def kind_of(devices: tuple[Device, ...]) -> str:
    """What tells a node's devices apart from another node's, as 12 hex digits (a label value)."""
    text = repr(sorted((device_sort(d) for d in devices), key=repr))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


@lru_cache(maxsize=256)
def _model(product: str, memory: int) -> str:
    """(every device of a model has the same name: normalised once, not once per device of a thousand nodes)"""
    return normalize_model(product, memory)


def gpu_of(dev: Device, position: int) -> GpuInfo:
    """The pool's GPU for a device: its UUID as id (what node agents report), its model from productName."""
    memory = dev.capacity_of("memory") or 0
    product = dev.attribute("productName")
    model = _model(str(product), memory) if product else "unknown"
    index = dev.attribute("index")
    uuid = dev.attribute("uuid")
    gpu_id = str(uuid) if uuid else f"{dev.node}/{dev.name}"
    return GpuInfo(gpu_id, int(index) if isinstance(index, int) else position, model, memory)


def newest(slices: Mapping[str, Obj]) -> dict[str, tuple[Device, ...]]:
    """Node -> its GPU devices, from the slices of each pool's newest generation (nodes' pools only)."""
    gen: dict[tuple[str, str], int] = {}
    for s in slices.values():
        spec = ob.spec(s)
        key = (str(spec.get("driver") or ""), str((spec.get("pool") or {}).get("name") or ""))
        gen[key] = max(gen.get(key, 0), int((spec.get("pool") or {}).get("generation") or 0))
    out: dict[str, list[Device]] = {}
    for s in slices.values():
        spec = ob.spec(s)
        pool = spec.get("pool") or {}
        key = (str(spec.get("driver") or ""), str(pool.get("name") or ""))
        if not spec.get("nodeName") or int(pool.get("generation") or 0) != gen[key]:
            continue
        out.setdefault(str(spec["nodeName"]), []).extend(read_devices(s))
    return {n: tuple(sorted(ds, key=lambda d: (_index(d), d.name))) for n, ds in out.items()}


def _index(d: Device) -> int:
    i = d.attribute("index")
    return i if isinstance(i, int) else 1 << 30


class DraSlices:
    """The GPU driver's ResourceSlices, by node: their GPUs for the pool, their devices for claims.

    ``on_change(nodes)`` is called (on the watch thread, outside this lock)
    with the names of the nodes whose devices changed.
    """

    def __init__(self, api: client.ApiClient, health: Health, on_change: Callable[[set[str]], None]) -> None:
        self.api = api
        self.served = True
        """Whether the API server serves resource.k8s.io/v1 (found out by :meth:`start`)."""
        self._lock = threading.Lock()
        self._slices: dict[str, dict[str, Obj]] = {}  # node -> its slices by name (each event reads one node again)
        self._node_of: dict[str, str] = {}  # slice name -> its node
        self._devices: dict[str, tuple[Device, ...]] = {}  # node -> devices
        self._nodes: dict[str, DraNode] = {}  # node -> its GPUs and kind
        self._by_gpu: dict[str, Device] = {}  # GPU id -> device
        self._gpu_of_device: dict[tuple[str, str, str], str] = {}  # (driver, pool, device) -> GPU id
        self._on_change = on_change
        self.generation = 0
        """Moves when some node's devices change (pods waiting on their claims are read again)."""
        self.watch = ListWatch("resourceslices", client.ResourceV1Api(api).list_resource_slice,
                               self._on_reset, self._on_event, health, field_selector=f"spec.driver={DRIVER}")

    def start(self) -> None:
        self.served = dra_served(self.api)
        if self.served:
            self.watch.start()
        else:
            self.watch.synced.set()  # nothing to wait for: no node's GPUs come from slices

    def close(self) -> None:
        if self.served:
            self.watch.stop(wait_s=0.5)

    def _on_reset(self, items: list[Obj]) -> None:
        with self._lock:
            before = set(self._slices)
            self._slices, self._node_of = {}, {}
            for s in items:
                self._put(s)
            changed = self._recompute(before | set(self._slices))
            if not self.generation:
                self.generation = 1
        self._on_change(changed)

    def _on_event(self, kind: str, slice_: Obj) -> None:
        name = ob.name(slice_)
        with self._lock:
            nodes = {n for n in (self._node_of.get(name), self._take(name)) if n}
            if kind != "DELETED":
                nodes.add(self._put(slice_))
            changed = self._recompute(nodes - {""})
        if changed:
            self._on_change(changed)

    def _put(self, slice_: Obj) -> str:
        node = str(ob.spec(slice_).get("nodeName") or "")
        self._slices.setdefault(node, {})[ob.name(slice_)] = slice_
        self._node_of[ob.name(slice_)] = node
        return node

    def _take(self, name: str) -> str | None:
        node = self._node_of.pop(name, None)
        if node is not None:
            self._slices.get(node, {}).pop(name, None)
            if not self._slices.get(node, True):
                del self._slices[node]
        return node

    def _recompute(self, nodes: set[str]) -> set[str]:
        """Read these nodes' devices again from their slices; the nodes whose devices changed."""
        changed = set()
        for n in nodes:
            devices = newest(self._slices.get(n, {})).get(n, ())
            if devices == self._devices.get(n, ()):
                continue
            changed.add(n)
            old = self._nodes.pop(n, None)
            for g in old.gpus if old is not None else ():
                d = self._by_gpu.pop(g.id, None)
                if d is not None:
                    self._gpu_of_device.pop((d.driver, d.pool, d.name), None)
            if not devices:
                self._devices.pop(n, None)
                continue
            self._devices[n] = devices
            self._nodes[n] = DraNode(tuple(gpu_of(d, i) for i, d in enumerate(devices)), kind_of(devices))
            for g, d in zip(self._nodes[n].gpus, devices, strict=True):
                self._by_gpu[g.id] = d
                self._gpu_of_device[(d.driver, d.pool, d.name)] = g.id
        if changed:
            self.generation += 1
        return changed

    # ------------------------------------------------------------ reads (any thread)
    def node(self, name: str) -> DraNode | None:
        """The node's GPUs as its slices publish them (None when it has none)."""
        with self._lock:
            return self._nodes.get(name)

    def devices(self) -> dict[str, tuple[Device, ...]]:
        """Node -> its GPU devices (a copy of the map; the tuples are immutable)."""
        with self._lock:
            return dict(self._devices)

    def devices_of(self, node: str) -> tuple[Device, ...]:
        with self._lock:
            return self._devices.get(node, ())

    def any(self) -> bool:
        """Whether some node's GPUs come from slices."""
        return bool(self._devices)

    def gpu_id(self, driver: str, pool: str, device: str) -> str | None:
        """The pool's GPU id of a device an allocation names (None when no slice publishes it)."""
        with self._lock:
            return self._gpu_of_device.get((driver, pool, device))

    def device_of(self, gpu_id: str) -> Device | None:
        with self._lock:
            return self._by_gpu.get(gpu_id)
