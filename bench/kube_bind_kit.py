"""What bench/kube_bind.py measures with: the test cluster, KWOK GPU nodes, a bind watch, API writes, CPU and RSS.

Kept apart from the benchmark's arms so that each file reads as one job:
this one knows the cluster (scripts/kube) and /proc; kube_bind.py knows the
pods, the two schedulers and the table.
"""

from __future__ import annotations

import collections
import concurrent.futures
import json
import os
import re
import statistics
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import urllib3
from kubernetes import client

ROOT = Path(__file__).resolve().parents[1]
KUBE = Path(os.environ.get("GPUPOOL_KUBE_DIR", ROOT / "scripts" / "kube"))
GPUS_PER_NODE = 8
# apiserver_request_total's verb label -> the verb as RBAC names it (reads left out)
WRITE_VERBS = {"POST": "create", "PUT": "update", "PATCH": "patch", "APPLY": "patch", "DELETE": "delete",
               "DELETECOLLECTION": "deletecollection"}


# ---------------------------------------------------------------- the cluster
def start_cluster(d: Path, *components: str) -> Path:
    """etcd + kube-apiserver + kube-controller-manager in ``d`` (scripts/kube/start), then ``components``.

    KWOK renews each node's 40 s Lease (scripts/kube/start's default). The
    node-lifecycle controller's grace period is raised to an hour: on 2 loaded
    cores a late renewal would take nodes for lost and evict pods mid-arm,
    which measures neither scheduler.
    """
    env = dict(os.environ, GPUPOOL_KUBE_OWNER_PID=str(os.getpid()),
               GPUPOOL_KUBE_CONTROLLER_MANAGER_ARGS="--node-monitor-grace-period=1h")
    for args in ([str(d)], [str(d), *components]):
        r = subprocess.run([str(KUBE / "start"), *args], capture_output=True, text=True, env=env)
        if r.returncode != 0:
            raise SystemExit(f"could not start the cluster ({KUBE}/start {' '.join(args)}):\n{r.stderr[-3000:]}")
    return d / "kubeconfig"


def stop_cluster(d: Path) -> None:
    subprocess.run([str(KUBE / "stop"), str(d)], capture_output=True)


def pid_of(d: Path, program: str) -> int:
    return int((d / f"{program}.pid").read_text().split()[0])


def make_kwok_nodes(api: client.CoreV1Api, count: int, threads: int = 16, *, device_plugin: bool = True) -> float:
    """``count`` nodes played by KWOK, each with 8 allocatable nvidia.com/gpu and GFD-like labels; seconds taken.

    The not-ready taint the API server's admission adds is removed as
    tests/kube/cluster.py's make_gpu_node does. ``device_plugin=False``: no
    ``nvidia.com/gpu`` and no GFD labels, as on a node whose GPUs a DRA
    driver publishes as ResourceSlices instead (bench/kube_bind_dra.py
    publishes them).
    """
    res = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    if device_plugin:
        res["nvidia.com/gpu"] = str(GPUS_PER_NODE)

    def one(i: int) -> None:
        name = f"kwok-n{i:05d}"
        labels = {"kubernetes.io/hostname": name, "type": "kwok"}
        if device_plugin:
            labels |= {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920",
                       "nvidia.com/gpu.count": str(GPUS_PER_NODE)}
        api.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": name, "labels": labels, "annotations": {"kwok.x-k8s.io/node": "fake"}}}, _preload_content=False)
        # no Ready condition of ours: KWOK initializes a node that is not Ready (phase Running, Ready), then
        # renews its Lease; it keeps the GPUs we put in capacity/allocatable
        api.patch_node_status(name, {"status": {"capacity": res, "allocatable": res}}, _preload_content=False)
        api.patch_node(name, {"spec": {"taints": []}}, _preload_content=False)

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(count)))
    deadline = time.monotonic() + 120
    while True:  # every node Ready, untainted, its GPUs allocatable: what both schedulers wait for
        nodes = api.list_node(label_selector="type=kwok").items
        ready = [n for n in nodes if not n.spec.taints
                 and (not device_plugin or (n.status.allocatable or {}).get("nvidia.com/gpu"))
                 and any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])]
        if len(ready) == count:
            return time.perf_counter() - t0
        if time.monotonic() > deadline:
            raise SystemExit(f"only {len(ready)} of {count} KWOK nodes Ready and untainted after 120 s")
        time.sleep(0.5)


