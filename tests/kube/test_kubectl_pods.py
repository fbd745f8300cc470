"""Pods users create with kubectl (schedulerName: gpupool): queued as their project's jobs, bound, evicted, ended."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest

from gpupool.app.backend import build_core
from gpupool.cli.tables import jobs_table
from gpupool.service.actor import Actor
from gpupool.service.core import SchedulerCore
from gpupool.wire.errors import Conflict
from tests.kube.cluster import Kubelet
from tests.kube.conftest import kube_config
from tests.service.helpers import wait_for

ADMIN = Actor("admin", True)


def kubectl_pod(api: Any, ns: str, name: str, *, project: str | None = "vision", annotations: dict[str, str] | None = None,
                gpus: int = 0, env_from: bool = True, labels: dict[str, str] | None = None) -> Any:
    """What ``kubectl apply`` of a user's pod for gpupool creates."""
    container: dict[str, Any] = {"name": "main", "image": "registry.example/train:1", "command": ["python", "train.py"]}
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    if env_from:
        container["envFrom"] = [{"configMapRef": {"name": f"gpupool-{name}"}}]
    all_labels = dict(labels or {})
    if project is not None:
        all_labels["gpupool.io/project"] = project
    return api.create_namespaced_pod(ns, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": all_labels, "annotations": annotations or {}},
        "spec": {"schedulerName": "gpupool", "restartPolicy": "Never", "containers": [container]},
    })


def pod_events(api: Any, ns: str, name: str) -> list[Any]:
    return [e for e in api.list_namespaced_event(ns).items if e.involved_object.name == name]


def jobs_of(core: SchedulerCore, ns: str, name: str) -> list[dict[str, Any]]:
    return [j for j in core.list_jobs(ADMIN) if j["labels"].get("gpupool.io/pod") == f"{ns}/{name}"]


