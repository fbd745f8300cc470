"""Placement speed: what one scheduling cycle costs the engine, per policy.

    python -m bench.placement_speed [--nodes 1000] [--pending 10000] [--policy default,bestfit]

Builds a synthetic pool (``--nodes`` nodes of 8 GPUs, 96 cores, in two
NVLink groups, three GPU models), then measures for each policy:

* ``build``: :meth:`FreeState.from_nodes` from a snapshot whose running
  workloads fill the pool (the start of every cycle);
* ``fill``: placements per second (find + commit, timed for the requests that
  were placed) while a mixed queue (whole GPUs, gangs, fractions, GPU memory,
  model-bound, CPU-only) fills an empty pool, both per wall-clock second and
  per CPU second of this thread (the second is what the code costs; the first
  also counts time other processes took the CPU away, which on a shared
  machine can be most of it);
* ``full cycle``: ms to answer ``--pending`` requests on the full pool (nothing
  fits; the case of a long queue on a busy cluster).

Prints a table; each figure is the best of ``--repeat`` runs (on a shared
machine the slow runs measure the neighbours, not this code).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

from gpupool.policy.model import Gpu, Kind, Node, Request, Workload
from gpupool.policy.placement import POLICIES, FreeState

MODELS = ("A100-80GB", "A100-40GB", "T4")


def pool(n_nodes: int) -> list[Node]:
    nodes = []
    for i in range(n_nodes):
        model = MODELS[i % len(MODELS)]
        gpus = tuple(Gpu(id=f"n{i}-g{k}", index=k, model=model, memory_mib=81_920 if "80" in model else 40_960,
                         topology_group=f"nv{k // 4}") for k in range(8))
        nodes.append(Node(name=f"n{i:04d}", cpu_milli=96_000, memory_mib=786_432, gpus=gpus))
    return nodes


def queue(n: int, seed: int = 0) -> list[Request]:
    """A mixed queue in the proportions of the openb trace (fractions, whole GPUs, gangs, CPU-only)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        kind = rng.random()
        cpu = int(rng.choice([2000, 4000, 8000, 12000]))
        if kind < 0.40:
            out.append(Request(gpu_milli=int(rng.choice([110, 230, 320, 470, 650, 810])), cpu_milli=cpu))
        elif kind < 0.75:
            out.append(Request(gpus=1, cpu_milli=cpu))
        elif kind < 0.82:
            out.append(Request(gpus=int(rng.choice([2, 4, 8])), cpu_milli=cpu))
        elif kind < 0.87:
            out.append(Request(gpu_memory_mib=int(rng.choice([8_000, 20_000])), cpu_milli=cpu))
        elif kind < 0.92:
            out.append(Request(gpus=1, gpu_models=frozenset({"T4"}), cpu_milli=cpu))
        else:
            out.append(Request(cpu_milli=cpu, memory_mib=16_384))
    return out


def measure(nodes: list[Node], policy: str, pending: int) -> tuple[float, float, float, float, int]:
    """(build ms, fill placements per wall s, per CPU s, full-cycle ms, placed while filling)."""
    reqs = queue(pending * 3)
    state = FreeState.from_nodes(nodes, (), policy=policy)
    running = []
    fill_s = fill_cpu = 0.0  # time in find+commit for the requests that were placed
    clock, cpu_clock = time.perf_counter, time.thread_time
    for k, r in enumerate(reqs):
        t0, c0 = clock(), cpu_clock()
        a = state.find(r)
        if a is not None:
            state.commit(a, r)
            fill_s += clock() - t0
            fill_cpu += cpu_clock() - c0
            running.append(Workload(id=f"w{k}", project="p", kind=Kind.TRAIN, request=r, assignment=a))
    t0 = time.perf_counter()
    full = FreeState.from_nodes(nodes, running, policy=policy)
    build_ms = 1000 * (time.perf_counter() - t0)
    probe = queue(pending, seed=1)
    t0 = time.perf_counter()
    for r in probe:
        full.find(r)
    cycle_ms = 1000 * (time.perf_counter() - t0)
    return build_ms, len(running) / fill_s, len(running) / max(fill_cpu, 1e-9), cycle_ms, len(running)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.placement_speed", description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--pending", type=int, default=10_000)
    ap.add_argument("--policy", default="default,fgd,bestfit")
    ap.add_argument("--repeat", type=int, default=3, help="runs per policy; the best of each figure is shown")
    args = ap.parse_args(argv)
    policies = [p for p in args.policy.split(",") if p]
    if any(p not in POLICIES for p in policies) or args.nodes < 1 or args.pending < 1 or args.repeat < 1:
        print(f"bench.placement_speed: policies are {', '.join(POLICIES)}; counts must be positive", file=sys.stderr)
        return 2
    nodes = pool(args.nodes)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"{args.nodes} nodes, {8 * args.nodes} GPUs; fill = {3 * args.pending} requests into an empty pool; "
          f"full cycle = {args.pending} pending on the full pool; load average {load:.1f} on {os.cpu_count()} CPUs")
    print(f"{'policy':<10} {'build ms':>9} {'placements/wall s':>18} {'placements/CPU s':>17} {'placed':>7} "
          f"{'full cycle ms':>14}")
    for policy in policies:
        runs = [measure(nodes, policy, args.pending) for _ in range(args.repeat)]
        build_ms, cycle_ms = min(r[0] for r in runs), min(r[3] for r in runs)
        rate, cpu_rate, placed = max(r[1] for r in runs), max(r[2] for r in runs), runs[0][4]
        print(f"{policy:<10} {build_ms:9.1f} {rate:18.0f} {cpu_rate:17.0f} {placed:7d} {cycle_ms:14.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
