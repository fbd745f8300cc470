"""The test cluster itself (scripts/kube): what its controllers, KWOK, kube-scheduler and JobSet do.

The other tests in tests/kube rely on these behaviours of a real cluster;
this module starts its own one with every optional component (its node
monitor grace shortened to 12 s so a lost node shows within the test) and
checks each as a cluster admin would see it.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client, config
from kubernetes.client.rest import ApiException

from tests.kube.cluster import make_gpu_node, wait
from tests.kube.conftest import KUBE

GRACE_S = 12


@pytest.fixture(scope="module")
def full(tmp_path_factory: pytest.TempPathFactory) -> Iterator[client.ApiClient]:
    """A cluster of its own with kube-scheduler, KWOK and JobSet; its API client (admin)."""
    if not (KUBE / "start").exists():
        pytest.skip(f"no Kubernetes test kit at {KUBE}")
    if (KUBE / "setup").exists() and "kwok" not in (KUBE / "setup").read_text():
        pytest.skip(f"the kit at {KUBE} has no KWOK, kube-scheduler or JobSet")
    d = tmp_path_factory.mktemp("full-cluster")
    env = dict(os.environ,
               GPUPOOL_KUBE_CONTROLLER_MANAGER_ARGS=f"--node-monitor-grace-period={GRACE_S}s --node-monitor-period=1s",
               GPUPOOL_KUBE_KWOK_ARGS="--node-lease-duration-seconds=8", GPUPOOL_KUBE_OWNER_PID=str(os.getpid()))
    r = subprocess.run([str(KUBE / "start"), str(d), "kube-scheduler", "kwok", "jobset"],
                       capture_output=True, text=True, env=env)
    if r.returncode != 0:
        pytest.fail(f"could not start the full test cluster:\n{r.stderr[-3000:]}", pytrace=False)
    try:
        yield config.new_client_from_config(config_file=str(d / "kubeconfig"))
    finally:
        subprocess.run([str(KUBE / "stop"), str(d)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.fixture
def ns(full: client.ApiClient) -> str:
    name = f"c-{uuid.uuid4().hex[:8]}"
    client.CoreV1Api(full).create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return name


def kwok_node(core: client.CoreV1Api, name: str, gpus: int = 8) -> None:
    """A node whose kubelet KWOK plays: it posts the node Ready and renews its Lease."""
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": name, "annotations": {"kwok.x-k8s.io/node": "fake"}, "labels": {"type": "kwok"}},
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)},
                   "capacity": {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}}})


def ready(node: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])


def pod(name: str, gpus: int = 1, **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"containers": [{"name": "c", "image": "cuda:12",
                                     "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}], **spec}}


def test_the_cluster_is_current_and_serves_the_apis_gpupool_will_need(full: client.ApiClient) -> None:
    assert client.VersionApi(full).get_code().git_version.startswith("v1.37.")
    groups = {g.name: [v.version for v in g.versions] for g in client.ApisApi(full).get_api_versions().groups}
    assert "v1" in groups["resource.k8s.io"]  # Dynamic Resource Allocation, GA
    assert "v1beta1" in groups["scheduling.k8s.io"]  # the Workload API
    assert "v1" in groups["batch"] and "v1alpha2" in groups["jobset.x-k8s.io"]
    assert "v1" in groups["policy"]
    custom = client.CustomObjectsApi(full)
    assert custom.list_cluster_custom_object("resource.k8s.io", "v1", "deviceclasses")["items"] == []
    assert custom.list_cluster_custom_object("scheduling.k8s.io", "v1beta1", "workloads")["items"] == []


def test_kube_scheduler_binds_a_pod_to_a_kwok_node_and_kwok_runs_it(full: client.ApiClient, ns: str) -> None:
    core = client.CoreV1Api(full)
    node = f"{ns}-kwok"
    kwok_node(core, node)
    wait(lambda: ready(core.read_node(node)), 30, "KWOK to post the node Ready")
    core.create_namespaced_pod(ns, pod("p", gpus=2))
    p = wait(lambda: (x := core.read_namespaced_pod("p", ns)).status.phase == "Running" and x, 30,
             "the pod bound and running")
    assert p.spec.node_name == node
    lease = client.CoordinationV1Api(full).read_namespaced_lease(node, "kube-node-lease")
    age = dt.datetime.now(dt.timezone.utc) - lease.spec.renew_time
    assert age < dt.timedelta(seconds=30), f"KWOK's heartbeat: the node's Lease renewed {age} ago"
    core.create_namespaced_pod(ns, pod("too-big", gpus=9))
    wait(lambda: any(e.reason == "FailedScheduling" for e in core.list_namespaced_event(
        ns, field_selector="involvedObject.name=too-big").items), 30, "kube-scheduler to say why not")
    core.delete_node(node)


def test_the_job_controller_runs_a_job_and_the_garbage_collector_deletes_its_pods(
        full: client.ApiClient, ns: str) -> None:
    core, batch = client.CoreV1Api(full), client.BatchV1Api(full)
    node = f"{ns}-kwok"
    kwok_node(core, node)
    batch.create_namespaced_job(ns, {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "train"},
                                     "spec": {"completions": 2, "parallelism": 2, "template": {"spec": {
                                         "restartPolicy": "Never", **pod("x")["spec"]}}}})
    done = wait(lambda: (j := batch.read_namespaced_job("train", ns)).status.succeeded == 2 and j, 60,
                "the Job's two pods to run and succeed")
    assert any(c.type == "Complete" and c.status == "True" for c in done.status.conditions)
    assert len(core.list_namespaced_pod(ns, label_selector="job-name=train").items) == 2
    batch.delete_namespaced_job("train", ns, propagation_policy="Background")
    wait(lambda: not core.list_namespaced_pod(ns, label_selector="job-name=train").items, 30,
         "the garbage collector to delete the Job's pods")
    core.delete_node(node)


def test_a_deleted_namespace_goes_away_with_what_it_held(full: client.ApiClient, ns: str) -> None:
    core = client.CoreV1Api(full)
    core.create_namespaced_config_map(ns, {"metadata": {"name": "cm"}, "data": {"a": "b"}})
    core.create_namespaced_pod(ns, pod("unbound", gpus=0, schedulerName="nobody"))
    core.delete_namespace(ns)

    def gone() -> bool:
        try:
            core.read_namespace(ns)
            return False
        except ApiException as e:
            return e.status == 404
    wait(gone, 60, "the namespace controller to empty and delete the namespace")


def test_a_node_whose_heartbeat_stops_is_tainted_and_its_pods_evicted_while_beaten_nodes_stay(
        full: client.ApiClient, ns: str) -> None:
    core = client.CoreV1Api(full)
    kept, lost = f"{ns}-kept", f"{ns}-lost"
    make_gpu_node(core, kept, 8)  # the tests' stand-in kubelet renews its Lease
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": lost}})
    t = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    core.patch_node_status(lost, {"status": {"conditions": [{
        "type": "Ready", "status": "True", "reason": "KubeletReady", "message": "once",
        "lastHeartbeatTime": t, "lastTransitionTime": t}]}})
    core.create_namespaced_pod(ns, pod("on-lost", gpus=0, nodeName=lost, tolerations=[{
        "key": "node.kubernetes.io/unreachable", "operator": "Exists", "effect": "NoExecute",
        "tolerationSeconds": 1}]))
    wait(lambda: "node.kubernetes.io/unreachable" in {x.key for x in core.read_node(lost).spec.taints or []},
         GRACE_S * 4, "the node-lifecycle controller to taint the silent node unreachable")
    assert not any(c.status == "True" for c in core.read_node(lost).status.conditions if c.type == "Ready")
    wait(lambda: core.read_namespaced_pod("on-lost", ns).metadata.deletion_timestamp, 30,
         "the silent node's pod to be evicted")
    node = core.read_node(kept)
    assert ready(node) and not node.spec.taints, "a node with a heartbeat stays Ready and untainted"
    core.delete_node(lost)
    core.delete_node(kept)


def test_the_jobset_controller_makes_one_job_per_replica(full: client.ApiClient, ns: str) -> None:
    core, batch, custom = client.CoreV1Api(full), client.BatchV1Api(full), client.CustomObjectsApi(full)
    node = f"{ns}-kwok"
    kwok_node(core, node)
    job = {"parallelism": 1, "completions": 1,
           "template": {"spec": {"restartPolicy": "Never", **pod("x")["spec"]}}}
    custom.create_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns, "jobsets", {
        "apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet", "metadata": {"name": "gang"},
        "spec": {"replicatedJobs": [{"name": "workers", "replicas": 2, "template": {"spec": job}}]}})
    jobs = wait(lambda: len(x := batch.list_namespaced_job(ns).items) == 2 and x, 60, "JobSet to create 2 Jobs")
    assert sorted(j.metadata.name for j in jobs) == ["gang-workers-0", "gang-workers-1"]

    def completed() -> bool:
        js = custom.get_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns, "jobsets", "gang")
        return any(c["type"] == "Completed" and c["status"] == "True"
                   for c in js.get("status", {}).get("conditions", []))
    wait(completed, 60, "the JobSet to complete once its Jobs did")
    core.delete_node(node)
