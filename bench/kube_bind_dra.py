"""Binding GPUs claimed through DRA (issue 28's second table): gpupool against kube-scheduler, one run.

The cluster of bench/kube_bind.py (the project's kube-apiserver v1.37, etcd,
kube-controller-manager, kube-scheduler and KWOK, through
bench/kube_bind_kit.py) with N KWOK nodes whose 8 GPUs each are *not* the
``nvidia.com/gpu`` extended resource: each node's GPUs are one ResourceSlice
of driver ``gpu.nvidia.com`` (8 devices ``gpu-0``..``gpu-7`` with the NVIDIA
DRA driver's attribute names: ``type``, ``index``, ``uuid``, ``productName``,
``brand``, ``architecture``, ``cudaComputeCapability``, ``driverVersion``,
capacity ``memory``), owned by its Node, as the driver's kubelet plugin
publishes them; and the DeviceClass ``gpu.nvidia.com`` its chart makes. The
pods' namespace has one ResourceClaimTemplate (one ``gpu.nvidia.com``
device). Then, for each round, in alternating order, two arms:

- **kube-scheduler**: P pods with ``schedulerName: default-scheduler``, each
  with one claim from the template. kube-scheduler's DynamicResources plugin
  allocates the claim itself (picks a device, writes the claim's
  ``status.allocation`` and ``reservedFor``), then binds.
- **gpupool**: the same P pods with ``schedulerName: gpupool`` and the label
  ``gpupool.io/project: bench`` (kubectl pods of a project whose quota is the
  whole cluster), bound by a real ``gpupool serve --backend kubernetes``
  (fresh state), which writes the allocation it chose, then binds.

In both arms the controller-manager's resourceclaim controller makes each
pod's claim from the template (a ``create resourceclaims`` and a ``patch
pods/status`` naming it): the same work, before either scheduler can place the
pod. A pod counts as bound when the benchmark's watch first shows its
``spec.nodeName``; both schedulers write the claim's allocation before the
binding. After each arm the benchmark checks every bound pod's claim: allocated
on the pod's node, reserved for it, no device in two claims (a pod whose claim
is not so is reported, not counted as a success). Every pod, and every claim,
is gone before the next arm starts.

Reported per arm, as bench/kube_bind.py does: binds/s (bound / first create
-> last bound), create->bound p50/p99, API writes per bound pod (the API
server's apiserver_request_total, write verbs, before/after, less the
benchmark's own pod creates; the controller-manager's claim writes and KWOK's
are in both arms), CPU seconds per bound pod of the scheduler, of kube-apiserver
+ etcd and of kube-controller-manager (/proc), the scheduler's peak RSS, and
the ratios gpupool / kube-scheduler.

    .venv/bin/python bench/kube_bind_dra.py [--nodes 200] [--pods 1600] [--rounds 2]
    .venv/bin/python bench/kube_bind_dra.py --nodes 50 --pods 400 --rounds 1      # a quick look
    .venv/bin/python bench/kube_bind_dra.py --nodes 1000 --pods 10000             # issue 28's size
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import platform
import shutil
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kubernetes import client, config  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402

from bench import kube_bind_kit as kit  # noqa: E402
from bench.kube_bind import GPUPOOL_NS, POD_NS, GpupoolServe  # noqa: E402
from gpupool.backends.kubernetes.objects import client_body as body  # noqa: E402

GPUS_PER_NODE = kit.GPUS_PER_NODE
DRIVER = "gpu.nvidia.com"
CLASS_SELECTOR = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"
TEMPLATE = "one-gpu"
ARMS = kit.ARMS
BENCH_AGENT = "kube-bind-dra-bench"  # the benchmark's own calls; gpupool's are the Python client's default agent
AUDIT_POLICY = """apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  verbs: [create, update, patch, delete, deletecollection]
- level: None
"""


# ---------------------------------------------------------------- what NVIDIA's DRA driver publishes
def device_class() -> dict[str, Any]:
    """The DeviceClass the driver's Helm chart makes: the driver's devices of type gpu."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": CLASS_SELECTOR}}]}}


