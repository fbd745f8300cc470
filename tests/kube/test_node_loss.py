"""A GPU node lost on a real cluster: its heartbeat stops, the node-lifecycle controller takes it for gone,
and a training job on it moves to another node and resumes there, nothing lost.

The cluster is this module's own (``scripts/kube/start`` with KWOK playing the
nodes' kubelets), started with a quick node-lifecycle controller
(``--node-monitor-grace-period``) so that a lost node is noticed in seconds
rather than the 50 s a real cluster waits. A node "dies" the way a machine
does as far as the API server can tell: KWOK stops managing it, so its
Lease is no longer renewed and nobody answers for its pods. KWOK here plays
the nodes labelled ``gpupool-test/kwok=on`` (a label selector, which its
watch applies on the API server: an annotation selector is matched only when
KWOK first sees a node, so removing the annotation would not stop it), and
the label's removal is the machine's death. It "comes back" when the label
returns: KWOK reports it Ready again and renews its Lease.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kube.cluster import pod_env, wait
from tests.kube.conftest import KUBE
from tests.kube.test_serve_cli import TOKEN, gpupool, serve

KWOK_LABEL = "gpupool-test/kwok"
# The node-lifecycle controller's grace before a silent node is NotReady/unreachable (50 s by default), and
# KWOK's Lease (renewed every quarter of it, as a kubelet does): short, so the test waits seconds, not minutes.
CONTROLLER_MANAGER_ARGS = "--node-monitor-grace-period=10s --node-monitor-period=1s"
KWOK_ARGS = f"--node-lease-duration-seconds=4 --manage-nodes-with-label-selector={KWOK_LABEL}=on"
RES = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8"}


@pytest.fixture(scope="module")
def quick_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """This module's own cluster (etcd, API server, controller-manager, KWOK) with a quick node-lifecycle
    controller; its kubeconfig."""
    d = tmp_path_factory.mktemp("kube-node-loss")
    env = {**os.environ, "GPUPOOL_KUBE_OWNER_PID": str(os.getpid()),
           "GPUPOOL_KUBE_CONTROLLER_MANAGER_ARGS": CONTROLLER_MANAGER_ARGS, "GPUPOOL_KUBE_KWOK_ARGS": KWOK_ARGS}
    env.pop("GPUPOOL_KUBE_WITH", None)
    r = subprocess.run([str(KUBE / "start"), str(d), "kwok"], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        pytest.fail(f"could not start the test cluster ({KUBE}/start):\n{r.stderr[-3000:]}", pytrace=False)
    try:
        yield d / "kubeconfig"
    finally:
        subprocess.run([str(KUBE / "stop"), str(d)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def make_kwok_gpu_node(core: Any, name: str) -> None:
    """A node KWOK plays (Ready, its Lease renewed), with 8 allocatable nvidia.com/gpu and GFD labels."""
    labels = {"kubernetes.io/hostname": name, "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB",
              "nvidia.com/gpu.memory": "81920", KWOK_LABEL: "on"}
    core.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name, "labels": labels}})
    core.patch_node_status(name, {"status": {"capacity": RES, "allocatable": RES}})
    core.patch_node(name, {"spec": {"taints": []}})  # the API server's admission added node.kubernetes.io/not-ready


def node_state(core: Any, name: str) -> tuple[str, set[str]]:
    """(its Ready condition's status, its taints as key:effect)."""
    n = core.read_node(name)
    ready = next((c.status for c in n.status.conditions or [] if c.type == "Ready"), "")
    return ready, {f"{t.key}:{t.effect}" for t in n.spec.taints or []}


def held_gpus(pool: dict[str, Any], job_id: str) -> list[str]:
    """The GPUs gpupool's books give to that job, anywhere in the pool."""
    return [g["id"] for n in pool["nodes"] for g in n["gpus"]
            if any(a["job_id"] == job_id for a in g.get("allocations") or [])]


def cli_lines(url: str, *args: str) -> list[str]:
    """What ``gpupool ARGS`` prints, line by line (as the admin)."""
    r = subprocess.run([sys.executable, "-m", "gpupool", *args], capture_output=True, text=True, timeout=60,
                       env={**os.environ, "GPUPOOL_URL": url, "GPUPOOL_TOKEN": TOKEN})
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


@pytest.fixture
def two_kwok_nodes(quick_cluster: Path) -> Iterator[tuple[Any, str, list[str]]]:
    """(a CoreV1Api, a fresh namespace, two Ready KWOK GPU nodes named after it); the nodes deleted after the test
    (gpupool's pool is every GPU node of the cluster)."""
    from kubernetes import client, config

    core = client.CoreV1Api(config.new_client_from_config(config_file=str(quick_cluster)))
    namespace = f"t-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    nodes = [f"{namespace}-a", f"{namespace}-b"]
    for n in nodes:
        make_kwok_gpu_node(core, n)
    wait(lambda: all(node_state(core, n) == ("True", set()) for n in nodes), timeout=30,
         what="both KWOK nodes Ready and untainted")
    yield core, namespace, nodes
    for n in nodes:
        core.delete_node(n)


def submit_whole_node_job(url: str) -> tuple[dict[str, Any], str]:
    """Once both nodes are in gpupool's pool: project vision's 8-GPU job (a whole node); (the job, its pod)."""
    wait(lambda: len(gpupool(url, "status")["pool"]["nodes"]) == 2, what="both nodes in gpupool status")
    gpupool(url, "projects", "set", "vision", "--guarantee", "8")
    job = gpupool(url, "submit", "--project", "vision", "--gpus", "8", "--", "python", "train.py")
    return job, f"gpupool-{job['id']}-1"


def test_a_lost_node_is_taken_out_and_its_job_resumes_on_another_node(
        quick_cluster: Path, two_kwok_nodes: tuple[Any, str, list[str]], tmp_path: Path) -> None:
    core, namespace, nodes = two_kwok_nodes
    proc, url = serve(tmp_path, "--backend", "kubernetes", "--kubeconfig", str(quick_cluster),
                      "--namespace", namespace)
    try:
        job, first = submit_whole_node_job(url)
        # KWOK plays the kubelet: the bound pod goes Running, and gpupool shows the job running there
        running = wait(lambda: (j := gpupool(url, "describe", job["id"]))["state"] == "running" and j,
                       timeout=30, what="the job running on a KWOK node")
        lost = running["assignment"]["node"]
        other = next(n for n in nodes if n != lost)
        wait(lambda: core.read_namespaced_pod(first, namespace).status.phase == "Running", timeout=20,
             what="KWOK running the job's pod")

        # the machine dies: nobody renews its Lease any more
        core.patch_node(lost, {"metadata": {"labels": {KWOK_LABEL: None}}})
        stopped_at = time.monotonic()
        # the node-lifecycle controller marks it unreachable and taints it (NoSchedule and NoExecute)
        ready, taints = wait(lambda: (s := node_state(core, lost))[0] == "Unknown"
                             and "node.kubernetes.io/unreachable:NoExecute" in s[1] and s, timeout=45,
                             what="the node-lifecycle controller taking the node for lost")
        assert "node.kubernetes.io/unreachable:NoSchedule" in taints
        # gpupool takes it out of the pool and says why
        out = wait(lambda: (s := gpupool(url, "status"))["backend"]["nodes_out"].get(lost) and s, timeout=20,
                   what="the lost node out of gpupool's pool")
        why = "unreachable (its kubelet stopped posting status)"
        assert out["backend"]["nodes_out"] == {lost: why}
        assert any(f"{lost} ({why})" in line for line in cli_lines(url, "status"))

        # the job moves: its pod on the lost node is removed for good (no kubelet will confirm its end), the job
        # is requeued and runs again on the other node as attempt 2, told to resume from its checkpoint
        second = f"gpupool-{job['id']}-2"
        moved = wait(lambda: (j := gpupool(url, "describe", job["id"]))["state"] == "running"
                     and j["attempts"] == 2 and j, timeout=45, what="the job running again as attempt 2")
        assert moved["assignment"]["node"] == other
        print(f"\nheartbeat stopped -> attempt 2 running elsewhere: {time.monotonic() - stopped_at:.1f} s "
              f"(grace {CONTROLLER_MANAGER_ARGS}, pause_grace_s 2)")
        pod = core.read_namespaced_pod(second, namespace)
        assert pod.spec.node_name == other and pod_env(pod)["GPUPOOL_RESUME"] == "1"
        wait(lambda: core.read_namespaced_pod(second, namespace).status.phase == "Running", timeout=20,
             what="KWOK running the resumed pod")
        names = [p.metadata.name for p in core.list_namespaced_pod(namespace).items]
        assert first not in names, names
        events = [e for e in cli_lines(url, "events", "--json") if job["id"] in e]
        assert any(f"node {lost} left the pool (cordoned, not ready or deleted); requeued" in e for e in events), events
        # its GPUs on the lost node are freed in gpupool's books: the job holds its 8 GPUs on the other node only
        held = held_gpus(gpupool(url, "status")["pool"], job["id"])
        assert len(held) == 8 and all(g.startswith(f"{other}/") for g in held), held

        # the machine comes back: KWOK renews its Lease again, the controller lifts its taints, gpupool uses it
        core.patch_node(lost, {"metadata": {"labels": {KWOK_LABEL: "on"}}})
        wait(lambda: node_state(core, lost) == ("True", set()), timeout=45, what="the node Ready and untainted")
        status = wait(lambda: (s := gpupool(url, "status")) and not s["backend"]["nodes_out"] and s, timeout=20,
                      what="the node back in gpupool's pool")
        back_node = next(n for n in status["pool"]["nodes"] if n["name"] == lost)
        assert len(back_node["gpus"]) == 8 and all(g["allocated"] == 0 for g in back_node["gpus"]), back_node
        again = gpupool(url, "submit", "--project", "vision", "--gpus", "8", "--", "python", "eval.py")
        back = wait(lambda: (j := gpupool(url, "describe", again["id"]))["state"] == "running" and j, timeout=30,
                    what="a new job placed on the node that came back")
        assert back["assignment"]["node"] == lost
        assert gpupool(url, "describe", job["id"])["state"] == "running"
    finally:
        proc.terminate()
        proc.wait(20)
    assert proc.returncode == 0


def test_a_dead_node_an_admin_cordons_is_still_lost_and_its_job_moves(
        quick_cluster: Path, two_kwok_nodes: tuple[Any, str, list[str]], tmp_path: Path) -> None:
    """An admin's first move on a dead machine is often a cordon (``kubectl cordon``/``drain``): gpupool then
    sees "cordoned" first, yet no kubelet will end the pod there, so it must still delete it for good."""
    core, namespace, nodes = two_kwok_nodes
    proc, url = serve(tmp_path, "--backend", "kubernetes", "--kubeconfig", str(quick_cluster),
                      "--namespace", namespace)
    try:
        job, first = submit_whole_node_job(url)
        wait(lambda: gpupool(url, "describe", job["id"])["state"] == "running", timeout=30,
             what="the job running on a KWOK node")  # its pod made and bound (reading it earlier: a 404)
        wait(lambda: core.read_namespaced_pod(first, namespace).status.phase == "Running", timeout=30,
             what="KWOK running the job's pod")
        dead = core.read_namespaced_pod(first, namespace).spec.node_name
        other = next(n for n in nodes if n != dead)
        # the machine dies and the admin cordons it at once: gpupool stops the job for the cordon
        core.patch_node(dead, {"metadata": {"labels": {KWOK_LABEL: None}}, "spec": {"unschedulable": True}})
        out = wait(lambda: gpupool(url, "status")["backend"]["nodes_out"].get(dead), timeout=20,
                   what="the cordoned node out of gpupool's pool")
        assert out == "cordoned"
        # its pod outlives the grace (no kubelet answers); once the controller finds the node unreachable, gpupool
        # deletes the pod for good and the job runs again on the other node
        moved = wait(lambda: (j := gpupool(url, "describe", job["id"]))["state"] == "running"
                     and j["attempts"] == 2 and j, timeout=45, what="the job running again as attempt 2")
        assert moved["assignment"]["node"] == other
        assert node_state(core, dead)[0] == "Unknown"
        assert first not in [p.metadata.name for p in core.list_namespaced_pod(namespace).items]
        held = held_gpus(gpupool(url, "status")["pool"], job["id"])
        assert len(held) == 8 and all(g.startswith(f"{other}/") for g in held), held
    finally:
        proc.terminate()
        proc.wait(20)
    assert proc.returncode == 0
