"""Simulated GPUs from a spec string such as ``"4xA100-80GB"`` or ``"2xA100-80GB,2xT4"``.

Used on machines without NVML or GPUs (laptops, CI, Binder) so the whole
product works end to end; everything built on it is marked simulated
(``core.simulated``, ``Pool.simulated``, ``GPUPOOL_SIMULATED=1``).
GPU ids are stable for a given node name and spec, so a restart with the same
configuration finds the same GPUs that stored assignments refer to.

A spec may also describe a pool of several nodes, so that multi-node gangs
(issue 12) can be tried without a cluster:
``"node-a@rack1=8xA100-80GB;node-b@rack1=8xA100-80GB;node-c=4xT4"``: nodes
separated by ``;``, each ``NAME[@GROUP]=SPEC`` (GROUP is the node's rack or
switch, the policy's ``Node.group``). A spec without ``=`` is one node named
by the service's ``node_name``, as before.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from gpupool.inventory import GpuInfo, GpuSample
from gpupool.wire.errors import InvalidRequest

GIB = 1024**3

MODEL_MEMORY_GIB: dict[str, int] = {
    "H200-141GB": 141,
    "H100-80GB": 80,
    "H100-94GB": 94,
    "A100-80GB": 80,
    "A100-40GB": 40,
    "A800-80GB": 80,
    "L40S": 48,
    "L40": 48,
    "A6000": 48,
    "A40": 48,
    "L4": 24,
    "A10": 24,
    "A10G": 24,
    "RTX4090": 24,
    "RTX3090": 24,
    "V100-32GB": 32,
    "V100-16GB": 16,
    "T4": 16,
    "P100": 16,
    "K80": 12,
}
"""Nominal memory of the models a spec may name (GiB)."""

ALIASES: dict[str, str] = {
    "H200": "H200-141GB",
    "H100": "H100-80GB",
    "A100": "A100-80GB",
    "V100": "V100-32GB",
    "V100M32": "V100-32GB",
    "V100M16": "V100-16GB",
}

_NAMESPACE = uuid.UUID("6b1c3a52-2f0e-4a55-9d7e-0f5c1f2a9e10")
_ITEM = re.compile(r"^\s*(?:(\d+)\s*[xX*]\s*)?([A-Za-z0-9][A-Za-z0-9_.-]*)\s*$")
# A node or group name: what a Kubernetes node name may be, kept short (it shows in tables and reasons).
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
MAX_SIM_NODES = 1024


def canonical_model(name: str) -> str:
    """The table's spelling of a model name (case-insensitive, aliases allowed); ``InvalidRequest`` if unknown."""
    key = name.strip().upper()
    for model in MODEL_MEMORY_GIB:
        if model.upper() == key:
            return model
    for alias, model in ALIASES.items():
        if alias == key:
            return model
    known = ", ".join(sorted(MODEL_MEMORY_GIB))
    raise InvalidRequest(f"unknown GPU model {name!r} in simulation spec; known models: {known}")


def parse_spec(spec: str) -> list[tuple[int, str]]:
    """``"2xA100-80GB,2xT4"`` -> ``[(2, "A100-80GB"), (2, "T4")]``; a clear error for anything else.

    For a spec of several nodes: every node's items, in node order (callers
    that only count the GPUs, such as the Jupyter extension, need no more).
    """
    if isinstance(spec, str) and "=" in spec:
        return [item for node in parse_nodes(spec) for item in node.items]
    return _parse_items(spec)


def _parse_items(spec: str) -> list[tuple[int, str]]:
    """One node's ``COUNTxMODEL,...`` list."""
    if not isinstance(spec, str) or not spec.strip():
        raise InvalidRequest("simulation spec must be a non-empty string like '4xA100-80GB'")
    out: list[tuple[int, str]] = []
    for part in spec.split(","):
        m = _ITEM.match(part)
        if not m:
            raise InvalidRequest(f"bad simulation spec item {part.strip()!r}: expected COUNTxMODEL, e.g. '4xA100-80GB'")
        count = int(m.group(1)) if m.group(1) else 1
        if count < 1 or count > 1024:
            raise InvalidRequest(f"bad GPU count {count} in simulation spec item {part.strip()!r} (1..1024)")
        out.append((count, canonical_model(m.group(2))))
    return out