def node_slice(node: str, uid: str) -> dict[str, Any]:
    """One node's ResourceSlice as the driver's kubelet plugin writes it: its 8 A100s, owned by the Node."""
    devices = [{"name": f"gpu-{i}", "attributes": {
        "type": {"string": "gpu"}, "index": {"int": i},
        "uuid": {"string": f"GPU-{uuid.uuid5(uuid.NAMESPACE_DNS, f'{node}/{i}')}"},
        "productName": {"string": "NVIDIA A100-SXM4-80GB"}, "brand": {"string": "Nvidia"},
        "architecture": {"string": "Ampere"}, "cudaComputeCapability": {"version": "8.0.0"},
        "driverVersion": {"version": "570.124.6"}}, "capacity": {"memory": {"value": "80Gi"}}}
        for i in range(GPUS_PER_NODE)]
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": f"{node}-{DRIVER}", "ownerReferences": [
                {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid, "controller": True}]},
            "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1,
                                                                  "resourceSliceCount": 1},
                     "devices": devices}}


def publish_slices(api: client.CoreV1Api, threads: int = 16) -> float:
    """A ResourceSlice for every KWOK node, and the DeviceClass; seconds taken."""
    rapi = client.ResourceV1Api(api.api_client)
    t0 = time.perf_counter()
    rapi.create_device_class(body(device_class()), _preload_content=False)
    nodes = api.list_node(label_selector="type=kwok").items
    with concurrent.futures.ThreadPoolExecutor(threads) as pool:
        list(pool.map(lambda n: rapi.create_resource_slice(body(node_slice(n.metadata.name, n.metadata.uid)),
                                                           _preload_content=False), nodes))
    return time.perf_counter() - t0


def claim_template() -> dict[str, Any]:
    """The pods' ResourceClaimTemplate: one device of class gpu.nvidia.com (ExactCount, count 1)."""
    return {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": TEMPLATE},
            "spec": {"spec": {"devices": {"requests": [
                {"name": "gpu", "exactly": {"deviceClassName": DRIVER, "count": 1}}]}}}}


def pod_manifest(i: int, arm: str) -> dict[str, Any]:
    """A user's pod with one GPU claimed from the template; the arms differ only in schedulerName and label."""
    labels = {"app": "bench"}
    if arm == "gpupool":
        labels["gpupool.io/project"] = "bench"
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p-{i:05d}", "labels": labels},
            "spec": {"schedulerName": "gpupool" if arm == "gpupool" else "default-scheduler",
                     "restartPolicy": "Never", "terminationGracePeriodSeconds": 0,
                     "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": TEMPLATE}],
                     "containers": [{"name": "main", "image": "registry.example/train:1",
                                     "command": ["python", "train.py"], "resources": {"claims": [{"name": "gpu"}]}}]}}


# ---------------------------------------------------------------- an arm
def check_claims(api: client.CoreV1Api, bound: set[str]) -> list[str]:
    """What is wrong with the bound pods' claims (empty: each allocated on its pod's node, for it, no device twice)."""
    rapi = client.ResourceV1Api(api.api_client)
    pods = {p["metadata"]["name"]: p for p in kit_json(api.list_namespaced_pod(POD_NS, _preload_content=False))}
    claims = {c["metadata"]["name"]: c for c in
              kit_json(rapi.list_namespaced_resource_claim(POD_NS, _preload_content=False))}
    wrong: list[str] = []
    held: dict[tuple[str, str], str] = {}
    for name in sorted(bound):
        pod = pods.get(name)
        if pod is None:
            wrong.append(f"{name}: gone")
            continue
        made = [s.get("resourceClaimName") for s in (pod.get("status") or {}).get("resourceClaimStatuses") or []]
        claim = claims.get(made[0]) if made and made[0] else None
        if claim is None:
            wrong.append(f"{name}: no claim")
            continue
        st = claim.get("status") or {}
        results = ((st.get("allocation") or {}).get("devices") or {}).get("results") or []
        node = pod["spec"].get("nodeName")
        if len(results) != 1 or results[0].get("pool") != node or results[0].get("driver") != DRIVER:
            wrong.append(f"{name} on {node}: allocation {results}")
            continue
        if [r.get("uid") for r in st.get("reservedFor") or []] != [pod["metadata"]["uid"]]:
            wrong.append(f"{name}: reservedFor {st.get('reservedFor')}")
        key = (results[0]["pool"], results[0]["device"])
        if key in held:
            wrong.append(f"{name}: device {key} also in {held[key]}'s claim")
        held[key] = name
    return wrong


