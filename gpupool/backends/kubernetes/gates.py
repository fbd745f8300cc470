"""gpupool's scheduling gate on kubectl pods: held while gpupool queues a pod, removed when it binds it.

A pod created with ``spec.schedulingGates: [{name: gpupool.io/admission}]``
is not *unschedulable* to the rest of the cluster (the cluster autoscaler,
kube-scheduler's metrics, dashboards): the API server marks it
``PodScheduled=False, reason SchedulingGated`` and everyone else leaves it
alone, while gpupool queues it as any kubectl pod. When the policy admits it,
gpupool removes its gate and then binds it (the API server refuses a Binding
for a pod that still has a gate). Who adds the gate is the pod's author (or a
tool that writes pods for them): docs/kubernetes.md, "Scheduling gates".

A pod that also carries another tool's gate is not ready for any scheduler
yet: gpupool does not queue it until that tool has removed its gate and only
gpupool's remains (or none). Gates can only be removed after a pod is
created, never added, so a pod queued once never gains another gate.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client

from gpupool.backends.kubernetes import objects as ob
from gpupool.backends.kubernetes.objects import Obj

ADMISSION_GATE = "gpupool.io/admission"
PATCH_TYPE = "application/strategic-merge-patch+json"
"""``schedulingGates`` is a list keyed by ``name``: a strategic merge patch deletes one element by name."""


def gates(pod: Obj) -> list[str]:
    """The names of a pod's scheduling gates, in order."""
    return [str(g.get("name") or "") for g in ob.spec(pod).get("schedulingGates") or []]


def other_gates(pod: Obj) -> list[str]:
    """The gates on a pod that are not gpupool's: while there are any, gpupool leaves the pod alone."""
    return [g for g in gates(pod) if g != ADMISSION_GATE]


def has_our_gate(pod: Obj) -> bool:
    return ADMISSION_GATE in gates(pod)


def ungate_patch() -> dict[str, Any]:
    """The patch that removes gpupool's gate and keeps any other (idempotent: an absent gate is no error)."""
    return {"spec": {"schedulingGates": [{"$patch": "delete", "name": ADMISSION_GATE}]}}


def remove_gate(api: client.CoreV1Api, namespace: str, name: str) -> None:
    """Remove gpupool's gate from one pod (one patch), before its Binding: any executor that binds user pods."""
    api.patch_namespaced_pod(name, namespace, ungate_patch(), _content_type=PATCH_TYPE)