@dataclass(frozen=True)
class SimNode:
    """One node of a simulation spec: its name, its group ("" = none given) and its GPUs."""

    name: str
    group: str
    items: tuple[tuple[int, str], ...]


def is_multi_node(spec: str | None) -> bool:
    """Whether ``spec`` names its nodes (``NAME=SPEC;...``), rather than describing one unnamed node."""
    return isinstance(spec, str) and "=" in spec


def parse_nodes(spec: str, default_node: str = "local") -> list[SimNode]:
    """The nodes of a spec: ``NAME[@GROUP]=SPEC`` separated by ``;``, or one node ``default_node``.

    Every mistake is an ``InvalidRequest`` naming the part at fault (an empty
    node, a bad or duplicate name, a bad GPU list), so ``gpupool serve
    --simulate`` stops with a message rather than a pool that is not what
    was meant.
    """
    if not is_multi_node(spec):
        return [SimNode(default_node, "", tuple(_parse_items(spec)))]
    nodes: list[SimNode] = []
    seen: set[str] = set()
    parts = spec.split(";")
    if len(parts) > MAX_SIM_NODES:
        raise InvalidRequest(f"simulation spec has {len(parts)} nodes; at most {MAX_SIM_NODES}")
    for part in parts:
        text = part.strip()
        if not text:
            raise InvalidRequest(f"empty node in simulation spec {spec!r}: nodes are NAME[@GROUP]=SPEC "
                                 "separated by ';', e.g. 'node-a@rack1=8xA100-80GB;node-b=4xT4'")
        head, eq, gpus = text.partition("=")
        if not eq:
            raise InvalidRequest(f"bad node {text!r} in simulation spec: every node of a pool of several is "
                                 "NAME[@GROUP]=SPEC, e.g. 'node-b=4xT4'")
        name, at, group = (x.strip() for x in head.partition("@"))
        if not _NAME.fullmatch(name):
            raise InvalidRequest(f"bad node name {name!r} in simulation spec: 1-63 letters, digits, '.', '_' "
                                 "or '-', starting with a letter or digit")
        if at and not _NAME.fullmatch(group):
            raise InvalidRequest(f"bad group {group!r} for node {name} in simulation spec: 1-63 letters, digits, "
                                 "'.', '_' or '-', starting with a letter or digit")
        if name in seen:
            raise InvalidRequest(f"node {name} appears twice in simulation spec; node names must be unique")
        seen.add(name)
        if "=" in gpus or "@" in gpus:
            raise InvalidRequest(f"bad node {text!r} in simulation spec: separate nodes with ';'")
        nodes.append(SimNode(name, group, tuple(_parse_items(gpus))))
    return nodes


def _node_gpus(node: SimNode, id_node: str) -> list[GpuInfo]:
    """A node's GPUs, indexes from 0; ids derived from ``id_node``, the index and the model (stable)."""
    gpus: list[GpuInfo] = []
    index = 0
    for group, (count, model) in enumerate(node.items):
        for k in range(count):
            gid = "GPU-" + str(uuid.uuid5(_NAMESPACE, f"{id_node}/{index}/{model}"))
            # The GPUs of one spec item form simulated NVLink islands of up to 8.
            topo = f"sim-nvlink{group}.{k // 8}"
            gpus.append(GpuInfo(gid, index, model, MODEL_MEMORY_GIB[model] * GIB, topo, node.name))
            index += 1
    return gpus


class SimulatedInventory:
    """GPUs that exist only in configuration; nothing is measured.

    ``nodes``: the spec's nodes (one, named ``node``, for a spec without
    names), each with its group; ``gpus()`` lists every node's GPUs.
    """

    simulated = True

    def __init__(self, spec: str, node: str = "local") -> None:
        self.spec = spec
        self.multi_node = is_multi_node(spec)
        self.nodes: list[tuple[SimNode, list[GpuInfo]]] = [
            # one unnamed node keeps the ids it always had (derived from the service's node name)
            (n, _node_gpus(n, n.name)) for n in parse_nodes(spec, default_node=node)
        ]
        self._gpus = [g for _, gpus in self.nodes for g in gpus]

    def gpus(self) -> list[GpuInfo]:
        return list(self._gpus)

    def sample(self) -> dict[str, GpuSample]:
        return {}

    def close(self) -> None:
        return None
