"""Pods created with kubectl vs jobs submitted to gpupool, on one real API server (issue 14, part 4).

Starts its own kube-apiserver + etcd (scripts/kube, as tests/kube/conftest.py
does), N Node objects with 8 GPUs each, and O pods of another scheduler
holding 2 GPUs each (they must be kept off). One scheduler core runs in this
process with the Kubernetes backend (as the tests run it). Two arms, in turn:

- **kubectl**: P pods with ``schedulerName: gpupool``, label
  ``gpupool.io/project``, annotation ``gpupool.io/gpu-fraction`` and the envFrom
  of their ConfigMap, created by 4 client threads (as many users' kubectl);
  gpupool queues a job per pod, writes its ConfigMap, binds it and records
  two events on it.
- **submit**: P jobs of the same size submitted to the core (gpupool makes
  and binds their pods).

A pod counts as bound when this benchmark's own watch first shows its
``spec.nodeName``. Reported: binds/s (P / first create-or-submit -> last bound),
create->bound p50/p99, the cycle time (the core's histogram), and this
process's peak RSS (the core and its threads, the benchmark's watch and
clients included).

    .venv/bin/python bench/kube_kubectl_pods.py [--nodes 60] [--pods 400] [--others 100]
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kubernetes import client, config, watch  # noqa: E402

from gpupool.app.backend import build_core  # noqa: E402
from gpupool.service.actor import Actor  # noqa: E402
from gpupool.service.config import ServiceConfig  # noqa: E402
from gpupool.service.core import SchedulerCore  # noqa: E402
from tests.kube.cluster import make_gpu_node  # noqa: E402

KUBE = Path(os.environ.get("GPUPOOL_KUBE_DIR", ROOT / "scripts" / "kube"))
ADMIN = Actor("admin", True)


class BoundWatch:
    """First time each pod of a namespace is seen with a node (a watch thread)."""

    def __init__(self, api: client.CoreV1Api, ns: str) -> None:
        self.bound: dict[str, float] = {}
        self._stop = threading.Event()
        self._w = watch.Watch()
        self._thread = threading.Thread(target=self._run, args=(api, ns), daemon=True)
        self._thread.start()

    def _run(self, api: client.CoreV1Api, ns: str) -> None:
        while not self._stop.is_set():
            try:
                for ev in self._w.stream(api.list_namespaced_pod, ns, timeout_seconds=30):
                    pod = ev["object"]
                    if pod.spec.node_name and pod.metadata.name not in self.bound:
                        self.bound[pod.metadata.name] = time.perf_counter()
            except Exception:
                time.sleep(0.1)

    def stop(self) -> None:
        self._stop.set()
        self._w.stop()


def kubectl_pod(name: str, fraction: float) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": {"gpupool.io/project": "bench"},
                         "annotations": {"gpupool.io/gpu-fraction": str(fraction)}},
            "spec": {"schedulerName": "gpupool", "restartPolicy": "Never", "containers": [
                {"name": "main", "image": "train:1", "command": ["python", "t.py"],
                 "envFrom": [{"configMapRef": {"name": f"gpupool-{name}"}}]}]}}


def cycle_stats(core: SchedulerCore) -> tuple[float, float]:
    """(count, sum) of the core's cycle-time histogram."""
    count = total = 0.0
    for metric in core.registry.collect():
        for s in metric.samples:
            if s.name == "gpupool_cycle_seconds_count":
                count = s.value
            elif s.name == "gpupool_cycle_seconds_sum":
                total = s.value
    return count, total


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