def kit_json(resp: Any) -> list[dict[str, Any]]:
    """The items of a list call made with _preload_content=False (plain JSON: cheaper than the client's models)."""
    items: list[dict[str, Any]] = json.loads(resp.data)["items"]
    return items


def event_reasons(api: client.CoreV1Api) -> tuple[collections.Counter[str], dict[str, str]]:
    """Events of the pods' namespace by who reported them and why; a Warning's message by its uid.

    (Tells a scheduler's events from the rest, and shows what a Warning said.)
    """
    counts: collections.Counter[str] = collections.Counter()
    warnings: dict[str, str] = {}
    for e in kit_json(api.list_namespaced_event(POD_NS, _preload_content=False)):
        who = e.get("reportingComponent") or (e.get("source") or {}).get("component") or "?"
        counts[f"{who} {e.get('reason')}"] += 1
        if e.get("type") == "Warning":
            warnings[e["metadata"]["uid"]] = f"{(e.get('involvedObject') or {}).get('name')}: {e.get('message')}"
    return counts, warnings


class WriteLog:
    """Who made which write: the API server's audit log (writes only, metadata, written before each reply).

    apiserver_request_total says how many writes, not whose: the log's user
    agent tells the scheduler's own writes from the controller-manager's, KWOK's
    and the benchmark's (the table's "of which the scheduler's own").
    """

    def __init__(self, work: Path) -> None:
        self.policy = work / "audit-policy.yaml"
        self.policy.write_text(AUDIT_POLICY)
        self.path = work / "audit.log"

    def apiserver_args(self) -> str:
        # never rotated (the API server's log writer rotates at 100 MB, and at 100 MB too when told 0): the
        # marks are offsets into one file; 10,000 pods log a few hundred MB
        return (f"--audit-policy-file={self.policy} --audit-log-path={self.path} --audit-log-maxbackup=0 "
                "--audit-log-maxsize=1000000")

    def mark(self) -> int:
        return self.path.stat().st_size if self.path.exists() else 0

    def since(self, start: int, end: int) -> collections.Counter[str]:
        """Writes logged between two marks, as "<client> <verb> <group/resource/subresource>"."""
        counts: collections.Counter[str] = collections.Counter()
        with open(self.path, "rb") as f:
            f.seek(start)
            for line in f.read(end - start).splitlines():
                e = json.loads(line)
                ref = e.get("objectRef") or {}
                what = (ref["apiGroup"] + "/" if ref.get("apiGroup") else "") + ref.get("resource", "?")
                if ref.get("subresource"):
                    what += "/" + ref["subresource"]
                counts[f"{client_of(e.get('userAgent') or '')} {e.get('verb')} {what}"] += 1
        return counts


def client_of(agent: str) -> str:
    """A request's client by its user agent (gpupool: the official Python client's own agent)."""
    name = agent.split("/", 1)[0]
    if name == "OpenAPI-Generator":
        return "gpupool"
    if name == BENCH_AGENT:
        return "bench"
    return name


def empty_claims(api: client.CoreV1Api, timeout: float = 300) -> float:
    """Wait until the controller-manager has deleted the claims of the deleted pods (asked again after 60 s)."""
    rapi = client.ResourceV1Api(api.api_client)
    t0 = time.perf_counter()
    deadline = time.monotonic() + timeout
    while rapi.list_namespaced_resource_claim(POD_NS, limit=1).items:
        if time.monotonic() > deadline:
            raise SystemExit(f"claims of {POD_NS} still there {timeout:.0f} s after their pods went")
        if time.perf_counter() - t0 > 60:
            try:
                rapi.delete_collection_namespaced_resource_claim(POD_NS, _preload_content=False)
            except ApiException as e:
                if e.status not in (500, 504):
                    raise
        time.sleep(0.5)
    return time.perf_counter() - t0


