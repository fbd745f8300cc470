"""Binding on Kubernetes (issue 28): gpupool against kube-scheduler, the same pods, one cluster, one run.

Starts the project's test cluster (scripts/kube: kube-apiserver v1.37, etcd,
kube-controller-manager) with kube-scheduler and KWOK, and N KWOK nodes with 8
GPUs each (``nvidia.com/gpu`` allocatable, GFD-like labels; KWOK keeps them
Ready and runs the pods bound to them). Then, for each round, in alternating
order, two arms on the same namespace:

- **kube-scheduler**: P one-GPU pods with ``schedulerName: default-scheduler``.
- **gpupool**: the same P pods with ``schedulerName: gpupool`` and the label
  ``gpupool.io/project: bench`` (kubectl pods of a project, docs/kubernetes.md),
  bound by a real ``gpupool serve --backend kubernetes`` process (fresh state,
  ``--pod-namespaces`` naming the pods' namespace).

The benchmark creates the pods itself (``--creators`` threads, the same for
both arms) and watches them: a pod counts as bound when the watch first shows
its ``spec.nodeName``. An arm ends when min(P, N x 8) pods are bound (more pods
than GPUs: the rest wait, Pending, and are not counted), or when no pod has been
bound for ``--settle`` seconds. After each arm every pod is deleted (and gone)
before the next starts, so each arm meets an empty cluster.

Reported per arm: binds/s (bound / first create -> last bound), create->bound
p50/p99, API writes per bound pod (the API server's apiserver_request_total,
write verbs, before/after, less the benchmark's own pod creates; KWOK's writes,
the pods' status as they start Running and node heartbeats, are in both arms),
CPU seconds per bound pod of the scheduler process and of kube-apiserver +
etcd (/proc), the scheduler's peak RSS (VmHWM; kube-scheduler's is over the
whole run, gpupool's over its arm), and the ratios gpupool / kube-scheduler.

    .venv/bin/python bench/kube_bind.py [--nodes 200] [--pods 1600] [--rounds 2]
    .venv/bin/python bench/kube_bind.py --nodes 1000 --pods 10000   # issue 28's size (8,000 bind, 2,000 wait)
    .venv/bin/python bench/kube_bind.py --kai                       # 500 nodes x 8 GPUs filled by 4,000 pods
    .venv/bin/python bench/kube_bind.py --setting cycle_busy_share=0.25   # a gpupool setting (VALUE is JSON)
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kubernetes import client, config  # noqa: E402

from bench import kube_bind_kit as kit  # noqa: E402
from gpupool.client import GpupoolClient  # noqa: E402

GPUS_PER_NODE = kit.GPUS_PER_NODE
TOKEN = "kube-bind-admin"
POD_NS = "bench-pods"
GPUPOOL_NS = "gpupool"
SETTINGS = {"watchdog": "off", "on_shutdown": "leave", "min_runtime_s": 0.0, "resume_backoff_s": 0.0,
            "events_max_rows": 100000}
ARMS = kit.ARMS


def pod_manifest(i: int, arm: str) -> dict[str, Any]:
    """A user's one-GPU pod; the arms differ only in schedulerName and gpupool's project label.

    No ``envFrom`` of gpupool's ConfigMap: a whole-GPU pod learns its GPUs from
    the device plugin (and could read gpupool's binding annotations), so
    gpupool writes no ConfigMap for it, as for any pod that does not name it.
    """
    name = f"p-{i:05d}"
    labels = {"app": "bench"}
    if arm == "gpupool":
        labels["gpupool.io/project"] = "bench"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels},
            "spec": {"schedulerName": "gpupool" if arm == "gpupool" else "default-scheduler",
                     "restartPolicy": "Never", "terminationGracePeriodSeconds": 0, "containers": [
                         {"name": "main", "image": "registry.example/train:1", "command": ["python", "train.py"],
                          "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}}


class GpupoolServe:
    """`gpupool serve --backend kubernetes` of this checkout, in a child process, for one arm."""

    def __init__(self, work: Path, kubeconfig: Path, tag: str, settings: dict[str, Any] | None = None) -> None:
        cfg = work / f"settings-{tag}.json"
        cfg.write_text(json.dumps(SETTINGS if settings is None else settings))
        self.log = work / f"serve-{tag}.log"
        env = dict(os.environ, GPUPOOL_ADMIN_TOKEN=TOKEN, PYTHONPATH=str(ROOT))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpupool", "serve", "--port", "0", "--state-dir", str(work / f"state-{tag}"),
             "--config", str(cfg), "--backend", "kubernetes", "--kubeconfig", str(kubeconfig),
             "--namespace", GPUPOOL_NS, "--pod-namespaces", f"{POD_NS}=bench", "--log-level", "WARNING"],
            env=env, stdout=subprocess.PIPE, stderr=open(self.log, "w"), text=True, start_new_session=True,
            cwd=ROOT)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "listening on " not in line:
            raise SystemExit(f"gpupool serve did not start (exit {self.proc.wait()}):\n{self.log.read_text()[-3000:]}")
        self.client = GpupoolClient(line.split("listening on ", 1)[1].split()[0], TOKEN)

    def ready(self, nodes: int) -> None:
        """Every node in gpupool's pool and the project there: what the pods need before they are created."""
        deadline = time.monotonic() + 120
        while len(self.client.pool()["nodes"]) < nodes:
            if time.monotonic() > deadline:
                raise SystemExit(f"gpupool did not see every node within 120 s; see {self.log}")
            time.sleep(0.2)
        self.client.set_project("bench")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def run_arm(arm: str, api: client.CoreV1Api, kube: Path, work: Path, args: argparse.Namespace,
            tag: str) -> dict[str, Any]:
    """Create P pods for ``arm``'s scheduler, measure until the GPUs are full (or nothing more binds), clean up."""
    serve = None
    if arm == "gpupool":
        serve = GpupoolServe(work, kube / "kubeconfig", tag, args.settings)
        serve.ready(args.nodes)
        scheduler = serve.proc.pid
    else:
        scheduler = kit.pid_of(kube, "kube-scheduler")
    try:
        watch = kit.BindWatch(api, POD_NS)
        watch.start()
        manifests = [pod_manifest(i, arm) for i in range(args.pods)]
        created: dict[str, float] = {}
        load = os.getloadavg()[0]
        writes_before = kit.api_writes(api)
        meter = kit.CpuMeter({"scheduler": [scheduler], "server": [kit.pid_of(kube, "kube-apiserver"), kit.pid_of(kube, "etcd")],
                          "kwok": [kit.pid_of(kube, "kwok")], "bench": [os.getpid()]})

        def create(m: dict[str, Any]) -> None:
            created[m["metadata"]["name"]] = time.perf_counter()
            api.create_namespaced_pod(POD_NS, m, _preload_content=False)

        t0 = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(args.creators) as pool:
            for f in [pool.submit(create, m) for m in manifests]:
                f.result()
        created_s = time.perf_counter() - t0
        expect = min(args.pods, args.nodes * GPUS_PER_NODE)
        full = watch.wait_for_count(set(created), expect, args.timeout, args.settle)
        cpu = meter.used()
        writes = kit.api_writes(api)
        writes.subtract(writes_before)
        watch.stop()
        rss, hwm = kit.rss_mib(scheduler)
        bound = [n for n in created if n in watch.bound]
        last = max((watch.bound[n] for n in bound), default=t0)
        lat = [watch.bound[n] - created[n] for n in bound]
        writes["create pods"] -= args.pods  # the benchmark's own
        writes = collections.Counter({k: v for k, v in writes.items() if v > 0})
        n = max(len(bound), 1)
        result = {"arm": arm, "created": args.pods, "bound": len(bound), "full": full, "create_s": created_s,
                  "fill_s": last - t0, "rate": len(bound) / max(last - t0, 1e-9), "p50": kit.pct(lat, 0.5),
                  "p99": kit.pct(lat, 0.99), "writes": dict(sorted(writes.items())),
                  "writes_pod": sum(writes.values()) / n, "sched_cpu_pod": cpu["scheduler"] / n,
                  "server_cpu_pod": cpu["server"] / n, "kwok_cpu_pod": cpu["kwok"] / n,
                  "bench_cpu_pod": cpu["bench"] / n, "rss": rss, "hwm": hwm, "load": load}
        print(json.dumps(result), flush=True)  # before the clean-up: a clean-up that fails loses no arm
        return result
    finally:
        if serve is not None:
            serve.stop()
        # deleting 10,000 pods (KWOK ends each) on 2 loaded cores took more than 300 s
        kit.empty_namespace(api, POD_NS, timeout=max(300.0, args.pods * 0.12))


def report(results: list[dict[str, Any]], args: argparse.Namespace, made_s: float) -> None:
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, load avg at start of each arm in the table; "
          f"`bench/kube_bind.py --nodes {args.nodes} --pods {args.pods} --rounds {args.rounds}"
          f"{''.join(f' --setting {s}' for s in args.setting)}`: "
          f"{args.nodes} KWOK nodes x {GPUS_PER_NODE} GPUs (made in {made_s:.0f} s), {args.pods} one-GPU pods "
          f"created by {args.creators} threads, {min(args.pods, args.nodes * GPUS_PER_NODE)} can bind\n")
    print("| round | arm | bound / created | binds/s | create->bound p50 / p99 | API writes per bound pod | "
          "CPU ms per bound pod: scheduler / API server+etcd / KWOK / bench | scheduler RSS end (peak) | "
          "pods created in | load |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['round']} | {r['arm']} | {r['bound']} / {r['created']}{'' if r['full'] else ' (stalled)'} | "
              f"{r['rate']:.0f} | {r['p50'] * 1000:.0f} / {r['p99'] * 1000:.0f} ms | {r['writes_pod']:.2f} | "
              f"{r['sched_cpu_pod'] * 1000:.2f} / {r['server_cpu_pod'] * 1000:.2f} / {r['kwok_cpu_pod'] * 1000:.2f} / "
              f"{r['bench_cpu_pod'] * 1000:.2f} | {r['rss']:.0f} ({r['hwm']:.0f}) MiB | {r['create_s']:.1f} s | "
              f"{r['load']:.1f} |")
    by = {a: [r for r in results if r["arm"] == a] for a in ARMS}
    if not all(by.values()):
        return
    kit.print_medians(by, (("rate", "binds/s", 1, ".0f"), ("fill_s", "first create -> last bound, s", 1, ".1f"),
                           ("p50", "create->bound p50, ms", 1000, ".0f"),
                           ("p99", "create->bound p99, ms", 1000, ".0f"),
                           ("writes_pod", "API writes per bound pod", 1, ".2f"),
                           ("sched_cpu_pod", "scheduler CPU per bound pod, ms", 1000, ".2f"),
                           ("server_cpu_pod", "API server + etcd CPU per bound pod, ms", 1000, ".2f"),
                           ("hwm", "scheduler peak RSS, MiB", 1, ".0f")))
    print("\nAPI writes per bound pod, by verb and resource (all rounds; KWOK's are in both arms):\n")
    kit.print_per_bound_pod(by, "writes", "write | kube-scheduler | gpupool")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=200)
    ap.add_argument("--pods", type=int, default=1600)
    ap.add_argument("--rounds", type=int, default=2, help="runs of each arm (the order flips each round)")
    ap.add_argument("--creators", type=int, default=8, help="threads creating the pods")
    ap.add_argument("--only", choices=ARMS)
    ap.add_argument("--timeout", type=float, default=900, help="longest an arm may take, s")
    ap.add_argument("--settle", type=float, default=30, help="end an arm when no pod has bound for this long, s")
    ap.add_argument("--kai", action="store_true", help="KAI-Scheduler's scale scenario: 500 nodes x 8 GPUs "
                    "filled by 4,000 one-GPU pods (first create -> last bound is the time to fill)")
    ap.add_argument("--setting", action="append", default=[], metavar="KEY=VALUE",
                    help="a gpupool service setting besides the benchmark's (VALUE is JSON)")
    args = ap.parse_args()
    args.settings = dict(SETTINGS)
    for item in args.setting:
        key, sep, value = item.partition("=")
        try:
            args.settings[key] = json.loads(value) if sep else None
        except json.JSONDecodeError:
            ap.error(f"--setting {item}: VALUE must be JSON (a number, true, \"text\")")
        if not sep:
            ap.error(f"--setting {item}: expected KEY=VALUE")
    if args.kai:
        args.nodes, args.pods = 500, 4000
    work = Path(tempfile.mkdtemp(prefix="kube-bind-"))
    kube = work / "kube"
    try:
        kubeconfig = kit.start_cluster(kube, "kube-scheduler", "kwok")
        api = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
        for ns in (POD_NS, GPUPOOL_NS):
            api.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
        made = kit.make_kwok_nodes(api, args.nodes)
        print(f"{args.nodes} KWOK nodes x {GPUS_PER_NODE} GPUs Ready in {made:.1f} s; cluster in {kube}", flush=True)
        arms = list(ARMS) if args.only is None else [args.only]
        results = []
        for r in range(args.rounds):
            for arm in (arms if r % 2 == 0 else arms[::-1]):
                res = run_arm(arm, api, kube, work, args, f"{arm}-{r}")
                res["round"] = r
                results.append(res)
        report(results, args, made)
    finally:
        kit.stop_cluster(kube)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
