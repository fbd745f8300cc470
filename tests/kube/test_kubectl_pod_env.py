"""How a kubectl pod learns its GPUs with no write beyond the binding: the binding's annotations, read by
the downward API; the ConfigMap only for a pod that names it."""

from __future__ import annotations

import json
from typing import Any

from kubernetes.client.rest import ApiException

from gpupool.service.actor import Actor
from tests.kube.process_kubelet import ProcessKubelet
from tests.kube.test_kubectl_pods import jobs_of, kubectl_pod, pod_events
from tests.service.helpers import wait_for

ADMIN = Actor("admin", True)
SHOWN = ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES", "GPUPOOL_GPU_FRACTION", "GPUPOOL_GPU_MEMORY_LIMIT",
         "GPUPOOL_JOB_ID")
PRINT_ENV = f"import json, os; print(json.dumps({{k: os.environ.get(k) for k in {list(SHOWN)!r}}}))"


def no_config_map(api: Any, ns: str, pod: str) -> bool:
    try:
        api.read_namespaced_config_map(f"gpupool-{pod}", ns)
    except ApiException as e:
        return e.status == 404
    return False


async def test_a_fractional_pod_reads_its_gpu_from_its_binding_annotations_and_gets_no_config_map(
        api: Any, namespace: str, gpu_nodes: Any, make_core: Any) -> None:
    """The v1.37 API server copies the Binding's annotations onto the pod, and the container started after
    the binding sees them through ``fieldRef``: its share, with no ConfigMap and no warning."""
    gpu_nodes(1, gpus=8)
    core = await make_core()
    await wait_for(lambda: core.pool()["nodes"], what="the node in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 8})
    env = [{"name": k, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['env.gpupool.io/{k}']"}}}
           for k in SHOWN]
    api.create_namespaced_pod(namespace, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "quarter", "labels": {"gpupool.io/project": "vision", "test": "annotation-env"},
                     "annotations": {"gpupool.io/gpu-fraction": "0.25"}},
        "spec": {"schedulerName": "gpupool", "restartPolicy": "Never", "containers": [
            {"name": "main", "image": "registry.example/train:1", "command": ["python", "-c", PRINT_ENV],
             "env": env}]}})
    with ProcessKubelet(api, namespace, label_selector="test=annotation-env") as kubelet:
        seen = await wait_for(lambda: kubelet.output("quarter").strip(), what="the container's output")
        (job,) = jobs_of(core, namespace, "quarter")
        (share,) = job["assignment"]["gpus"]
        assert json.loads(seen) == {"NVIDIA_VISIBLE_DEVICES": str(share["index"]), "CUDA_VISIBLE_DEVICES": "0",
                                    "GPUPOOL_GPU_FRACTION": "0.25",
                                    "GPUPOOL_GPU_MEMORY_LIMIT": str(share["memory_limit"]),
                                    "GPUPOOL_JOB_ID": job["id"]}
        done = await wait_for(lambda: (j := core.get_job(ADMIN, job["id"]))["state"] != "running" and j,
                              what="the job settled")
    assert (done["state"], done["exit_code"]) == ("succeeded", 0)
    pod = api.read_namespaced_pod("quarter", namespace)
    assert pod.metadata.annotations["env.gpupool.io/GPUPOOL_GPU_FRACTION"] == "0.25"
    assert pod.metadata.annotations["gpupool.io/gpu-fraction"] == "0.25"  # the user's request, untouched
    assert no_config_map(api, namespace, "quarter")
    (scheduled,) = [e for e in pod_events(api, namespace, "quarter") if e.reason == "Scheduled"]
    assert "environment in annotations env.gpupool.io/*" in scheduled.message, scheduled.message
    assert not [e for e in pod_events(api, namespace, "quarter") if e.reason == "GpupoolNoGpuEnv"]


