"""Reading openb-format node/pod lists and replaying them by the FGD paper's protocol.

The protocol (see ``../shared/README.md``): inflate or trim the pod list to
1.3x the cluster's GPU capacity, shuffle it with the seed, place pods one at a
time (a pod that fits nowhere is dropped), and report the mean GPU allocation
ratio over the prefixes whose arrived demand rounds to 100%.

Placement goes through :class:`gpupool.policy.placement.FreeState`, the very
code the engine uses, so a number here is a claim about the product.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from gpupool.policy.model import Gpu, Node, Request
from gpupool.policy.placement import FreeState

INFLATE_TO = 1.3  # the trace is replayed to 130% of the cluster's GPU capacity
WINDOW = (99.5, 100.5)  # arrived demand (%) that "rounds to 100"

# GPU memory per model; openb pods ask for shares, not memory, so these only fill the field.
MODEL_MEMORY_MIB = {"T4": 15_360, "P100": 16_384, "V100M16": 16_384, "V100M32": 32_768, "A10": 24_576}


@dataclass(frozen=True)
class Pod:
    """One pod of the list: its request and the milli-GPU it counts for."""

    name: str
    request: Request
    gpu_milli: int  # num_gpu * gpu_milli: what it adds to demand and, once placed, to allocation


def _int(row: dict[str, str], key: str, path: Path) -> int:
    try:
        return int(float(row[key]))
    except (KeyError, ValueError):
        raise ValueError(f"{path}: row {row.get('name') or row.get('sn')!r} has no numeric {key!r}") from None


def load_nodes(path: Path) -> list[Node]:
    """Nodes from an openb node list (``sn, cpu_milli, memory_mib, gpu, model``)."""
    nodes = []
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            name, model = row["sn"], row.get("model", "") or ""
            count = _int(row, "gpu", path)
            gpus = tuple(
                Gpu(id=f"{name}/{k}", index=k, model=model, memory_mib=MODEL_MEMORY_MIB.get(model, 16_384))
                for k in range(count)
            )
            nodes.append(Node(name=name, cpu_milli=_int(row, "cpu_milli", path),
                              memory_mib=_int(row, "memory_mib", path), gpus=gpus))
    if not nodes:
        raise ValueError(f"{path}: no nodes")
    return nodes


def pod_request(num_gpu: int, gpu_milli: int, cpu_milli: int, memory_mib: int, spec: str) -> Request:
    """The engine request for an openb pod: a fraction only for a single GPU below 1000."""
    models = frozenset(m for m in spec.split("|") if m) if spec else frozenset()
    if num_gpu <= 0 or gpu_milli <= 0:
        return Request(cpu_milli=cpu_milli, memory_mib=memory_mib)
    if num_gpu == 1 and gpu_milli < 1000:
        return Request(gpu_milli=gpu_milli, gpu_models=models, cpu_milli=cpu_milli, memory_mib=memory_mib)
    return Request(gpus=num_gpu, gpu_models=models, cpu_milli=cpu_milli, memory_mib=memory_mib)


def load_pods(path: Path) -> list[Pod]:
    """Pods from an openb pod list (``name, cpu_milli, memory_mib, num_gpu, gpu_milli[, gpu_spec]``)."""
    pods = []
    with open(path, newline="") as fh:
        for row in csv.DictReader(fh):
            num_gpu, milli = _int(row, "num_gpu", path), _int(row, "gpu_milli", path)
            req = pod_request(num_gpu, milli, _int(row, "cpu_milli", path), _int(row, "memory_mib", path),
                              (row.get("gpu_spec") or "").strip())
            pods.append(Pod(row["name"], req, max(num_gpu, 0) * max(milli, 0)))
    if not pods:
        raise ValueError(f"{path}: no pods")
    return pods


def capacity_milli(nodes: list[Node]) -> int:
    return sum(g.capacity_milli for nd in nodes for g in nd.gpus)


def replay_order(pods: list[Pod], capacity: int, rng: np.random.Generator) -> list[Pod]:
    """Step 1 and 2 of the protocol: trim or inflate to 1.3x capacity, then shuffle."""
    limit = INFLATE_TO * capacity
    if not any(p.gpu_milli for p in pods):
        raise ValueError("the pod list has no GPU pods; GPU allocation cannot be measured")
    chosen = list(pods)
    total = sum(p.gpu_milli for p in chosen)
    if total > limit:
        removed = set()
        for k in rng.permutation(len(chosen)):
            if total <= limit:
                break
            removed.add(int(k))
            total -= chosen[int(k)].gpu_milli
        chosen = [p for k, p in enumerate(chosen) if k not in removed]
    else:
        while True:
            p = pods[int(rng.integers(len(pods)))]
            if total + p.gpu_milli > limit:
                break
            chosen.append(p)
            total += p.gpu_milli
    return [chosen[int(k)] for k in rng.permutation(len(chosen))]


def window_mean(arrived: np.ndarray, allocated: np.ndarray, capacity: int) -> float:
    """Mean allocation ratio (%) over prefixes whose arrived demand (%) is in [99.5, 100.5).

    On a cluster so small that one pod jumps over the whole window, the ratio after
    the last pod that kept arrived demand below 100.5% stands in for it.
    """
    arr = 100.0 * arrived / capacity
    sel = (arr >= WINDOW[0]) & (arr < WINDOW[1])
    if not sel.any():
        below = np.flatnonzero(arr < WINDOW[1])
        if below.size == 0 or arr[-1] < WINDOW[0]:
            raise ValueError("the replay never reached 99.5% arrived demand")
        sel = below[-1:]
    return float((100.0 * allocated[sel] / capacity).mean())


@dataclass(frozen=True)
class SeedResult:
    ratio: float  # mean allocation ratio (%) at 100% arrived
    placed: int
    dropped: int
    pods: int


def replay(
    nodes: list[Node], order: list[Pod], policy: str, tie_rank: np.ndarray | None = None,
    workload: list[Request] | None = None,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Step 3 and 4: place pods one at a time (drop what fits nowhere).

    Returns (arrived milli after each pod, allocated milli after each pod, pods placed).
    """
    # expect: which request types may come (not how often): sizes the tables once, changes
    # no choice, as the engine does with its pending queue
    state = FreeState.from_nodes(nodes, (), policy=policy, tie_rank=tie_rank, workload=workload,
                                 expect=[pod.request for pod in order])
    arrived = np.empty(len(order), dtype=np.int64)
    allocated = np.empty(len(order), dtype=np.int64)
    a_sum = p_sum = placed = 0
    for k, pod in enumerate(order):
        a_sum += pod.gpu_milli
        where = state.find(pod.request)
        if where is not None:
            state.commit(where, pod.request)
            p_sum += pod.gpu_milli
            placed += 1
        arrived[k] = a_sum
        allocated[k] = p_sum
    return arrived, allocated, placed


def run_seed(nodes: list[Node], pods: list[Pod], policy: str, seed: int) -> SeedResult:
    """Replay one seed with one policy; returns the protocol's figure for it.

    ``fgd`` is given the variant's whole pod mix up front, as in the paper; ``default``
    learns the mix from the pods it has been asked to place so far, as in the product.
    """
    capacity = capacity_milli(nodes)
    rng = np.random.default_rng(seed)
    order = replay_order(pods, capacity, rng)
    tie_rank = np.argsort(rng.permutation(len(nodes)))  # a fixed random node order per seed
    workload = [p.request for p in pods] if policy == "fgd" else None
    arrived, allocated, placed = replay(nodes, order, policy, tie_rank, workload)
    return SeedResult(window_mean(arrived, allocated, capacity), placed, len(order) - placed, len(order))