async def test_a_quarter_gpu_kubectl_pod_is_bound_with_its_gpu_in_its_configmap(api: Any, namespace: str,
                                                                                gpu_nodes: Any,
                                                                                make_core: Any) -> None:
    nodes = gpu_nodes(3, gpus=8)
    core = await make_core()
    await wait_for(lambda: len(core.pool()["nodes"]) == 3, what="3 nodes in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 8})
    with Kubelet(api, namespace) as kubelet:
        pod = kubectl_pod(api, namespace, "notebook-train", annotations={"gpupool.io/gpu-fraction": "0.25"})
        bound = await wait_for(lambda: (p := api.read_namespaced_pod("notebook-train", namespace)).spec.node_name
                               and p, what="the pod bound")
        assert bound.spec.node_name in nodes
        cm = api.read_namespaced_config_map("gpupool-notebook-train", namespace)
        assert [(o.kind, o.name, o.uid) for o in cm.metadata.owner_references] == [
            ("Pod", "notebook-train", pod.metadata.uid)]  # goes when the pod goes
        (job,) = jobs_of(core, namespace, "notebook-train")
        assert (job["project"], job["kind"], job["state"], job["user"]) == ("vision", "train", "running",
                                                                            f"kubectl:{namespace}")
        assert job["request"]["gpu_fraction"] == 0.25
        (row,) = [line for line in jobs_table(core.list_jobs(ADMIN)).splitlines() if job["id"] in line]  # gpupool jobs
        assert row.split()[1:6] == ["notebook-train", "vision", f"kubectl:{namespace}", "train", "running"], row
        (share,) = job["assignment"]["gpus"]
        assert job["assignment"]["node"] == bound.spec.node_name and share["milli"] == 250
        assert cm.data["CUDA_VISIBLE_DEVICES"] == "0"  # one GPU, as the container sees it
        assert cm.data["NVIDIA_VISIBLE_DEVICES"] == str(share["index"])
        assert cm.data["GPUPOOL_GPU_FRACTION"] == "0.25" and cm.data["GPUPOOL_JOB_ID"] == job["id"]
        (scheduled,) = await wait_for(lambda: [e for e in pod_events(api, namespace, "notebook-train")
                                               if e.reason == "Scheduled"], what="the pod's Scheduled event")
        assert f"as job {job['id']}" in scheduled.message and bound.spec.node_name in scheduled.message
        assert not [e for e in pod_events(api, namespace, "notebook-train") if e.reason == "GpupoolNoGpuEnv"]
        # The pod's own end (its kubelet sets Succeeded) finishes the job; the pod stays, it is the user's.
        await wait_for(lambda: "notebook-train" in kubelet.started, what="the pod running")
        kubelet.finish("notebook-train", 0)
        done = await wait_for(lambda: (j := core.get_job(ADMIN, job["id"]))["state"] != "running" and j,
                              what="the job settled")
    assert (done["state"], done["exit_code"]) == ("succeeded", 0)
    assert api.read_namespaced_pod("notebook-train", namespace).status.phase == "Succeeded"


async def test_a_whole_gpu_pod_and_one_without_its_configmap(api: Any, namespace: str, gpu_nodes: Any,
                                                             make_core: Any) -> None:
    gpu_nodes(1, gpus=8)
    core = await make_core()
    await wait_for(lambda: core.pool()["nodes"], what="the node in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 8})
    kubectl_pod(api, namespace, "two-gpus", gpus=2, labels={"gpupool.io/user": "alice"})
    kubectl_pod(api, namespace, "no-env", annotations={"gpupool.io/gpu-memory": "20Gi"}, env_from=False)
    await wait_for(lambda: all(api.read_namespaced_pod(n, namespace).spec.node_name for n in ("two-gpus", "no-env")),
                   what="both pods bound")
    (two,) = jobs_of(core, namespace, "two-gpus")
    assert two["request"]["gpus"] == 2 and two["user"] == "alice" and two["state"] == "running"
    cm = api.read_namespaced_config_map("gpupool-two-gpus", namespace)
    assert cm.data["CUDA_VISIBLE_DEVICES"] == "0,1"
    assert cm.data["NVIDIA_VISIBLE_DEVICES"] == ",".join(str(g["index"]) for g in two["assignment"]["gpus"])
    (mem,) = jobs_of(core, namespace, "no-env")
    assert mem["request"]["gpu_memory"] == 20 * 1024 ** 3
    warned = await wait_for(lambda: [e for e in pod_events(api, namespace, "no-env") if e.reason == "GpupoolNoGpuEnv"],
                            what="the warning on the pod without envFrom")
    assert warned[0].type == "Warning" and "will see every GPU" in warned[0].message
    assert not [e for e in pod_events(api, namespace, "two-gpus") if e.reason == "GpupoolNoGpuEnv"]


async def test_a_new_pod_is_queued_and_bound_as_its_watch_sees_it_not_at_the_next_poll(api: Any, namespace: str,
                                                                                        gpu_nodes: Any,
                                                                                        make_core: Any) -> None:
    """The monitor polls every 30 s here: only the watch's wake can have the pods bound within seconds."""
    gpu_nodes(1, gpus=8)
    core = await make_core(poll_s=30.0)
    await wait_for(lambda: core.pool()["nodes"], what="the node in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 8})
    await asyncio.sleep(0.5)  # past the monitor's first look: what follows waits on the wake alone
    for i in range(3):
        kubectl_pod(api, namespace, f"woken-{i}", gpus=1, env_from=False)
    await wait_for(lambda: all(api.read_namespaced_pod(f"woken-{i}", namespace).spec.node_name for i in range(3)),
                   timeout=10.0, what="the three pods bound well before the next poll")
    assert sorted(j["state"] for i in range(3) for j in jobs_of(core, namespace, f"woken-{i}")) == ["running"] * 3


async def test_a_pod_without_a_known_project_is_told_why_and_queued_once_the_project_exists(
        api: Any, namespace: str, gpu_nodes: Any, make_core: Any) -> None:
    gpu_nodes(1, gpus=8)
    core = await make_core()
    await wait_for(lambda: core.pool()["nodes"], what="the node in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 8})
    kubectl_pod(api, namespace, "no-label", project=None, annotations={"gpupool.io/gpu-fraction": "0.5"})
    kubectl_pod(api, namespace, "ghost-pod", project="ghost", annotations={"gpupool.io/gpu-fraction": "0.5"})
    kubectl_pod(api, namespace, "bad-fraction", annotations={"gpupool.io/gpu-fraction": "a quarter"})
    for name, says in (("no-label", "it has no label gpupool.io/project"), ("ghost-pod", "unknown project 'ghost'"),
                       ("bad-fraction", "gpupool.io/gpu-fraction='a quarter' is not a number")):
        (ev,) = await wait_for(lambda n=name: [e for e in pod_events(api, namespace, n)
                                               if e.reason == "GpupoolNotQueued"], what=f"{name} told why")
        assert ev.type == "Warning" and says in ev.message, ev.message
        assert not jobs_of(core, namespace, name)
        assert not api.read_namespaced_pod(name, namespace).spec.node_name
    core.set_project(ADMIN, "ghost", {"train_guarantee": 1})  # the pod is checked again
    await wait_for(lambda: api.read_namespaced_pod("ghost-pod", namespace).spec.node_name, what="ghost-pod bound")
    assert [j["project"] for j in jobs_of(core, namespace, "ghost-pod")] == ["ghost"]
    assert len([e for e in pod_events(api, namespace, "no-label") if e.reason == "GpupoolNotQueued"]) == 1  # once
    assert not jobs_of(core, namespace, "no-label")


async def test_reclaim_evicts_a_kubectl_pod_says_so_on_the_pod_and_cancels_its_job(api: Any, namespace: str,
                                                                                   gpu_nodes: Any,
                                                                                   make_core: Any) -> None:
    gpu_nodes(1, gpus=8)
    core = await make_core()
    await wait_for(lambda: core.pool()["nodes"], what="the node in the pool")
    core.set_project(ADMIN, "scrappy", {"train_guarantee": 0})
    core.set_project(ADMIN, "owner", {"train_guarantee": 8})
    with Kubelet(api, namespace, stop_exit_code=0) as kubelet:
        kubectl_pod(api, namespace, "big", project="scrappy", gpus=8)
        await wait_for(lambda: "big" in kubelet.started, what="the over-quota pod running")
        (victim,) = jobs_of(core, namespace, "big")
        claim, _ = await core.submit(ADMIN, {"project": "owner", "gpus": 4, "command": ["python", "train.py"]})
        await wait_for(lambda: "big" in kubelet.stopped, what="the kubectl pod evicted")
        done = await wait_for(lambda: (j := core.get_job(ADMIN, victim["id"]))["state"] != "running" and j,
                              what="its job settled")
        assert done["state"] == "cancelled"
        assert done["reason"].startswith("evicted to give GPUs back to project owner")
        assert done["reason"].endswith("its owner (a Job, a Deployment) may recreate it, which queues it again")
        (ev,) = [e for e in pod_events(api, namespace, "big") if e.reason == "GpupoolPreempted"]
        assert "project owner" in ev.message and ev.type == "Warning"
        await wait_for(lambda: f"gpupool-{claim['id']}-1" in kubelet.started, what="the owner's pod running")
    assert "big" not in {p.metadata.name for p in api.list_namespaced_pod(namespace).items}  # never recreated
    assert [j["state"] for j in jobs_of(core, namespace, "big")] == ["cancelled"]


async def test_a_restart_queues_no_pod_twice_and_cancel_and_delete_end_pod_jobs(api: Any, namespace: str,
                                                                               gpu_nodes: Any,
                                                                               make_core: Any) -> None:
    gpu_nodes(1, gpus=8)
    core = await make_core()
    await wait_for(lambda: core.pool()["nodes"], what="the node in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 8})
    with Kubelet(api, namespace) as kubelet:
        kubectl_pod(api, namespace, "whole", gpus=8)
        await wait_for(lambda: "whole" in kubelet.started, what="the 8-GPU pod running")
        kubectl_pod(api, namespace, "waits", annotations={"gpupool.io/gpu-fraction": "0.5"})
        await wait_for(lambda: jobs_of(core, namespace, "waits"), what="the second pod queued")
        with pytest.raises(Conflict, match="did not create"):
            await core.pause(ADMIN, jobs_of(core, namespace, "whole")[0]["id"])
        await core.stop()

        core = await make_core()
        await wait_for(lambda: core.pool()["nodes"], what="the node in the pool again")
        (whole,) = jobs_of(core, namespace, "whole")
        (waits,) = jobs_of(core, namespace, "waits")
        assert (whole["state"], whole["attempts"], waits["state"]) == ("running", 1, "queued")
        assert len(core.list_jobs(ADMIN)) == 2 and kubelet.started == ["whole"]
        # Deleted by its user while running: the job is cancelled, not requeued, and nothing is recreated.
        api.delete_namespaced_pod("whole", namespace)
        gone = await wait_for(lambda: (j := core.get_job(ADMIN, whole["id"]))["state"] != "running" and j,
                              what="the deleted pod's job settled")
        assert gone["state"] == "cancelled" and "was deleted, not by gpupool" in gone["reason"]
        await wait_for(lambda: "waits" in kubelet.started, what="the waiting pod bound once GPUs are free")
        await core.cancel(ADMIN, waits["id"])  # gpupool cancel deletes the pod
        await wait_for(lambda: not api.list_namespaced_pod(namespace).items, what="the cancelled job's pod deleted")
        assert core.get_job(ADMIN, waits["id"])["state"] == "cancelled"
        assert len(core.list_jobs(ADMIN)) == 2


async def test_a_build_share_pod_holds_its_share_until_it_ends(api: Any, namespace: str, gpu_nodes: Any,
                                                               make_core: Any) -> None:
    """A user server (KubeSpawner) holding a build share: build quota, no lease to renew, never paused."""
    gpu_nodes(1, gpus=4)
    core = await make_core(lease_s=1.0)
    await wait_for(lambda: core.pool()["nodes"], what="the node in the pool")
    core.set_project(ADMIN, "vision", {"build_quota": 1, "train_guarantee": 0})
    with Kubelet(api, namespace) as kubelet:
        kubectl_pod(api, namespace, "jupyter-alice", labels={"gpupool.io/user": "alice"},
                    annotations={"gpupool.io/kind": "build", "gpupool.io/gpu-fraction": "0.5"})
        await wait_for(lambda: "jupyter-alice" in kubelet.started, what="the user server running")
        (job,) = jobs_of(core, namespace, "jupyter-alice")
        assert (job["kind"], job["state"], job["user"], job["lease_expires_at"]) == ("build", "running", "alice", None)
        cm = api.read_namespaced_config_map("gpupool-jupyter-alice", namespace)
        assert cm.data["GPUPOOL_GPU_FRACTION"] == "0.5"
        await asyncio.sleep(1.5)  # ticks run past the 1 s lease a submitted share would have had to renew
        assert core.get_job(ADMIN, job["id"])["state"] == "running"
        assert core.list_projects()[0]["usage"]["build"] == 0.5
        kubelet.finish("jupyter-alice", 0)
        done = await wait_for(lambda: (j := core.get_job(ADMIN, job["id"]))["state"] != "running" and j,
                              what="the share released with its pod")
    assert done["state"] == "succeeded"


async def test_the_deploy_rbac_is_enough_for_kubectl_pods_and_other_schedulers_pods(api: Any, gpu_nodes: Any,
                                                                                   make_account_core: Any) -> None:
    """As the ServiceAccount of deploy/kubernetes/rbac.yaml: watch every namespace's pods, write the ConfigMap,
    bind a kubectl pod, record events; the backend reports no failing call."""
    (node,) = gpu_nodes(1, gpus=8)
    other_ns = f"o-{uuid.uuid4().hex[:8]}"
    api.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": other_ns}})
    api.create_namespaced_pod(other_ns, {"metadata": {"name": "placed"}, "spec": {"nodeName": node, "containers": [
        {"name": "c", "image": "cuda:12", "resources": {"limits": {"nvidia.com/gpu": "4"}}}]}})
    name = f"sa-{uuid.uuid4().hex[:6]}"
    core = await make_account_core()
    await wait_for(lambda: core.pool()["nodes"], what="nodes listed with the service account")
    core.set_project(ADMIN, "vision", {"train_guarantee": 4})
    kubectl_pod(api, "gpupool", name, annotations={"gpupool.io/gpu-fraction": "0.25"})
    await wait_for(lambda: api.read_namespaced_pod(name, "gpupool").spec.node_name, what="bound as the SA")
    assert api.read_namespaced_config_map(f"gpupool-{name}", "gpupool").data["GPUPOOL_GPU_FRACTION"] == "0.25"
    await wait_for(lambda: "Scheduled" in {e.reason for e in pod_events(api, "gpupool", name)},
                   what="the pod's event, recorded by the service account")
    held = [a for n in core.pool()["nodes"] for g in n["gpus"] for a in g["allocations"] if a["kind"] == "other"]
    assert len(held) == 4
    assert core.status(ADMIN)["backend"]["ok"] is True, core.status(ADMIN)["backend"]


async def test_a_refused_start_leaves_the_pod_pending_and_says_why(api: Any, namespace: str, gpu_nodes: Any,
                                                                   kubeconfig: Path, tmp_path: Path) -> None:
    """The scheduler's account may not write ConfigMaps: nothing is bound without its GPU environment."""
    from kubernetes import client, config

    from tests.kube.cluster import wait

    gpu_nodes(1, gpus=8)
    rbac = client.RbacAuthorizationV1Api(api.api_client)

    def grant(name: str, rules: list[dict[str, Any]], cluster: bool = False) -> None:
        ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole" if cluster else "Role", "name": name}
        subjects = [{"kind": "User", "name": "limited", "apiGroup": "rbac.authorization.k8s.io"}]
        if cluster:
            rbac.create_cluster_role({"metadata": {"name": name}, "rules": rules})
            rbac.create_cluster_role_binding({"metadata": {"name": name}, "roleRef": ref, "subjects": subjects})
        else:
            rbac.create_namespaced_role(namespace, {"metadata": {"name": name}, "rules": rules})
            rbac.create_namespaced_role_binding(namespace, {"metadata": {"name": name}, "roleRef": ref,
                                                            "subjects": subjects})

    grant("no-configmaps", [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "watch", "delete"]},
        {"apiGroups": [""], "resources": ["pods/binding", "events"], "verbs": ["create"]}])
    cluster_role = f"{namespace}-read"
    grant(cluster_role, [{"apiGroups": [""], "resources": ["nodes", "pods"], "verbs": ["list", "watch"]}], True)
    limited = tmp_path / "limited.kubeconfig"
    limited.write_text(kubeconfig.read_text().replace("current-context: admin", "current-context: limited"))
    as_limited = client.CoreV1Api(config.new_client_from_config(config_file=str(limited)))

    def may(fn: Any) -> bool:  # the API server's RBAC cache takes a moment to see new roles
        try:
            fn()
        except client.ApiException:
            return False
        return True

    wait(lambda: may(lambda: as_limited.list_namespaced_pod(namespace)) and may(as_limited.list_node),
         what="the roles in effect")
    core = build_core(kube_config(tmp_path / "state", limited, namespace))
    await core.start()
    try:
        await wait_for(lambda: core.pool()["nodes"], what="the node in the pool")
        core.set_project(ADMIN, "vision", {"train_guarantee": 8})
        kubectl_pod(api, namespace, "refused", annotations={"gpupool.io/gpu-fraction": "0.5"})
        (ev,) = await wait_for(lambda: [e for e in pod_events(api, namespace, "refused")
                                        if e.reason == "GpupoolBindFailed"], what="the refusal on the pod")
        assert ev.type == "Warning" and "could not write ConfigMap gpupool-refused" in ev.message, ev.message
        assert "403" in ev.message
        await asyncio.sleep(1.0)
        assert not api.read_namespaced_pod("refused", namespace).spec.node_name  # never bound without it
        (job,) = jobs_of(core, namespace, "refused")
        assert job["state"] in ("queued", "running") and job["attempts"] <= 1
        grant("configmaps", [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "delete"]}])
        await wait_for(lambda: api.read_namespaced_pod("refused", namespace).spec.node_name, timeout=60,
                       what="bound once the ConfigMap can be written")
        assert api.read_namespaced_config_map("gpupool-refused", namespace).data["GPUPOOL_GPU_FRACTION"] == "0.5"
        assert len(jobs_of(core, namespace, "refused")) == 1
    finally:
        await core.stop()
        rbac.delete_cluster_role_binding(cluster_role)
        rbac.delete_cluster_role(cluster_role)


# ---------------------------------------------------------------- reading a pod (pure)
def model_pod(name: str = "p", *, labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
              gpus: int = 0, env_from: list[Any] | None = None, phase: str | None = None,
              codes: list[int] | None = None) -> dict[str, Any]:
    """A kubectl pod as the API server sends it (JSON: camelCase keys, absent fields left out)."""
    c: dict[str, Any] = {"name": "main", "image": "img", "command": ["python"], "args": ["t.py"]}
    if gpus:
        c["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    if env_from is not None:
        c["envFrom"] = env_from
    meta: dict[str, Any] = {"name": name, "namespace": "ns", "uid": "u-1"}
    if labels:
        meta["labels"] = labels
    if annotations:
        meta["annotations"] = annotations
    status: dict[str, Any] = {"phase": phase} if phase else {}
    if codes:
        status["containerStatuses"] = [{"name": "main", "image": "img", "imageID": "", "ready": False,
                                        "restartCount": 0, "state": {"terminated": {"exitCode": code}}}
                                       for code in codes]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta,
            "spec": {"containers": [c], "schedulerName": "gpupool"}, "status": status}


def test_a_pod_is_read_into_the_job_spec_it_asks_for() -> None:
    from gpupool.backends.kubernetes.foreign import kubectl_pod_end, read_pod, reads_config_map

    vision = {"gpupool.io/project": "vision"}
    kp = read_pod(model_pod(labels=vision, annotations={"gpupool.io/gpu-memory": "20Gi"}))
    assert kp.problem == "" and kp.user == "kubectl:ns" and kp.spec["gpu_memory"] == 20 * 2 ** 30
    assert kp.spec["command"] == ["python", "t.py"] and kp.spec["labels"] == {"gpupool.io/pod": "ns/p",
                                                                               "gpupool.io/pod-uid": "u-1"}
    assert read_pod(model_pod(labels=vision, gpus=2)).spec["gpus"] == 2
    assert read_pod(model_pod(labels={**vision, "gpupool.io/user": "bo"})).user == "bo"
    for pod, says in (
        (model_pod(), "no label gpupool.io/project"),
        (model_pod(labels=vision, gpus=1, annotations={"gpupool.io/gpu-fraction": "0.5"}),
         "not annotation gpupool.io/gpu-fraction and nvidia.com/gpu limit"),
        (model_pod(labels=vision, annotations={"gpupool.io/gpu-memory": "lots"}), "is not a size"),
        (model_pod(labels=vision, annotations={"gpupool.io/kind": "serve"}), "is not train or build"),
    ):
        assert says in read_pod(pod).problem, read_pod(pod).problem
    assert reads_config_map(model_pod(env_from=[{"configMapRef": {"name": "gpupool-p"}}]))
    optional = {"name": "gpupool-p", "optional": True}  # could start without its GPUs
    assert not reads_config_map(model_pod(env_from=[{"configMapRef": optional}]))
    assert not reads_config_map(model_pod(env_from=[{"secretRef": {"name": "gpupool-p"}}]))
    assert not reads_config_map(model_pod())
    assert kubectl_pod_end(model_pod(phase="Running")) is None
    assert kubectl_pod_end(model_pod(phase="Succeeded", codes=[0])).exit_code == 0  # type: ignore[union-attr]
    assert kubectl_pod_end(model_pod(phase="Failed", codes=[0, 3])).exit_code == 3  # type: ignore[union-attr]
    assert kubectl_pod_end(model_pod(phase="Failed")).exit_code == 1  # type: ignore[union-attr]


async def test_a_pod_whose_job_ended_is_not_queued_again_after_a_restart(api: Any, namespace: str, gpu_nodes: Any,
                                                                          make_core: Any, tmp_path: Path) -> None:
    """The store, not memory, says a pod has had its job: a pod still Pending after its job ended stays so."""
    from gpupool.service.store import Store

    gpu_nodes(1, gpus=8)
    core = await make_core()
    await wait_for(lambda: core.pool()["nodes"], what="the node in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 8})
    kubectl_pod(api, namespace, "holder", gpus=8)
    await wait_for(lambda: api.read_namespaced_pod("holder", namespace).spec.node_name, what="holder bound")
    kubectl_pod(api, namespace, "pending", gpus=8)
    (job,) = await wait_for(lambda: jobs_of(core, namespace, "pending"), what="the pending pod queued")
    await core.stop()
    store = Store(tmp_path / "state" / "state.db")
    store.update_job(job["id"], state="rejected", reason="(ended while its pod stayed)", finished_at=1.0)
    store.close()

    core = await make_core()
    await wait_for(lambda: core.pool()["nodes"], what="the node in the pool again")
    await asyncio.sleep(1.0)  # many monitor passes over the pending pod
    assert [j["state"] for j in jobs_of(core, namespace, "pending")] == ["rejected"]
    assert len(core.list_jobs(ADMIN)) == 2
    assert not api.read_namespaced_pod("pending", namespace).spec.node_name


async def test_a_cordoned_node_evicts_its_kubectl_pod_and_cancels_the_job(api: Any, namespace: str, gpu_nodes: Any,
                                                                          make_core: Any) -> None:
    gpu_nodes(2, gpus=8)
    core = await make_core()
    await wait_for(lambda: len(core.pool()["nodes"]) == 2, what="2 nodes in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 8})
    with Kubelet(api, namespace, stop_exit_code=0) as kubelet:
        kubectl_pod(api, namespace, "on-cordoned", gpus=4)
        await wait_for(lambda: "on-cordoned" in kubelet.started, what="the pod running")
        node = api.read_namespaced_pod("on-cordoned", namespace).spec.node_name
        api.patch_node(node, {"spec": {"unschedulable": True}})  # kubectl cordon
        await wait_for(lambda: "on-cordoned" in kubelet.stopped, what="the pod evicted")
        (job,) = await wait_for(lambda: [j for j in jobs_of(core, namespace, "on-cordoned") if j["state"] != "running"],
                                what="its job settled")
    assert job["state"] == "cancelled" and job["attempts"] == 1
    assert job["reason"].startswith(f"evicted: node {node} left the pool") and "requeued" not in job["reason"]
    (ev,) = [e for e in pod_events(api, namespace, "on-cordoned") if e.reason == "GpupoolPreempted"]
    assert f"node {node} left the pool" in ev.message
    assert len(jobs_of(core, namespace, "on-cordoned")) == 1  # not recreated, not requeued


async def test_cancelling_a_queued_pod_job_deletes_the_pod(api: Any, namespace: str, gpu_nodes: Any,
                                                           make_core: Any) -> None:
    gpu_nodes(1, gpus=8)
    core = await make_core()
    await wait_for(lambda: core.pool()["nodes"], what="the node in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 8})
    kubectl_pod(api, namespace, "all-gpus", gpus=8)
    await wait_for(lambda: api.read_namespaced_pod("all-gpus", namespace).spec.node_name, what="the first pod bound")
    kubectl_pod(api, namespace, "in-queue", annotations={"gpupool.io/gpu-fraction": "0.5"})
    (job,) = await wait_for(lambda: jobs_of(core, namespace, "in-queue"), what="the second pod queued")
    assert job["state"] == "queued"
    done = await core.cancel(ADMIN, job["id"])
    assert done["state"] == "cancelled" and done["reason"] == "cancelled by admin"
    await wait_for(lambda: "in-queue" not in {p.metadata.name for p in api.list_namespaced_pod(namespace).items},
                   what="the queued pod deleted")
    (ev,) = [e for e in pod_events(api, namespace, "in-queue") if e.reason == "GpupoolCancelled"]
    assert f"job {job['id']} cancelled by admin" in ev.message
    assert [j["state"] for j in jobs_of(core, namespace, "all-gpus")] == ["running"]


async def test_a_pod_whose_job_is_rejected_is_told_why_and_stays_pending(api: Any, namespace: str, gpu_nodes: Any,
                                                                         make_core: Any) -> None:
    gpu_nodes(1, gpus=8)
    core = await make_core()
    await wait_for(lambda: core.pool()["nodes"], what="the node in the pool")
    core.set_project(ADMIN, "capped", {"train_guarantee": 0, "train_limit": 1})
    kubectl_pod(api, namespace, "too-big", project="capped", gpus=2)
    (job,) = await wait_for(lambda: [j for j in jobs_of(core, namespace, "too-big") if j["state"] == "rejected"],
                            what="the job rejected")
    (ev,) = await wait_for(lambda: [e for e in pod_events(api, namespace, "too-big") if e.reason == "GpupoolRejected"],
                           what="the pod told why")
    assert ev.type == "Warning" and job["reason"] in ev.message and job["id"] in ev.message
    await asyncio.sleep(0.5)
    assert not api.read_namespaced_pod("too-big", namespace).spec.node_name
    assert len(jobs_of(core, namespace, "too-big")) == 1  # never queued again