def run_arm(arm: str, api: client.CoreV1Api, kube: Path, work: Path, args: argparse.Namespace,
            tag: str, audit: WriteLog) -> dict[str, Any]:
    """Create P claimed pods for ``arm``'s scheduler, measure until the GPUs are full (or nothing binds), clean up."""
    serve = None
    if arm == "gpupool":
        serve = GpupoolServe(work, kube / "kubeconfig", tag)
        serve.ready(args.nodes)
        serve.client.set_project("bench", train_guarantee=args.nodes * GPUS_PER_NODE)
        scheduler = serve.proc.pid
    else:
        scheduler = kit.pid_of(kube, "kube-scheduler")
    try:
        watch = kit.BindWatch(api, POD_NS)
        watch.start()
        manifests = [pod_manifest(i, arm) for i in range(args.pods)]
        created: dict[str, float] = {}
        load = os.getloadavg()[0]
        events_before, warned_before = event_reasons(api)
        writes_before = kit.api_writes(api)
        audit_start = audit.mark()
        meter = kit.CpuMeter({"scheduler": [scheduler],
                              "server": [kit.pid_of(kube, "kube-apiserver"), kit.pid_of(kube, "etcd")],
                              "kcm": [kit.pid_of(kube, "kube-controller-manager")],
                              "kwok": [kit.pid_of(kube, "kwok")], "bench": [os.getpid()]})

        def create(m: dict[str, Any]) -> None:
            created[m["metadata"]["name"]] = time.perf_counter()
            api.create_namespaced_pod(POD_NS, body(m), _preload_content=False)

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
        by_client = audit.since(audit_start, audit.mark())
        watch.stop()
        rss, hwm = kit.rss_mib(scheduler)
        bound = [n for n in created if n in watch.bound]
        wrong = check_claims(api, set(bound))
        events, warned = event_reasons(api)
        events.subtract(events_before)
        warnings = [m for uid, m in warned.items() if uid not in warned_before]
        last = max((watch.bound[n] for n in bound), default=t0)
        lat = [watch.bound[n] - created[n] for n in bound]
        writes["create pods"] -= args.pods  # the benchmark's own
        writes = collections.Counter({k: v for k, v in writes.items() if v > 0})
        n = max(len(bound), 1)
        own = "gpupool" if arm == "gpupool" else "kube-scheduler"
        res = {"arm": arm, "created": args.pods, "bound": len(bound), "full": full, "wrong": wrong[:20],
                "wrong_n": len(wrong), "create_s": created_s, "fill_s": last - t0,
                "rate": len(bound) / max(last - t0, 1e-9), "p50": kit.pct(lat, 0.5), "p99": kit.pct(lat, 0.99),
                "writes": dict(sorted(writes.items())),
                "events": {k: v for k, v in sorted(events.items()) if v > 0},
                "warnings": warnings[:10], "by_client": dict(sorted(by_client.items())),
                "own_pod": sum(v for k, v in by_client.items() if k.split()[0] == own) / n, "writes_pod": sum(writes.values()) / n,
                "sched_cpu_pod": cpu["scheduler"] / n, "server_cpu_pod": cpu["server"] / n,
                "kcm_cpu_pod": cpu["kcm"] / n, "kwok_cpu_pod": cpu["kwok"] / n, "bench_cpu_pod": cpu["bench"] / n,
                "rss": rss, "hwm": hwm, "load": load}
        print(json.dumps({"tag": tag, **res}), flush=True)  # before the clean-up, which a loaded server may fail
        return res
    finally:
        if serve is not None:
            serve.stop()
        kit.empty_namespace(api, POD_NS)
        empty_claims(api)


