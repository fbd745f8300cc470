"""The hardware layout of a node list: GPU slots, capacities, models, topology.

Placement keeps free capacity in arrays indexed ``[node, slot]``; this module
fixes that indexing once per node list (a slot is a GPU's position on its
node, by index then id) so that the placement states of every pool and the
count of what running work holds (:mod:`gpupool.policy.held`) agree on it.
"""

from __future__ import annotations

from operator import attrgetter

import numpy as np

from gpupool.policy.model import Node
from gpupool.policy.nodecache import for_nodes
from gpupool.wire.errors import InvalidRequest


class Layout:
    """What a pool's hardware fixes: names, GPU slots, capacities, models, topology.

    Built from the node list alone and never written to after (the arrays are
    read-only), so states over the same node objects share one
    (:mod:`gpupool.policy.nodecache`): building this for thousands of GPUs
    cost a tenth of a steady cycle.
    """

    def __init__(self, nodes: tuple[Node, ...]) -> None:
        n = len(nodes)
        g = max([len(nd.gpus) for nd in nodes] + [1])
        self.names = [nd.name for nd in nodes]
        self.node_index = {name: i for i, name in enumerate(self.names)}
        if len(self.node_index) != n:
            raise InvalidRequest("node names in a pool must be unique")
        self.cpu_total = np.array([nd.cpu_milli for nd in nodes], dtype=np.int64).reshape(n)
        self.mem_total = np.array([nd.memory_mib for nd in nodes], dtype=np.int64).reshape(n)
        self.models: dict[str, int] = {}
        self.gpu_ids: list[list[str]] = []
        self.gpu_slot: dict[str, tuple[int, int]] = {}
        self.gpu_caps: list[tuple[int, ...]] = []  # per node, its GPUs' capacities in slot order
        # rows as Python lists, turned into arrays once; padding slots: see FreeState's doc
        cap_rows, mem_rows, model_rows, topo_rows, known_rows = [], [], [], [], []
        models, gpu_slot = self.models, self.gpu_slot
        for i, nd in enumerate(nodes):
            groups: dict[str, int] = {}
            gpus = sorted(nd.gpus, key=_gpu_order)
            pad = g - len(gpus)
            cap_rows.append([gpu.capacity_milli for gpu in gpus] + [0] * pad)
            mem_rows.append([max(gpu.memory_mib, 1) for gpu in gpus] + [1] * pad)
            known_rows.append([gpu.memory_mib > 0 for gpu in gpus] + [False] * pad)
            model_rows.append([models.setdefault(gpu.model, len(models)) for gpu in gpus] + [-1] * pad)
            topo_rows.append([groups.setdefault(gpu.topology_group, len(groups)) for gpu in gpus] + [-1] * pad)
            self.gpu_caps.append(tuple(gpu.capacity_milli for gpu in gpus))
            ids = [gpu.id for gpu in gpus]
            for j, gid in enumerate(ids):
                if gid in gpu_slot:
                    raise InvalidRequest(f"GPU id {gid!r} appears twice in the pool")
                gpu_slot[gid] = (i, j)
            self.gpu_ids.append(ids)
        self.cap = np.array(cap_rows, dtype=np.int64).reshape(n, g)
        self.gpu_mem = np.array(mem_rows, dtype=np.int64).reshape(n, g)
        # GPUs that report a memory size (a memory request never fits one that reports none)
        self.has_memory = np.array(known_rows, dtype=bool).reshape(n, g)
        self.model_id = np.array(model_rows, dtype=np.int64).reshape(n, g)
        self.topo_id = np.array(topo_rows, dtype=np.int64).reshape(n, g)
        widths = np.array([len(nd.gpus) for nd in nodes], dtype=np.int64).reshape(n, 1)
        self.valid = np.arange(g)[None, :] < widths
        # slots that can be handed out as a whole GPU: a GPU of capacity 0 (its share withheld from the
        # pool) is never free for whole-GPU work, though it equals its capacity when nothing runs on it
        self.whole_slot = self.valid & (self.cap > 0)
        # every node's GPUs share one capacity and memory size (what the scorers' memo relies on)
        self.gpus_alike = all(len(set(caps)) <= 1 for caps in self.gpu_caps) and all(
            len(set(row[: int(w)])) <= 1 for row, w in zip(mem_rows, widths[:, 0], strict=True))
        classes: dict[tuple, int] = {}
        self.node_class = np.array([
            classes.setdefault(tuple(zip(*rows, strict=True)), len(classes))
            for rows in zip(cap_rows, mem_rows, model_rows, topo_rows, strict=True)
        ], dtype=np.int64)
        for arr in (self.cpu_total, self.mem_total, self.cap, self.gpu_mem, self.has_memory, self.model_id,
                    self.topo_id, self.valid, self.whole_slot, self.node_class):
            arr.flags.writeable = False
        # request -> whether it fits this hardware when empty (FreeState.fits_empty): the one mutable part,
        # a cache of a fact of the hardware
        self.fits_empty: dict[object, bool] = {}


_gpu_order = attrgetter("index", "id")


def layout_of(nodes: tuple[Node, ...]) -> Layout:
    """The layout of these node objects, built or reused (:mod:`gpupool.policy.nodecache`)."""
    return for_nodes("placement layout", nodes, Layout)
