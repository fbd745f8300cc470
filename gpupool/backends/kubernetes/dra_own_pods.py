"""gpupool's own pods (jobs, gang replicas, GPU kernels) on nodes whose GPUs come from ResourceSlices: one claim each.

On such a node the driver hands a container its GPUs only through a
ResourceClaim allocated for the pod, and it is the kubelet that asks the
driver to prepare them. So a pod gpupool makes there names a claim
``<pod>-gpu`` in ``spec.resourceClaims`` (its container uses it), and after
the pod is created gpupool creates that claim, owned by the pod (the garbage
collector deletes it with the pod), asking for as many ``gpu.nvidia.com``
devices as the policy chose, and writes the allocation it chose (those
devices, on that node) and the reservation for the pod into its status before
the binding: the same write a claimed kubectl pod gets
(:mod:`.dra_allocation`). A share of one GPU names that one device, like every
pod that shares it. A pod on a node without slices, or without a GPU, is left
as it is.

Which GPUs the policy chose is read from the pod's own ``NVIDIA_VISIBLE_DEVICES``
(a GPU's id, the device's UUID, or its index on the node where the slice
gives no UUID): the manifest already carries it for the container.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpupool.backends.kubernetes import objects as ob
from gpupool.backends.kubernetes.calls import raw_json
from gpupool.backends.kubernetes.dra_slices import DRIVER, Device, DraSlices
from gpupool.backends.kubernetes.health import describe
from gpupool.backends.kubernetes.objects import Obj

CLAIM = "gpu"  # the pod's name for its claim
GPU_CLASS = DRIVER


def claim_name(pod: str) -> str:
    return f"{pod}-gpu"


def _visible(manifest: dict[str, Any]) -> list[str]:
    for c in (manifest.get("spec") or {}).get("containers") or []:
        for e in c.get("env") or []:
            if e.get("name") == "NVIDIA_VISIBLE_DEVICES":
                value = str(e.get("value") or "")
                return [] if value in ("", "void", "none") else [v for v in value.split(",") if v]
    return []


class OwnPodClaims:
    """The claims of gpupool's own pods on DRA nodes: named in the manifest, made and allocated after the create."""

    def __init__(self, api: client.CoreV1Api, slices: DraSlices) -> None:
        self.rapi = client.ResourceV1Api(api.api_client)
        self.slices = slices

    def devices_for(self, manifest: dict[str, Any], node: str) -> list[Device]:
        """The devices of the GPUs the pod's environment names, on ``node`` ([] when it is no DRA node)."""
        on_node = self.slices.devices_of(node)
        if not on_node:
            return []
        by_index = {d.attribute("index"): d for d in on_node}
        out = []
        for token in _visible(manifest):
            d = self.slices.device_of(token)
            if d is None and token.isdigit():
                d = by_index.get(int(token))
            if d is None or d.node != node:
                raise RuntimeError(f"GPU {token} is no device of node {node}'s ResourceSlices")
            out.append(d)
        return out

    def prepare(self, manifest: dict[str, Any], node: str) -> tuple[dict[str, Any], Callable[[Obj], None] | None]:
        """The manifest naming its claim, and what to do once the pod exists; as it was when no claim is needed."""
        devices = self.devices_for(manifest, node)
        if not devices:
            return manifest, None
        m = copy.deepcopy(manifest)
        name = str(m["metadata"]["name"])
        m["spec"]["resourceClaims"] = [{"name": CLAIM, "resourceClaimName": claim_name(name)}]
        for c in m["spec"]["containers"]:
            c.setdefault("resources", {}).setdefault("claims", []).append({"name": CLAIM})

        def after_create(created: Obj) -> None:
            try:
                self.make_claim(created, node, devices)
            except ApiException as e:
                raise RuntimeError(f"could not make ResourceClaim {claim_name(name)}: {describe(e)}") from e
        return m, after_create

    def make_claim(self, pod: Obj, node: str, devices: list[Device]) -> None:
        """Create the pod's claim (owned by it), then write its allocation and reservation."""
        ns, name, uid = ob.namespace(pod), ob.name(pod), ob.uid(pod)
        body = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                "metadata": {"name": claim_name(name), "namespace": ns,
                             "labels": dict(ob.labels(pod)),
                             "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": name, "uid": uid,
                                                  "controller": True}]},
                "spec": {"devices": {"requests": [{"name": CLAIM, "exactly": {
                    "deviceClassName": GPU_CLASS, "allocationMode": "ExactCount", "count": len(devices)}}]}}}
        try:
            made = self.rapi.create_namespaced_resource_claim(ns, ob.client_body(body), _preload_content=False)
        except ApiException as e:
            if e.status != 409:
                raise
            # one of an earlier pod of this name (its garbage collection pending): replaced
            self.rapi.delete_namespaced_resource_claim(claim_name(name), ns)
            made = self.rapi.create_namespaced_resource_claim(ns, ob.client_body(body), _preload_content=False)
        claim = raw_json(made)
        claim["status"] = {"allocation": {
            "devices": {"results": [{"request": CLAIM, "driver": d.driver, "pool": d.pool, "device": d.name}
                                    for d in devices]},
            "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
            "reservedFor": [{"resource": "pods", "name": name, "uid": uid}]}
        self.rapi.replace_namespaced_resource_claim_status(claim_name(name), ns, ob.client_body(claim),
                                                    _preload_content=False)