# ---------------------------------------------------------------- the table
def report(results: list[dict[str, Any]], args: argparse.Namespace, made_s: float, sliced_s: float) -> None:
    print(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.node()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, load avg at the start of each arm in the table; "
          f"`bench/kube_bind_dra.py --nodes {args.nodes} --pods {args.pods} --rounds {args.rounds}`: "
          f"{args.nodes} KWOK nodes (made in {made_s:.0f} s) x {GPUS_PER_NODE} GPUs as ResourceSlices of "
          f"{DRIVER} (published in {sliced_s:.0f} s), {args.pods} pods each claiming one device from a "
          f"ResourceClaimTemplate, created by {args.creators} threads; {min(args.pods, args.nodes * GPUS_PER_NODE)} "
          "can bind\n")
    print("| round | arm | bound / created | claims wrong | binds/s | create->bound p50 / p99 | "
          "API writes per bound pod (the scheduler's own) | CPU ms per bound pod: scheduler / API server+etcd / controller-manager / "
          "KWOK / bench | scheduler RSS end (peak) | pods created in | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        print(f"| {r['round']} | {r['arm']} | {r['bound']} / {r['created']}{'' if r['full'] else ' (stalled)'} | "
              f"{r['wrong_n']} | {r['rate']:.0f} | {r['p50'] * 1000:.0f} / {r['p99'] * 1000:.0f} ms | "
              f"{r['writes_pod']:.2f} ({r['own_pod']:.2f}) | {r['sched_cpu_pod'] * 1000:.2f} / {r['server_cpu_pod'] * 1000:.2f} / "
              f"{r['kcm_cpu_pod'] * 1000:.2f} / {r['kwok_cpu_pod'] * 1000:.2f} / {r['bench_cpu_pod'] * 1000:.2f} | "
              f"{r['rss']:.0f} ({r['hwm']:.0f}) MiB | {r['create_s']:.1f} s | {r['load']:.1f} |")
    for r in results:
        if r["wrong"]:
            print(f"\nround {r['round']} {r['arm']}: {r['wrong_n']} claims wrong, e.g. {r['wrong'][:5]}")
        if r["warnings"]:
            print(f"\nround {r['round']} {r['arm']}: Warning events, e.g. {r['warnings'][:3]}")
    by = {a: [r for r in results if r["arm"] == a] for a in ARMS}
    if not all(by.values()):
        return
    kit.print_medians(by, (("rate", "binds/s", 1, ".0f"), ("fill_s", "first create -> last bound, s", 1, ".1f"),
                           ("p50", "create->bound p50, ms", 1000, ".0f"),
                           ("p99", "create->bound p99, ms", 1000, ".0f"),
                           ("writes_pod", "API writes per bound pod", 1, ".2f"),
                           ("own_pod", "of which the scheduler's own", 1, ".2f"),
                           ("sched_cpu_pod", "scheduler CPU per bound pod, ms", 1000, ".2f"),
                           ("server_cpu_pod", "API server + etcd CPU per bound pod, ms", 1000, ".2f"),
                           ("kcm_cpu_pod", "controller-manager CPU per bound pod, ms", 1000, ".2f"),
                           ("hwm", "scheduler peak RSS, MiB", 1, ".0f")))
    print("\nAPI writes per bound pod, by verb and resource (all rounds; the controller-manager's and KWOK's are in "
          "both arms):\n")
    kit.print_per_bound_pod(by, "writes", "write | kube-scheduler | gpupool")
    print("\nWho wrote them, per bound pod (the API server's audit log, by user agent):\n")
    kit.print_per_bound_pod(by, "by_client", "client, write | kube-scheduler arm | gpupool arm")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=200)
    ap.add_argument("--pods", type=int, default=1600)
    ap.add_argument("--rounds", type=int, default=2, help="runs of each arm (the order flips each round)")
    ap.add_argument("--creators", type=int, default=8, help="threads creating the pods")
    ap.add_argument("--only", choices=ARMS)
    ap.add_argument("--timeout", type=float, default=900, help="longest an arm may take, s")
    ap.add_argument("--settle", type=float, default=30, help="end an arm when no pod has bound for this long, s")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="kube-bind-dra-"))
    kube = work / "kube"
    try:
        audit = WriteLog(work)
        os.environ["GPUPOOL_KUBE_APISERVER_ARGS"] = " ".join(
            filter(None, (os.environ.get("GPUPOOL_KUBE_APISERVER_ARGS"), audit.apiserver_args())))
        kubeconfig = kit.start_cluster(kube, "kube-scheduler", "kwok")
        api_client = config.new_client_from_config(config_file=str(kubeconfig))
        api_client.user_agent = BENCH_AGENT
        api = client.CoreV1Api(api_client)
        for ns in (POD_NS, GPUPOOL_NS):
            api.create_namespace(body({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}))
        made = kit.make_kwok_nodes(api, args.nodes, device_plugin=False)
        sliced = publish_slices(api)
        client.ResourceV1Api(api.api_client).create_namespaced_resource_claim_template(
            POD_NS, body(claim_template()), _preload_content=False)
        print(f"{args.nodes} KWOK nodes Ready in {made:.1f} s, {args.nodes * GPUS_PER_NODE} GPUs published as "
              f"ResourceSlices in {sliced:.1f} s; cluster in {kube}", flush=True)
        arms = list(ARMS) if args.only is None else [args.only]
        results = []
        for r in range(args.rounds):
            for arm in (arms if r % 2 == 0 else arms[::-1]):
                res = run_arm(arm, api, kube, work, args, f"{arm}-{r}", audit)
                res["round"] = r
                results.append(res)
        report(results, args, made, sliced)
    finally:
        kit.stop_cluster(kube)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
