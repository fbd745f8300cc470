"""Test helpers for GPUs claimed through DRA: what NVIDIA's DRA driver and its Helm chart put in a cluster.

The driver publishes one ResourceSlice per node (pool = node name) with a
device per GPU (``gpu-0``...) carrying its attributes ``type``, ``index``,
``uuid``, ``productName`` and capacity ``memory``; the chart creates the
``gpu.nvidia.com`` DeviceClass whose selector takes the driver's GPUs. Here
the tests publish them by hand on nodes without ``nvidia.com/gpu``.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.kube.cluster import HEARTBEATS, now_text

DRIVER = "gpu.nvidia.com"
CLASS_SELECTOR = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"


def resource_api(api: client.CoreV1Api) -> client.ResourceV1Api:
    return client.ResourceV1Api(api.api_client)


def ensure_device_class(api: client.CoreV1Api) -> None:
    """The driver chart's DeviceClass ``gpu.nvidia.com`` (cluster-wide; made once per session)."""
    try:
        resource_api(api).create_device_class({
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": DRIVER},
            "spec": {"selectors": [{"cel": {"expression": CLASS_SELECTOR}}]}})
    except ApiException as e:
        if e.status != 409:
            raise


def make_dra_node(api: client.CoreV1Api, name: str, gpus: int = 8, *, product: str = "NVIDIA H100 80GB HBM3",
                  memory: str = "80Gi", labels: dict[str, str] | None = None) -> None:
    """A Ready node without ``nvidia.com/gpu`` whose GPUs the DRA driver publishes as a ResourceSlice."""
    node = api.create_node({"apiVersion": "v1", "kind": "Node", "metadata": {
        "name": name, "labels": {"kubernetes.io/hostname": name, **(labels or {})}}})
    res = {"cpu": "64", "memory": "512Gi", "pods": "110"}
    t = now_text()
    api.patch_node_status(name, {"status": {"capacity": res, "allocatable": res, "conditions": [
        {"type": "Ready", "status": "True", "reason": "KubeletReady", "message": "test",
         "lastHeartbeatTime": t, "lastTransitionTime": t}]}})
    HEARTBEATS.beat(api, name, node.metadata.uid)
    api.patch_node(name, {"spec": {"taints": []}})
    publish_slice(api, name, gpus, product=product, memory=memory, owner_uid=node.metadata.uid)


def publish_slice(api: client.CoreV1Api, node: str, gpus: int, *, product: str, memory: str,
                  owner_uid: str) -> None:
    """The node's ResourceSlice as the driver's kubelet plugin writes it (owned by the Node: goes with it)."""
    devices = [{"name": f"gpu-{i}", "attributes": {
        "type": {"string": "gpu"}, "index": {"int": i}, "uuid": {"string": f"GPU-{node}-{i}"},
        "productName": {"string": product}}, "capacity": {"memory": {"value": memory}}} for i in range(gpus)]
    resource_api(api).create_resource_slice({
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{DRIVER}", "ownerReferences": [
            {"apiVersion": "v1", "kind": "Node", "name": node, "uid": owner_uid, "controller": True}]},
        "spec": {"driver": DRIVER, "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                 "devices": devices}})


def delete_dra_node(api: client.CoreV1Api, name: str) -> None:
    for call in (lambda: resource_api(api).delete_resource_slice(f"{name}-{DRIVER}"), lambda: api.delete_node(name)):
        try:
            call()
        except ApiException:
            pass


def claim_template(api: client.CoreV1Api, ns: str, name: str, *, count: int | None = 1,
                   selectors: list[str] | None = None, device_class: str = DRIVER,
                   extra: dict[str, Any] | None = None) -> None:
    """A ResourceClaimTemplate of one request ``gpu`` (``count`` None: allocationMode All)."""
    exactly: dict[str, Any] = {"deviceClassName": device_class}
    if count is None:
        exactly["allocationMode"] = "All"
    else:
        exactly["count"] = count
    if selectors:
        exactly["selectors"] = [{"cel": {"expression": e}} for e in selectors]
    request: dict[str, Any] = {"name": "gpu", "exactly": exactly, **(extra or {})}
    resource_api(api).create_namespaced_resource_claim_template(ns, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [request]}}}})


def claimed_pod(api: client.CoreV1Api, ns: str, name: str, *, template: str | None = None,
                claim: str | None = None, project: str = "vision",
                annotations: dict[str, str] | None = None) -> Any:
    """A kubectl pod for gpupool whose container uses a claim (from a template, or a named claim)."""
    source = {"resourceClaimTemplateName": template} if template else {"resourceClaimName": claim}
    return api.create_namespaced_pod(ns, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"gpupool.io/project": project}, "annotations": annotations or {}},
        "spec": {"schedulerName": "gpupool", "restartPolicy": "Never",
                 "resourceClaims": [{"name": "gpu", **source}],
                 "containers": [{"name": "main", "image": "registry.example/train:1", "command": ["python", "t.py"],
                                 "resources": {"claims": [{"name": "gpu"}]},
                                 "envFrom": [{"configMapRef": {"name": f"gpupool-{name}"}}]}]}})


def claim_of(api: client.CoreV1Api, ns: str, pod: str) -> dict[str, Any] | None:
    """The pod's claim (JSON), through ``status.resourceClaimStatuses`` or its named claim; None before it exists."""
    p = api.read_namespaced_pod(pod, ns)
    names = [s.resource_claim_name for s in p.status.resource_claim_statuses or [] if s.resource_claim_name]
    names += [c.resource_claim_name for c in p.spec.resource_claims or [] if c.resource_claim_name]
    if not names:
        return None
    try:
        obj = resource_api(api).read_namespaced_resource_claim(names[0], ns)
    except ApiException as e:
        if e.status == 404:
            return None
        raise
    out: dict[str, Any] = api.api_client.sanitize_for_serialization(obj)
    return out