# ---------------------------------------------------------------- what is measured
def api_writes(api: client.CoreV1Api) -> collections.Counter[str]:
    """Write requests the API server has answered so far, by verb and group/resource/subresource (its /metrics)."""
    req = api.api_client.param_serialize(method="GET", resource_path="/metrics", auth_settings=["BearerToken"])
    text = api.api_client.call_api(*req).read().decode()
    counts: collections.Counter[str] = collections.Counter()
    for m in re.finditer(r'^apiserver_request_total\{([^}]*)\} (\S+)', text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        verb = WRITE_VERBS.get(labels.get("verb", "").upper())
        if verb is None:
            continue
        what = (labels.get("group") + "/" if labels.get("group") else "") + labels.get("resource", "?")
        if labels.get("subresource"):
            what += "/" + labels["subresource"]
        counts[f"{verb} {what}"] += int(float(m.group(2)))
    return counts


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> tuple[float, float]:
    """(RSS now, peak RSS) of a process, MiB."""
    v = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(("VmRSS:", "VmHWM:")):
            k, rest = line.split(":", 1)
            v[k] = int(rest.split()[0]) / 1024
    return v["VmRSS"], v["VmHWM"]


class CpuMeter:
    """CPU seconds each named group of processes used between start() and used()."""

    def __init__(self, groups: dict[str, list[int]]) -> None:
        self.groups = groups
        self.start = self._read()

    def _read(self) -> dict[str, float]:
        return {k: sum(cpu_s(p) for p in pids) for k, pids in self.groups.items()}

    def used(self) -> dict[str, float]:
        end = self._read()
        return {k: end[k] - self.start[k] for k in self.groups}


class BindWatch:
    """Watches one namespace's pods (raw JSON, cheap) and records when each pod is first seen with spec.nodeName."""

    def __init__(self, api: client.CoreV1Api, namespace: str) -> None:
        self.api = api
        self.ns = namespace
        self.bound: dict[str, float] = {}  # pod name -> perf_counter when first seen bound
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()
        if not self._ready.wait(30):
            raise SystemExit(f"the watch of {self.ns}'s pods did not start within 30 s")

    def _run(self) -> None:
        try:
            self._watch()
        except Exception:
            if not self._stop.is_set():  # after stop() the API server may go first: nothing left to record
                raise

    def _watch(self) -> None:
        rv = self.api.list_namespaced_pod(self.ns, limit=1).metadata.resource_version
        while not self._stop.is_set():
            resp = self.api.list_namespaced_pod(self.ns, watch=True, resource_version=rv, timeout_seconds=60,
                                                allow_watch_bookmarks=True, _preload_content=False)
            self._ready.set()
            buf = b""
            for chunk in resp.stream(1 << 16):
                now = time.perf_counter()
                buf += chunk
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    if not line.strip():
                        continue
                    obj = json.loads(line)["object"]
                    rv = obj["metadata"].get("resourceVersion", rv)
                    name = obj["metadata"].get("name")
                    if (obj.get("spec") or {}).get("nodeName") and name not in self.bound:
                        self.bound[name] = now
                if self._stop.is_set():
                    break
            resp.release_conn()

    def wait_for_count(self, names: set[str], count: int, timeout: float, settle: float) -> bool:
        """Until ``count`` of ``names`` are bound (True), or ``timeout`` s pass, or none more binds for ``settle`` s."""
        deadline = time.monotonic() + timeout
        last, last_change = -1, time.monotonic()
        while time.monotonic() < deadline:
            n = len(names.intersection(self.bound))
            if n >= count:
                return True
            if n != last:
                last, last_change = n, time.monotonic()
            elif time.monotonic() - last_change > settle:
                return False
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        self._stop.set()


def empty_namespace(api: client.CoreV1Api, ns: str, timeout: float = 300) -> float:
    """Delete every pod of ``ns`` (no grace) and wait until none is left; seconds taken.

    A deletecollection of 10,000 pods outlasts the API server's 60 s request
    timeout (504, the deletion half done), and on a loaded machine the server
    may close the connection before it answers: it is asked again until none
    is left.
    """
    t0 = time.perf_counter()
    deadline = time.monotonic() + timeout
    while api.list_namespaced_pod(ns, limit=1).items:
        if time.monotonic() > deadline:
            raise SystemExit(f"pods of {ns} still there {timeout:.0f} s after their deletion")
        try:
            api.delete_collection_namespaced_pod(ns, grace_period_seconds=0, _preload_content=False)
        except client.ApiException as e:
            if e.status not in (500, 504):
                raise
        except urllib3.exceptions.HTTPError:
            pass  # the connection closed before the answer: the deletion goes on; ask again
        time.sleep(0.5)
    return time.perf_counter() - t0


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else float("nan")


ARMS = ("kube-scheduler", "gpupool")
"""The two schedulers every kube_bind table compares, in their columns' order."""


def print_medians(by: dict[str, list[dict[str, Any]]], rows: tuple[tuple[str, str, float, str], ...]) -> None:
    """The side-by-side table: each (key, label, scale, format) row's median over rounds per arm, and the ratio."""
    print("\nmedians over rounds, gpupool / kube-scheduler:\n")
    print("| | kube-scheduler | gpupool | gpupool / kube-scheduler |")
    print("|---|---|---|---|")
    for key, label, scale, fmt in rows:
        k, g = (statistics.median(r[key] for r in by[a]) for a in ARMS)
        print(f"| {label} | {k * scale:{fmt}} | {g * scale:{fmt}} | {g / k if k else float('nan'):.2f} |")


def print_per_bound_pod(by: dict[str, list[dict[str, Any]]], field: str, header: str) -> None:
    """A table of the counts in each round's ``field`` (e.g. writes by verb and resource), per pod bound in all
    rounds of each arm."""
    keys = sorted({k for rows in by.values() for r in rows for k in r[field]})
    print(f"| {header} |")
    print("|---|---|---|")
    for k in keys:
        cells = [sum(r[field].get(k, 0) for r in by[a]) / max(1, sum(r["bound"] for r in by[a])) for a in ARMS]
        print(f"| {k} | {cells[0]:.3f} | {cells[1]:.3f} |")
