"""What reading DRA objects costs the scheduler: ResourceSlices into the pool, claims into what a pod asks.

No cluster: the backend's own pure pieces over objects shaped as NVIDIA's DRA
driver publishes them (one slice per node, one device per GPU). Prints one
table: the slice watch's work (a relist of every node, then the same slices
arriving one event each), the kinds of nodes, a claimed pod's first read with
a new selector (CEL evaluations, with cel-python) and the next pods' reads
(memoised until the slices change), and the allocation's results.

    .venv/bin/python -m bench.dra_claims [--nodes 1000] [--gpus 8] [--pods 1000]
"""

from __future__ import annotations

import argparse
import os
import resource
import time
from typing import Any

from kubernetes import client

from gpupool.backends.kubernetes.dra_allocation import results_for
from gpupool.backends.kubernetes.dra_claims import kind_check, read_ask
from gpupool.backends.kubernetes.dra_slices import DraSlices
from gpupool.backends.kubernetes.health import Health

CLASS = {"metadata": {"name": "gpu.nvidia.com"}, "spec": {"selectors": [{"cel": {"expression":
         "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]}}
PRODUCTS = (("NVIDIA H100 80GB HBM3", "80Gi"), ("NVIDIA A100-SXM4-40GB", "40Gi"))


def a_slice(node: str, gpus: int, product: str, memory: str) -> dict[str, Any]:
    devices = [{"name": f"gpu-{i}", "attributes": {
        "type": {"string": "gpu"}, "index": {"int": i}, "uuid": {"string": f"GPU-{node}-{i}"},
        "productName": {"string": product}}, "capacity": {"memory": {"value": memory}}} for i in range(gpus)]
    return {"metadata": {"name": f"{node}-gpu.nvidia.com"},
            "spec": {"driver": "gpu.nvidia.com", "nodeName": node, "pool": {"name": node, "generation": 1},
                     "devices": devices}}


def claimed(selector: str, n: int) -> tuple[dict[str, Any], dict[str, Any]]:
    pod = {"metadata": {"name": f"p{n}", "namespace": "ns", "uid": f"u{n}"},
           "spec": {"resourceClaims": [{"name": "gpu", "resourceClaimName": f"c{n}"}]}}
    claim = {"metadata": {"name": f"c{n}", "namespace": "ns"}, "spec": {"devices": {"requests": [
        {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1,
                                    "selectors": [{"cel": {"expression": selector}}]}}]}}, "status": {}}
    return pod, claim


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--pods", type=int, default=1000)
    args = ap.parse_args()
    slices = [a_slice(f"n{i}", args.gpus, *PRODUCTS[i % 2]) for i in range(args.nodes)]
    rows: list[tuple[str, float, float]] = []

    def timed(what: str, fn: Any) -> Any:
        w, c = time.perf_counter(), cpu()
        out = fn()
        rows.append((what, time.perf_counter() - w, cpu() - c))
        return out

    view = DraSlices(client.ApiClient(), Health(), lambda nodes: None)  # its watch is never started
    timed(f"relist: {args.nodes} slices", lambda: view._on_reset(slices))
    view._on_reset([])
    timed(f"{args.nodes} slices, one event each", lambda: [view._on_event("ADDED", s) for s in slices])
    devices = view.devices()
    check = timed("kinds of nodes", lambda: kind_check(devices))
    selector = 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"'
    pod, claim = claimed(selector, 0)
    ask = timed("first claimed pod (new selector)", lambda: read_ask(pod, {"c0": claim}, {"gpu.nvidia.com": CLASS},
                                                                   check))
    pods = [claimed(selector, n) for n in range(1, args.pods + 1)]
    timed(f"next {args.pods} claimed pods", lambda: [read_ask(p, {c["metadata"]["name"]: c},
                                                              {"gpu.nvidia.com": CLASS}, check) for p, c in pods])
    per_device = 'device.attributes["gpu.nvidia.com"].index < 8'
    pod, claim = claimed(per_device, 0)
    timed("first pod, a selector naming index", lambda: read_ask(pod, {"c0": claim}, {"gpu.nvidia.com": CLASS},
                                                                 check))
    one = [devices["n1"][0]]
    timed(f"{args.pods} allocations' results", lambda: [results_for(ask, one) for _ in range(args.pods)])
    print(f"bench/dra_claims.py: {args.nodes} nodes x {args.gpus} GPUs, {args.pods} pods; "
          f"{os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d %H:%M')}")
    print(f"{'step':<40} {'wall s':>9} {'CPU s':>9} {'per item ms':>12}")
    for what, wall, used in rows:
        n = args.pods if what.startswith(("next", str(args.pods))) else args.nodes if "one event" in what else 1
        print(f"{what:<40} {wall:>9.3f} {used:>9.3f} {1000 * wall / n:>12.3f}")


if __name__ == "__main__":
    main()