async def arm(name: str, api: client.CoreV1Api, core: SchedulerCore, ns: str, pods: int,
              fraction: float) -> dict[str, Any]:
    watcher = BoundWatch(api, ns)
    await asyncio.sleep(0.5)
    c0 = cycle_stats(core)
    started: dict[str, float] = {}
    t0 = time.perf_counter()
    if name == "kubectl":
        def create(i: int) -> None:
            n = f"k-{i}"
            started[n] = time.perf_counter()
            api.create_namespaced_pod(ns, kubectl_pod(n, fraction))

        loop = asyncio.get_running_loop()
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            await asyncio.gather(*(loop.run_in_executor(pool, create, i) for i in range(pods)))
    else:
        for _ in range(pods):
            t = time.perf_counter()
            j, _ = await core.submit(ADMIN, {"project": "bench", "gpu_fraction": fraction, "command": ["t"]})
            started[f"gpupool-{j['id']}-1"] = t
    deadline = time.monotonic() + 600
    while len([n for n in started if n in watcher.bound]) < pods and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    watcher.stop()
    held = {gid for h in core.backend.other_pods.holdings for gid in h.gpu_ids}
    overlaps = sum(1 for j in core.list_jobs(ADMIN, {"state": "running", "limit": 100000})
                   for g in (j["assignment"] or {}).get("gpus", []) if g["id"] in held)
    lat = [watcher.bound[n] - started[n] for n in started if n in watcher.bound]
    last = max((watcher.bound[n] for n in started if n in watcher.bound), default=t0)
    c1 = cycle_stats(core)
    cycles = c1[0] - c0[0]
    return {"arm": name, "bound": len(lat), "pods": pods, "binds_s": len(lat) / max(1e-9, last - t0),
            "p50_ms": 1000 * pct(lat, 0.5), "p99_ms": 1000 * pct(lat, 0.99),
            "cycles": int(cycles), "overlaps": overlaps, "cycle_ms": 1000 * (c1[1] - c0[1]) / cycles if cycles else float("nan")}


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=60)
    ap.add_argument("--pods", type=int, default=400)
    ap.add_argument("--others", type=int, default=100, help="other schedulers' pods, 2 GPUs each")
    ap.add_argument("--fraction", type=float, default=0.5)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpupool-bench-kctl-"))
    r = subprocess.run([str(KUBE / "start"), str(work)], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"could not start the API server ({KUBE}/start):\n{r.stderr[-2000:]}")
    kubeconfig = work / "kubeconfig"
    api = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
    cores: list[SchedulerCore] = []
    try:
        nodes = [f"n{i:04d}" for i in range(args.nodes)]
        for n in nodes:
            make_gpu_node(api, n, 8)
        api.create_namespace({"metadata": {"name": "others"}})
        for i in range(args.others):
            api.create_namespaced_pod("others", {"metadata": {"name": f"o-{i}"}, "spec": {
                "nodeName": nodes[i % len(nodes)], "containers": [
                    {"name": "c", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "2"}}}]}})
        rows = []
        for which in ("kubectl", "submit"):
            ns = f"b-{which}-{uuid.uuid4().hex[:6]}"
            api.create_namespace({"metadata": {"name": ns}})
            cfg = ServiceConfig(state_dir=work / f"state-{which}", backend="kubernetes", kubeconfig=str(kubeconfig),
                                namespace=ns, image="train:1", admin_token="bench", run_jobs_as="service",
                                on_shutdown="leave", cycle_min_interval_s=0.0, min_runtime_s=0.0)
            core = build_core(cfg)
            cores.append(core)
            await core.start()
            while len(core.pool()["nodes"]) < args.nodes:
                await asyncio.sleep(0.1)
            core.set_project(ADMIN, "bench", {"train_guarantee": 1})

            def others_held(core: SchedulerCore = core) -> int:
                return sum(1 for n in core.pool()["nodes"] for g in n["gpus"] for a in g["allocations"]
                           if a["kind"] == "other")

            until = time.monotonic() + 30
            while others_held() < min(2 * args.others, 8 * args.nodes) and time.monotonic() < until:
                await asyncio.sleep(0.1)
            others = others_held()
            row = await arm(which, api, core, ns, args.pods, args.fraction)
            row["other_gpus"] = others
            rows.append(row)
            await core.stop()
            cores.remove(core)
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
        print(f"# {platform.node()}: {os.cpu_count()} CPUs, Python {platform.python_version()}, "
              f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
        print(f"# {args.nodes} nodes x 8 GPUs, {args.others} other-scheduler pods x 2 GPUs, "
              f"{args.pods} pods of {args.fraction} GPU per arm; peak RSS {rss} MiB")
        print("| arm | bound | binds/s | create->bound p50 | p99 | cycles | mean cycle | GPUs held by others "
              "| jobs on them |")
        print("|---|---|---|---|---|---|---|---|---|")
        for row in rows:
            print(f"| {row['arm']} | {row['bound']}/{row['pods']} | {row['binds_s']:.0f} | {row['p50_ms']:.0f} ms | "
                  f"{row['p99_ms']:.0f} ms | {row['cycles']} | {row['cycle_ms']:.1f} ms | {row['other_gpus']} | "
                  f"{row['overlaps']} |")
    finally:
        for c in cores:
            await c.stop()
        subprocess.run([str(KUBE / "stop"), str(work)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
