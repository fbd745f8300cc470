"""Gangs Kubernetes itself declares (the Workload API): one all-or-nothing gpupool gang job per PodGroup.

Kubernetes 1.35+ (feature gate ``GenericWorkload``) lets a pod name the
group it must be scheduled with. On 1.37 (``scheduling.k8s.io/v1beta1``) a
pod's ``spec.schedulingGroup.podGroupName`` names a ``PodGroup`` whose
``spec.schedulingPolicy.gang.minCount`` says how many pods must be placed at
once (a ``Workload``'s ``podGroupTemplates`` are the templates such PodGroups
are made from); on 1.35 and 1.36 (``v1alpha1``) a pod's ``spec.workloadRef``
names the Workload and its pod group directly.

A PodGroup (watched when the cluster serves ``scheduling.k8s.io/v1beta1``)
whose pods are kubectl pods for gpupool (``schedulerName`` ours, label
``gpupool.io/project``) becomes, once ``minCount`` of its pods exist, ONE
gpupool train job: ``minCount`` replicas of each pod's whole
``nvidia.com/gpu`` (the same in every pod), queued under the project's quota
like gpupool's own gangs (``client_key`` ``podgroup:<uid>``). Its pods are
never queued on their own (:meth:`WorkloadGangs.owns_pod`), and none is bound
before the policy admits the whole gang; then each is bound to one replica
slot (its ``gpupool.io/admission`` scheduling gate removed first).

Like a kubectl pod's job, such a gang cannot be paused (gpupool cannot
recreate pods it did not make): a reclaim deletes its pods and the job ends
``cancelled``, a user's pause is refused (409), a cancel deletes its pods. A
pod of the group ending ends the job: ``0`` only when every pod succeeded.
A pod naming a v1alpha1 Workload (``spec.workloadRef``) is still refused
with a Warning event (docs/kubernetes.md, "Gangs declared with the Workload API").
"""

from __future__ import annotations

from dataclasses import dataclass

from gpupool.backends.base import JobFacts
from gpupool.backends.kubernetes import objects as ob
from gpupool.backends.kubernetes.objects import Obj

DOCS = 'docs/kubernetes.md, "Gangs declared with the Workload API"'
GROUP, VERSION, PODGROUPS = "scheduling.k8s.io", "v1beta1", "podgroups"
PODGROUP_LABEL = "gpupool.io/podgroup"
"""On the gpupool job: ``<namespace>/<name>`` of the PodGroup it stands for."""
PODGROUP_UID_LABEL = "gpupool.io/podgroup-uid"


def job_key(uid: str) -> str:
    return f"podgroup:{uid}"


def group_name(pod: Obj) -> str:
    """The PodGroup a pod names (``spec.schedulingGroup.podGroupName``), "" when none."""
    return str((ob.spec(pod).get("schedulingGroup") or {}).get("podGroupName") or "")


def min_count(pg: Obj) -> int:
    return int(((ob.spec(pg).get("schedulingPolicy") or {}).get("gang") or {}).get("minCount") or 1)


def gang_refusal(pod: Obj) -> str:
    """Why gpupool does not queue this pod on its own ("" when it names no Workload API group it can place)."""
    if group := group_name(pod):  # reached only where gpupool does not watch PodGroups (v1beta1 not served)
        return (f"it belongs to PodGroup {group} (spec.schedulingGroup), but this cluster does not serve "
                f"{GROUP}/{VERSION} PodGroups to gpupool, and binding the group's pods one by one would break its "
                f"all-or-nothing placement ({DOCS})")
    ref = ob.spec(pod).get("workloadRef") or {}
    if not ref.get("name"):
        return ""
    part = f", pod group {ref['podGroup']}" if ref.get("podGroup") else ""
    return (f"it belongs to Workload {ref['name']}{part} (spec.workloadRef, the v1alpha1 Workload API of "
            "Kubernetes 1.35/1.36); gpupool places only v1beta1 PodGroups (spec.schedulingGroup) as gangs, "
            "and binding their pods one by one would break the group's all-or-nothing placement. Submit it as "
            f"a gpupool gang (gpupool submit --replicas) or leave it to the default scheduler ({DOCS})")


@dataclass(frozen=True)
class GroupRef:
    namespace: str
    name: str
    uid: str

    @property
    def text(self) -> str:
        return f"{self.namespace}/{self.name}"


def ref_of(job: JobFacts) -> GroupRef | None:
    text, uid = job.labels.get(PODGROUP_LABEL), job.labels.get(PODGROUP_UID_LABEL)
    if not text or not uid or "/" not in text or job.client_key != job_key(uid):
        return None
    ns, name = text.split("/", 1)
    return GroupRef(ns, name, uid)
