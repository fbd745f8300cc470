"""A batch/v1 Job or a JobSet as gpupool reads and marks it (pure, but for the Event it posts).

Which object a gpupool job stands for (:class:`JobRef`), the annotations
gpupool writes on it, how it ended, which pods are its, and the Events that
tell its author what gpupool did (``kubectl describe job``). The watching,
admission and binding are :mod:`gpupool.backends.kubernetes.batch_jobs`'.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from dataclasses import dataclass
from typing import Any

from kubernetes import client

from gpupool.backends.kubernetes import objects as ob
from gpupool.backends.kubernetes.health import describe
from gpupool.backends.kubernetes.objects import Obj

log = logging.getLogger("gpupool.backends.kubernetes")

RESUME_ANNOTATION = "gpupool.io/resume"
"""On the pod template: "1" when the attempt resumes an earlier one (read it as env GPUPOOL_RESUME)."""
NODES_ANNOTATION = "gpupool.io/nodes"
"""On an admitted Job: the replica slots' nodes, comma-separated (a restart binds its new pods to them)."""
GPUS_ANNOTATION = "gpupool.io/gpus"
"""On an admitted Job: the replica slots' GPU ids (``;`` between slots, ``,`` between GPUs): DRA claims' devices."""
ADMITTED_ANNOTATION = "gpupool.io/admitted-as"
"""On an admitted Job: ``<gpupool job id>/<attempt>``."""
JOBSET_GROUP, JOBSET_VERSION, JOBSETS = "jobset.x-k8s.io", "v1alpha2", "jobsets"
JOBSET_UID_LABEL = "jobset.sigs.k8s.io/jobset-uid"  # on a JobSet's child Jobs and their pods


@dataclass(frozen=True)
class JobRef:
    """Which Job a gpupool job stands for: the uid tells a recreated Job of the same name apart."""

    namespace: str
    name: str
    uid: str
    kind: str = "Job"  # or "JobSet"

    @property
    def text(self) -> str:
        return f"{self.namespace}/{self.name}"


def finished(job: Obj) -> int | None:
    """The Job's (JobSet's) end as an exit code: 0 once ``Complete`` (``Completed``), 1 once ``Failed``, else None."""
    for c in ob.status(job).get("conditions") or []:
        if c.get("status") == "True" and c.get("type") in ("Complete", "Completed"):
            return 0
        if c.get("status") == "True" and c.get("type") == "Failed":
            return 1
    return None


def suspended(job: Obj) -> bool:
    return bool(ob.spec(job).get("suspend"))


def owner_uid(obj: Obj, kind: str, group: str) -> str | None:
    """The uid of the object of ``kind`` (API group ``group``) that controls ``obj``, or None."""
    for ref in ob.meta(obj).get("ownerReferences") or []:
        if ref.get("kind") == kind and str(ref.get("apiVersion", "")).startswith(f"{group}/") and ref.get("controller"):
            return str(ref.get("uid"))
    return None


def owner_job_uid(pod: Obj) -> str | None:
    """The uid of the batch/v1 Job that controls this pod, or None."""
    return owner_uid(pod, "Job", "batch")


def member_of(pod: Obj, ref: JobRef) -> bool:
    """Whether the pod is one of the Job's (or the JobSet's, through its child Jobs)."""
    if ref.kind == "JobSet":
        return ob.namespace(pod) == ref.namespace and ob.labels(pod).get(JOBSET_UID_LABEL) == ref.uid
    return owner_job_uid(pod) == ref.uid


def active_pod(pod: Obj) -> bool:
    """Not ended (a pod that Succeeded or Failed holds no GPU)."""
    return ob.phase(pod) not in ("Succeeded", "Failed")


def post_job_event(api: client.CoreV1Api, ref: JobRef, kind: str, reason: str, message: str) -> None:
    """An Event on the Job (``kubectl describe job`` shows it)."""
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    body: Any = {"apiVersion": "v1", "kind": "Event",
                 "metadata": {"name": f"{ref.name[:200]}.{uuid.uuid4().hex[:16]}", "namespace": ref.namespace},
                 "involvedObject": {"apiVersion": "batch/v1" if ref.kind == "Job" else f"{JOBSET_GROUP}/{JOBSET_VERSION}",
                               "kind": ref.kind, "namespace": ref.namespace,
                                    "name": ref.name, "uid": ref.uid},
                 "reason": reason, "message": message[:1024], "type": kind, "source": {"component": "gpupool"},
                 "firstTimestamp": now, "lastTimestamp": now, "count": 1}
    try:
        api.create_namespaced_event(ref.namespace, body)
    except Exception as e:
        log.warning("could not record event %s on Job %s: %s", reason, ref.text, describe(e))
