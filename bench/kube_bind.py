"""Binding throughput on Kubernetes (issue 14): gpupool against a trivial binder on the same real API server.

Starts its own kube-apiserver + etcd (../shared/kube, as tests/kube/conftest.py
does), creates N Node objects with 8 GPUs each, then, in one run, alternates:

- **ceiling**: a trivial binder with no policy and no service: for each pod,
  create it and bind it through ``pods/binding``, with the same client library
  (the official ``kubernetes`` client, the same raw calls as ours), the same
  number of worker threads and the same manifests (``pod_manifest``) as
  gpupool's executor. Pod i goes to node i // 8 (no choice made).
- **gpupool**: a real ``gpupool serve --backend kubernetes`` process (its own
  state directory, a fresh namespace) and J one-GPU train jobs submitted
  through its HTTP API by ``--concurrency`` async clients (as bench/api.py).

A pod counts as bound when a watch of the namespace, run by this benchmark,
first shows its ``spec.nodeName`` (the API server's view, both arms measured
the same way). binds/s = pods / (first create or submit -> last bound).
Submit->bound: from sending the job's submit to its pod seen bound. The
cycle time comes from the service's ``gpupool_cycle_seconds`` histogram; the
scheduler's peak RSS from /proc; CPU seconds of the API server + etcd, the
binder and this process from /proc; the API server's request counts from its
/metrics. Each arm has a namespace of its own and its pods are left there
(deleting 10,000 pods takes the API server minutes here): later arms meet a
fuller etcd, so the order flips every round.

    .venv/bin/python bench/kube_bind.py [--nodes 1000] [--jobs 10000] [--rounds 2] [--gpu-fraction 0.5]

1,000 nodes x 8 GPUs hold 8,000 one-GPU jobs; to bind all 10,000 the jobs ask
for ``--gpu-fraction`` of a GPU (default 0.5 when jobs > GPUs).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import concurrent.futures
import json
import os
import platform
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kubernetes import client, config  # noqa: E402

from gpupool.backends.base import Launch  # noqa: E402
from gpupool.backends.kubernetes.calls import WORKERS, pods_path, post_json, raw_json, raw_status  # noqa: E402
from gpupool.backends.kubernetes.pods import PodSettings, pod_manifest  # noqa: E402
from gpupool.client import AsyncGpupoolClient  # noqa: E402
from gpupool.envbuilder import gpu_environment  # noqa: E402

KUBE = Path(os.environ.get("GPUPOOL_KUBE_DIR", ROOT.parent / "shared" / "kube"))
TOKEN = "kube-bind-admin"
GPUS_PER_NODE = 8
SETTINGS = {"watchdog": "off", "on_shutdown": "leave", "min_runtime_s": 0.0, "resume_backoff_s": 0.0,
            "events_max_rows": 100000}


# ---------------------------------------------------------------- the cluster
def start_api_server(work: Path) -> Path:
    d = work / "kube"
    r = subprocess.run([str(KUBE / "start"), str(d)], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"could not start the API server ({KUBE}/start):\n{r.stderr[-3000:]}")
    return d / "kubeconfig"


def make_nodes(api: client.CoreV1Api, count: int, threads: int = 16) -> float:
    """``count`` Ready Nodes with 8 allocatable nvidia.com/gpu each (3 calls a node); returns seconds."""
    res = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(GPUS_PER_NODE)}

    def one(i: int) -> None:
        name = f"bench-n{i:05d}"
        labels = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920",
                  "kubernetes.io/hostname": name}
        raw_status(api.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}},
                              _preload_content=False))
        t = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        raw_status(api.patch_node_status(name, {"status": {"capacity": res, "allocatable": res, "conditions": [
            {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "bench",
             "lastHeartbeatTime": t, "lastTransitionTime": t}]}}, _preload_content=False))
        raw_status(api.patch_node(name, {"spec": {"taints": []}}, _preload_content=False))

    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, range(count)))
    return time.perf_counter() - t0


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class CpuMeter:
    """CPU seconds used by the API server + etcd, the binder process and this benchmark over one arm."""

    def __init__(self, kube_dir: Path | None, binder_pid: int) -> None:
        self.server_pids = [int(p.read_text()) for p in kube_dir.glob("*.pid")] if kube_dir else []
        self.binder_pid = binder_pid
        self.start = self._read()

    def _read(self) -> tuple[float, float, float]:
        me = sum(os.times()[:2])
        return (sum(cpu_s(p) for p in self.server_pids), cpu_s(self.binder_pid) if self.binder_pid != os.getpid()
                else 0.0, me)

    def used(self) -> dict[str, float]:
        end = self._read()
        used = [b - a for a, b in zip(self.start, end, strict=True)]
        return dict(zip(("cpu_server", "cpu_binder", "cpu_bench"), used, strict=True))


class BindWatch:
    """Watches one namespace's pods (raw JSON, cheap) and records when each pod is first seen bound."""

    def __init__(self, api: client.CoreV1Api, namespace: str) -> None:
        self.api = api
        self.ns = namespace
        self.bound: dict[str, float] = {}  # pod name -> perf_counter when first seen with spec.nodeName
        self.node_of: dict[str, str] = {}
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()
        self._ready.wait(30)

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
                    ev = json.loads(line)
                    obj = ev["object"]
                    rv = obj["metadata"].get("resourceVersion", rv)
                    node = (obj.get("spec") or {}).get("nodeName")
                    name = obj["metadata"].get("name")
                    if node and name not in self.bound:
                        self.bound[name] = now
                        self.node_of[name] = node
                if self._stop.is_set():
                    break
            resp.release_conn()

    def wait_for(self, names: set[str], timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if names.issubset(self.bound):
                return True
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        self._stop.set()


def request_counts(api: client.CoreV1Api) -> collections.Counter[str]:
    """The API server's own count of requests by verb and resource (its /metrics), to see what each arm asked."""
    counts: collections.Counter[str] = collections.Counter()
    try:
        req = api.api_client.param_serialize(method="GET", resource_path="/metrics", auth_settings=["BearerToken"])
        text = api.api_client.call_api(*req).read().decode()
    except Exception:
        return counts
    for m in re.finditer(r'^apiserver_request_total\{([^}]*)\} (\S+)', text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if labels.get("resource") in ("pods", "nodes", "bindings") or labels.get("subresource"):
            key = f"{labels.get('verb')} {labels.get('resource')}{'/' + labels['subresource'] if labels.get('subresource') else ''}"
            counts[key] += int(float(m.group(2)))
    return counts


def new_namespace(api: client.CoreV1Api, name: str) -> str:
    api.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return name


# ---------------------------------------------------------------- the ceiling
def sample_manifest(ns: str, i: int, node: str, milli: int) -> dict[str, Any]:
    """A pod as gpupool makes it (same builder, same environment), for the trivial binder."""
    job_id = f"c{i:06d}"
    gid = f"{node}/gpu{(i % GPUS_PER_NODE)}"
    shares = [(gid, milli, 81920 * 1024 * 1024 * milli // 1000)]
    env = gpu_environment(job_id, "bench", shares, 1, False, False, mps=False, pythonpath="")
    assignment = {"node": node, "gpus": [{"id": gid, "index": i % GPUS_PER_NODE, "model": "A100-SXM4-80GB",
                                          "milli": milli, "memory_limit": shares[0][2]}]}
    launch = Launch(job_id, 1, ["python", "train.py"], "", "admin", "bench", {}, env, assignment)
    return pod_manifest(launch, PodSettings(ns, "busybox:1.36"))


def run_ceiling(api: client.CoreV1Api, ns: str, jobs: int, nodes: int, workers: int, milli: int,
                kube_dir: Path | None) -> dict[str, Any]:
    """Create + bind ``jobs`` pods on ``workers`` threads, nothing else; the API server's ceiling for that."""
    per_node = GPUS_PER_NODE * 1000 // milli
    manifests = [sample_manifest(ns, i, f"bench-n{(i // per_node) % nodes:05d}", milli) for i in range(jobs)]
    watch = BindWatch(api, ns)
    watch.start()

    def create_and_bind(m: dict[str, Any]) -> None:
        name = m["metadata"]["name"]
        raw_json(post_json(api, pods_path(ns), m))
        body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
                "target": {"apiVersion": "v1", "kind": "Node", "name": m["metadata"]["annotations"]["gpupool.io/node"]}}
        status = raw_status(post_json(api, pods_path(ns, name, "binding"), body))
        if status != 201:
            raise RuntimeError(f"bind {name}: HTTP {status}")

    meter = CpuMeter(kube_dir, os.getpid())
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        for f in [pool.submit(create_and_bind, m) for m in manifests]:
            f.result()
    names = {m["metadata"]["name"] for m in manifests}
    ok = watch.wait_for(names, 120)
    watch.stop()
    end = max(watch.bound[n] for n in names if n in watch.bound)
    cpu = meter.used()
    cpu["cpu_binder"], cpu["cpu_bench"] = cpu["cpu_bench"], 0.0  # here the binder is this process
    return {"arm": "ceiling", "bound": sum(n in watch.bound for n in names), "all": ok, "wall": end - t0,
            "rate": jobs / (end - t0), **cpu}


# ---------------------------------------------------------------- gpupool
class KubeServe:
    """`gpupool serve --backend kubernetes` of this checkout, in a child process."""

    def __init__(self, work: Path, kubeconfig: Path, ns: str, root: Path = ROOT,
                 settings: dict[str, Any] | None = None) -> None:
        self.state = work / f"state-{ns}"
        cfg = work / f"settings-{ns}.json"
        cfg.write_text(json.dumps({**SETTINGS, **(settings or {})}))
        env = dict(os.environ, GPUPOOL_ADMIN_TOKEN=TOKEN, PYTHONPATH=str(root))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpupool", "serve", "--port", "0", "--state-dir", str(self.state),
             "--config", str(cfg), "--backend", "kubernetes", "--kubeconfig", str(kubeconfig), "--namespace", ns,
             "--log-level", "WARNING"],
            env=env, stdout=subprocess.PIPE, stderr=open(work / f"serve-{ns}.log", "w"), text=True,
            start_new_session=True, cwd=root)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "listening on " not in line:
            raise SystemExit(f"gpupool serve did not start (exit {self.proc.wait()}); see {work}/serve-{ns}.log")
        self.url = line.split("listening on ", 1)[1].split()[0]

    def rss_mib(self) -> tuple[float, float]:
        v = {}
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                k, rest = line.split(":", 1)
                v[k] = int(rest.split()[0]) / 1024
        return v["VmRSS"], v["VmHWM"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def cycle_stats(metrics: str) -> tuple[int, float, float]:
    """(cycles, mean s, p99 upper bound s) from the ``gpupool_cycle_seconds`` histogram."""
    count = int(float(re.search(r"^gpupool_cycle_seconds_count (\S+)", metrics, re.M).group(1)))  # type: ignore[union-attr]
    total = float(re.search(r"^gpupool_cycle_seconds_sum (\S+)", metrics, re.M).group(1))  # type: ignore[union-attr]
    p99 = float("inf")
    for le, c in re.findall(r'^gpupool_cycle_seconds_bucket\{le="([^"]+)"\} (\S+)', metrics, re.M):
        if le != "+Inf" and float(c) >= 0.99 * count:
            p99 = min(p99, float(le))
    return count, total / max(count, 1), p99


async def submit_all(url: str, jobs: int, concurrency: int, spec: dict[str, Any]) -> tuple[dict[str, float], float]:
    """Submit ``jobs`` jobs; {job id: perf_counter at send}, and the perf_counter of the first send."""
    c = AsyncGpupoolClient(url, TOKEN, timeout=120)
    sent: dict[str, float] = {}
    todo = iter(range(jobs))
    first = time.perf_counter()

    async def worker() -> None:
        for i in todo:
            t = time.perf_counter()
            job = await c.submit({**spec, "name": f"b{i}"})
            sent[job["id"]] = t

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return sent, first


def start_profile(pid: int, out: Path) -> subprocess.Popen[bytes] | None:
    """py-spy sampling ``pid`` (the thread holding the GIL) into ``out`` as collapsed stacks; None without
    py-spy. Measuring only: it takes some CPU itself, so profiled runs are not the ones whose rates we report."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        print("no py-spy: --profile ignored", file=sys.stderr)
        return None
    return subprocess.Popen([spy, "record", "--pid", str(pid), "--rate", "50", "--format", "raw",
                             "--output", str(out), "--nonblocking", "--gil"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)


def summarize_profile(path: Path, top: int = 25) -> str:
    """The heaviest functions of a collapsed-stacks file: share of samples that pass through each (inclusive)."""
    total = 0
    inclusive: collections.Counter[str] = collections.Counter()
    for line in path.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        total += int(n)
        for frame in set(stack.split(";")):
            inclusive[re.sub(r"\((?:.*/)?([^/:]+):\d+\)", r"(\1)", frame)] += int(n)
    rows = [f"{100 * c / max(total, 1):5.1f} %  {f}" for f, c in inclusive.most_common(top)]
    return f"{total} samples\n" + "\n".join(rows)


def run_gpupool(api: client.CoreV1Api, work: Path, kubeconfig: Path, ns: str, jobs: int, nodes: int,
                concurrency: int, fraction: float | None, kube_dir: Path | None, root: Path = ROOT,
                settings: dict[str, Any] | None = None, profile: Path | None = None) -> dict[str, Any]:
    serve = KubeServe(work, kubeconfig, ns, root, settings)
    spy = None
    try:
        from gpupool.client import GpupoolClient

        sync = GpupoolClient(serve.url, TOKEN)
        deadline = time.monotonic() + 120
        while len(sync.pool()["nodes"]) < nodes:
            if time.monotonic() > deadline:
                raise SystemExit("gpupool did not see every node within 120 s")
            time.sleep(0.2)
        sync.set_project("bench")
        rss_idle = serve.rss_mib()[0]
        watch = BindWatch(api, ns)
        watch.start()
        spec: dict[str, Any] = {"project": "bench", "command": ["python", "train.py"]}
        spec.update({"gpu_fraction": fraction} if fraction else {"gpus": 1})
        meter = CpuMeter(kube_dir, serve.proc.pid)
        if profile is not None:
            spy = start_profile(serve.proc.pid, profile)
        sent, t0 = asyncio.run(submit_all(serve.url, jobs, concurrency, spec))
        t_submitted = time.perf_counter()
        pods = {f"gpupool-{j.lower()}-1": j for j in sent}
        ok = watch.wait_for(set(pods), 300)
        watch.stop()
        seen = [n for n in pods if n in watch.bound]
        end = max(watch.bound[n] for n in seen)
        lat = sorted(watch.bound[n] - sent[pods[n]] for n in seen)
        cpu = meter.used()
        if spy is not None:
            spy.send_signal(signal.SIGINT)  # py-spy writes its file on SIGINT
            spy.wait(60)
            if profile is not None and profile.exists():
                print(f"profile of {ns} ({profile}):\n{summarize_profile(profile)}", flush=True)
        count, mean, p99 = cycle_stats(sync.metrics())
        rss, hwm = serve.rss_mib()
        return {"arm": "gpupool", "bound": len(seen), "all": ok, "wall": end - t0, "rate": len(seen) / (end - t0),
                "submit_s": t_submitted - t0, "p50": lat[len(lat) // 2], "p99": lat[min(len(lat) - 1, int(0.99 * len(lat)))],
                "cycles": count, "cycle_mean": mean, "cycle_p99": p99, "rss_idle": rss_idle, "rss": rss, "hwm": hwm,
                **cpu}
    finally:
        serve.stop()


# ---------------------------------------------------------------- the run
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=10000)
    ap.add_argument("--rounds", type=int, default=2, help="ceiling and gpupool runs each (order flips each round)")
    ap.add_argument("--workers", type=int, default=WORKERS, help="the ceiling's threads (default: gpupool's)")
    ap.add_argument("--concurrency", type=int, default=16, help="clients submitting to gpupool at once")
    ap.add_argument("--gpu-fraction", type=float, default=None)
    ap.add_argument("--kubeconfig", help="use this API server instead of starting one")
    ap.add_argument("--only", choices=("ceiling", "gpupool"))
    ap.add_argument("--settings", default="{}", help="service settings (JSON) over the bench's own, e.g. "
                    '\'{"cycle_min_interval_s": 0.5}\'')
    ap.add_argument("--also", metavar="CHECKOUT", type=Path,
                    help="also run gpupool serve from this checkout (e.g. a worktree of an older commit), "
                         "in the same rounds: before/after")
    ap.add_argument("--profile", metavar="DIR", type=Path,
                    help="py-spy each gpupool arm from first submit to last bind (collapsed stacks in DIR, the "
                         "heaviest frames printed); the profiler's own CPU makes those runs' rates not comparable")
    args = ap.parse_args()
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    fraction = args.gpu_fraction
    if fraction is None and args.jobs > args.nodes * GPUS_PER_NODE:
        fraction = 0.5
    milli = int(round((fraction or 1.0) * 1000))
    if args.jobs > args.nodes * GPUS_PER_NODE * 1000 // milli:
        raise SystemExit(f"{args.jobs} jobs of {milli / 1000} GPU do not fit on {args.nodes} x 8 GPUs")
    work = Path(tempfile.mkdtemp(prefix="kube-bind-"))
    kubeconfig = Path(args.kubeconfig) if args.kubeconfig else start_api_server(work)
    kube_dir = None if args.kubeconfig else work / "kube"
    try:
        api = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
        made = make_nodes(api, args.nodes)
        print(f"{args.nodes} nodes x {GPUS_PER_NODE} GPUs created in {made:.1f} s; {args.jobs} jobs of "
              f"{milli / 1000} GPU; ceiling threads {args.workers}; API server work dir {work}", flush=True)
        results: list[dict[str, Any]] = []
        arms = ["ceiling", "gpupool"] if args.only is None else [args.only]
        if args.also:
            arms.append("other")
        for r in range(args.rounds):
            for arm in (arms if r % 2 == 0 else arms[::-1]):
                ns = new_namespace(api, f"{arm[:4]}-{r}-{os.getpid()}")
                load = os.getloadavg()[0]
                before = request_counts(api)
                if arm == "ceiling":
                    res = run_ceiling(api, ns, args.jobs, args.nodes, args.workers, milli, kube_dir)
                else:
                    res = run_gpupool(api, work, kubeconfig, ns, args.jobs, args.nodes, args.concurrency, fraction,
                                      kube_dir, args.also.resolve() if arm == "other" else ROOT,
                                      json.loads(args.settings),
                                      args.profile / f"{ns}.txt" if args.profile else None)
                    if arm == "other":
                        res["arm"] = f"gpupool @ {args.also.name}"
                asked = request_counts(api)
                asked.subtract(before)
                res.update(round=r, load=load, requests={k: v for k, v in sorted(asked.items()) if v > 0})
                print(json.dumps(res), flush=True)
                results.append(res)
        report(results, args, milli, kube_dir)
    finally:
        if not args.kubeconfig:
            subprocess.run([str(KUBE / "stop"), str(work / "kube")], capture_output=True)
            shutil.rmtree(work, ignore_errors=True)


def report(results: list[dict[str, Any]], args: argparse.Namespace, milli: int, kube_dir: Path | None) -> None:
    ceil = [r["rate"] for r in results if r["arm"] == "ceiling"]
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}; `bench/kube_bind.py --nodes {args.nodes} --jobs {args.jobs} "
          f"--rounds {args.rounds}{' --settings ' + repr(args.settings) if args.settings != '{}' else ''}` "
          f"({milli / 1000} GPU a job)\n")
    print("| round | arm | pods bound | binds/s | / ceiling | submit->bound p50 / p99 | submits took | cycles, "
          "mean / p99 | scheduler RSS idle / end (peak) | CPU s: API server+etcd / binder / bench client | load avg |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        same = [c["rate"] for c in results if c["arm"] == "ceiling" and c["round"] == r["round"]]
        ratio = f"{r['rate'] / same[0]:.0%}" if r["arm"] != "ceiling" and same else ""
        if r["arm"] == "ceiling":
            extra = "| | | | |"
        else:
            extra = (f"| {r['p50'] * 1000:.0f} / {r['p99'] * 1000:.0f} ms | {r['submit_s']:.1f} s | "
                     f"{r['cycles']}, {r['cycle_mean'] * 1000:.1f} / <= {r['cycle_p99'] * 1000:.0f} ms | "
                     f"{r['rss_idle']:.0f} / {r['rss']:.0f} ({r['hwm']:.0f}) MiB |")
        cpu = f"{r['cpu_server']:.1f} / {r['cpu_binder']:.1f} / {r['cpu_bench']:.1f}" if kube_dir else "n/a"
        print(f"| {r['round']} | {r['arm']} | {r['bound']} | {r['rate']:.0f} | {ratio} {extra} {cpu} | {r['load']:.1f} |")
    ours = [r["rate"] for r in results if r["arm"] == "gpupool"]
    if ceil and ours:
        print(f"\nmedian binds/s: gpupool {statistics.median(ours):.0f}, ceiling {statistics.median(ceil):.0f} "
              f"({statistics.median(ours) / statistics.median(ceil):.0%})")


if __name__ == "__main__":
    main()
