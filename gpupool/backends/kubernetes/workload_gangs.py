"""Pods that belong to a gang Kubernetes itself declares (the Workload API): recognised, not split up.

Kubernetes 1.35+ (feature gate ``GenericWorkload``) lets a pod name the
group it must be scheduled with. On 1.37 (``scheduling.k8s.io/v1beta1``) a
pod's ``spec.schedulingGroup.podGroupName`` names a ``PodGroup`` whose
``spec.schedulingPolicy.gang.minCount`` says how many pods must be placed at
once (a ``Workload``'s ``podGroupTemplates`` are the templates such PodGroups
are made from); on 1.35 and 1.36 (``v1alpha1``) a pod's ``spec.workloadRef``
names the Workload and its pod group directly.

gpupool binds each kubectl pod as its own job, so binding a gang's pods one
by one would place part of a gang and hold its GPUs while the rest waits:
exactly what the gang's author asked the scheduler never to do. Until gpupool
schedules such a group as one of its own all-or-nothing gangs, a pod that
names one is not queued, and its Warning event says why and what to do
instead (docs/kubernetes.md, "Gangs declared with the Workload API").
"""

from __future__ import annotations

from gpupool.backends.kubernetes import objects as ob
from gpupool.backends.kubernetes.objects import Obj

DOCS = 'docs/kubernetes.md, "Gangs declared with the Workload API"'


def gang_of(pod: Obj) -> str:
    """The group a pod names through the Workload API, in words ("" when none)."""
    spec = ob.spec(pod)
    group = (spec.get("schedulingGroup") or {}).get("podGroupName")
    if group:
        return f"PodGroup {group} (spec.schedulingGroup)"
    ref = spec.get("workloadRef") or {}
    if ref.get("name"):
        part = f", pod group {ref['podGroup']}" if ref.get("podGroup") else ""
        return f"Workload {ref['name']}{part} (spec.workloadRef)"
    return ""


def gang_refusal(pod: Obj) -> str:
    """Why gpupool does not queue this pod on its own ("" when it names no Workload API group)."""
    gang = gang_of(pod)
    if not gang:
        return ""
    return (f"it belongs to {gang}, a Kubernetes scheduling group; gpupool does not place such groups yet, "
            "and binding their pods one by one would break the group's all-or-nothing placement. Submit it "
            "as a gpupool gang (gpupool submit --replicas) or leave it to the default scheduler "
            f"({DOCS})")