async def test_a_whole_gpu_pod_without_env_from_gets_no_config_map_and_one_naming_it_optionally_does(
        api: Any, namespace: str, gpu_nodes: Any, make_core: Any) -> None:
    """A pod with an nvidia.com/gpu limit that names no ConfigMap costs the binding and its event only; a pod
    that names its ConfigMap in envFrom, even optionally, still gets it before it is bound."""
    gpu_nodes(1, gpus=8)
    core = await make_core()
    await wait_for(lambda: core.pool()["nodes"], what="the node in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 8})
    kubectl_pod(api, namespace, "whole", gpus=2, env_from=False)
    api.create_namespaced_pod(namespace, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "optional", "labels": {"gpupool.io/project": "vision"}},
        "spec": {"schedulerName": "gpupool", "restartPolicy": "Never", "containers": [
            {"name": "main", "image": "registry.example/train:1", "command": ["python", "train.py"],
             "resources": {"limits": {"nvidia.com/gpu": "1"}},
             "envFrom": [{"configMapRef": {"name": "gpupool-optional", "optional": True}}]}]}})
    await wait_for(lambda: all(api.read_namespaced_pod(n, namespace).spec.node_name for n in ("whole", "optional")),
                   what="both pods bound")
    bound = api.read_namespaced_pod("whole", namespace)
    (job,) = jobs_of(core, namespace, "whole")
    assert bound.metadata.annotations["env.gpupool.io/NVIDIA_VISIBLE_DEVICES"] == ",".join(
        str(g["index"]) for g in job["assignment"]["gpus"])
    await wait_for(lambda: [e for e in pod_events(api, namespace, "whole") if e.reason == "Scheduled"],
                   what="the Scheduled event")
    assert no_config_map(api, namespace, "whole")
    assert not [e for e in pod_events(api, namespace, "whole") if e.reason == "GpupoolNoGpuEnv"]
    (other,) = jobs_of(core, namespace, "optional")
    cm = api.read_namespaced_config_map("gpupool-optional", namespace)
    assert cm.data["GPUPOOL_JOB_ID"] == other["id"]


def test_which_pods_read_their_binding_annotations_and_which_name_their_config_map() -> None:
    from gpupool.backends.kubernetes.foreign import names_config_map, reads_config_map, reads_env_annotations
    from gpupool.backends.kubernetes.gpu_env_configmap import binding_annotations

    def pod(container: dict[str, Any], volumes: list[Any] | None = None) -> dict[str, Any]:
        return {"metadata": {"name": "p", "namespace": "ns", "uid": "u"},
                "spec": {"containers": [{"name": "main", **container}], "volumes": volumes or []}}

    def field(path: str) -> dict[str, Any]:
        return {"fieldRef": {"fieldPath": path}}

    assert reads_env_annotations(pod({"env": [{"name": "V", "valueFrom": field(
        "metadata.annotations['env.gpupool.io/CUDA_VISIBLE_DEVICES']")}]}))
    assert not reads_env_annotations(pod({"env": [{"name": "V", "valueFrom": field(
        "metadata.annotations['gpupool.io/gpu-fraction']")}]}))  # the user's own request, not what it holds
    assert reads_env_annotations(pod({}, [{"name": "a", "downwardAPI": {"items": [
        {"path": "annotations", **field("metadata.annotations")}]}}]))
    assert not reads_env_annotations(pod({"env": [{"name": "V", "value": "x"}]}))
    optional = pod({"envFrom": [{"configMapRef": {"name": "gpupool-p", "optional": True}}]})
    assert names_config_map(optional) and not reads_config_map(optional)
    assert not names_config_map(pod({"envFrom": [{"configMapRef": {"name": "other"}}]}))
    assert binding_annotations({"GPUPOOL_JOB_ID": "j-1", "bad name": "x"}) == {"env.gpupool.io/GPUPOOL_JOB_ID": "j-1"}


async def test_a_queued_pod_deleted_or_bound_by_someone_else_ends_its_job(api: Any, namespace: str, gpu_nodes: Any,
                                                                          make_core: Any) -> None:
    """The queueing looks only at the pods the watch changed between its full passes: a change to a queued
    pod (its deletion, another scheduler's binding) still ends that pod's job, among pods that do not change."""
    (node,) = gpu_nodes(1, gpus=1)
    core = await make_core()
    await wait_for(lambda: core.pool()["nodes"], what="the node in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 1})
    kubectl_pod(api, namespace, "holder", gpus=1, env_from=False)
    await wait_for(lambda: api.read_namespaced_pod("holder", namespace).spec.node_name, what="the first pod bound")
    for name in ("doomed", "taken", "waits"):
        kubectl_pod(api, namespace, name, gpus=1, env_from=False)
    queued = await wait_for(lambda: len(js := {n: jobs_of(core, namespace, n) for n in ("doomed", "taken", "waits")})
                            == 3 and all(js.values()) and {n: j[0] for n, j in js.items()}, what="three queued jobs")
    assert {j["state"] for j in queued.values()} == {"queued"}
    api.delete_namespaced_pod("doomed", namespace, grace_period_seconds=0)
    api.create_namespaced_pod_binding("taken", namespace, {
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": "taken"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node}}, _preload_content=False)
    ended = await wait_for(lambda: all(core.get_job(ADMIN, queued[n]["id"])["state"] == "cancelled"
                                       for n in ("doomed", "taken"))
                           and {n: core.get_job(ADMIN, queued[n]["id"]) for n in ("doomed", "taken")},
                           what="both jobs cancelled")
    assert "its pod" in ended["doomed"]["reason"] and "was deleted before gpupool bound it" in ended["doomed"]["reason"]
    assert f"was bound to {node} by someone else" in ended["taken"]["reason"], ended["taken"]["reason"]
    assert core.get_job(ADMIN, queued["waits"]["id"])["state"] == "queued"
