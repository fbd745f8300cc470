"""A launch -> the Pod manifest of its attempt, and a Pod (its JSON) -> how its attempt ended (pure: no API calls)."""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from typing import Any

from gpupool.backends.base import Launch
from gpupool.backends.kubernetes import objects as ob
from gpupool.backends.kubernetes.disruption import disruption, ended_before
from gpupool.backends.kubernetes.names import (
    ATTEMPT_LABEL,
    CONTAINER,
    GPU_RESOURCE,
    JOB_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    PROJECT_LABEL,
    pod_name,
)
from gpupool.backends.kubernetes.objects import Obj
from gpupool.backends.kubernetes.pod_placement import pod_spec_rules

WORKDIR_ROOT = "/gpupool/work"
"""A job's default working directory inside its pod (the PVC, when configured, is mounted here)."""
_LABEL_VALUE = re.compile(r"[^A-Za-z0-9_.-]")


@dataclass
class PodHandle:
    """A started attempt run as a pod, gpupool's or a kubectl user's (the core's handle); no local process."""

    job_id: str
    attempt: int
    name: str
    node: str = ""
    pid: int | None = None
    start_time: int = 0


@dataclass(frozen=True)
class PodSettings:
    """What every job pod of this service shares (from ServiceConfig)."""

    namespace: str
    image: str
    scheduler_name: str = "gpupool"
    grace_s: float = 10.0
    workdir_pvc: str | None = None
    start_timeout_s: float = 300.0  # a pod that cannot start (image pull failing) fails its job after this


def label_value(text: str) -> str:
    """``text`` as a valid label value (at most 63 of ``[A-Za-z0-9_.-]``, alphanumeric at both ends)."""
    return _LABEL_VALUE.sub("_", text)[:63].strip("_.-") or "none"


def pod_environment(launch: Launch) -> dict[str, str]:
    """The job's variables, then the GPU variables, re-mapped for a container.

    With exact GPU UUIDs (the node agent's annotation) both
    ``NVIDIA_VISIBLE_DEVICES`` and ``CUDA_VISIBLE_DEVICES`` name them. Without,
    the NVIDIA runtime gets the node's indices and CUDA sees the chosen GPUs
    renumbered from 0, as inside any container. No GPU: ``void``, so an
    image's baked-in ``NVIDIA_VISIBLE_DEVICES=all`` exposes nothing. The
    service's torch-hook ``PYTHONPATH`` is a path on the service's machine,
    so only the job's own ``PYTHONPATH`` is kept.
    """
    env = dict(launch.job_env)
    env.update({k: v for k, v in launch.gpu_env.items() if k != "PYTHONPATH"})
    gpus = list(launch.assignment.get("gpus") or [])
    ids = [str(g["id"]) for g in gpus]
    if not gpus:
        env["NVIDIA_VISIBLE_DEVICES"] = "void"
        env["CUDA_VISIBLE_DEVICES"] = ""
    elif all("/" not in i for i in ids):
        env["NVIDIA_VISIBLE_DEVICES"] = env["CUDA_VISIBLE_DEVICES"] = ",".join(ids)
    else:
        env["NVIDIA_VISIBLE_DEVICES"] = ",".join(str(g["index"]) for g in gpus)
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(len(gpus)))
    return env


def pod_manifest(launch: Launch, settings: PodSettings) -> dict[str, Any]:
    """The Pod of one attempt: ours (labels), left Pending for us to bind (schedulerName), run once."""
    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": launch.image or settings.image,
        "command": list(launch.command),
        "env": [{"name": k, "value": v} for k, v in sorted(pod_environment(launch).items())],
    }
    spec: dict[str, Any] = {
        "schedulerName": settings.scheduler_name,
        "restartPolicy": "Never",  # an attempt runs once; a resume is a new pod (attempt + 1)
        "terminationGracePeriodSeconds": max(0, int(round(settings.grace_s))),
        "tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
        "containers": [container],
    }
    if launch.placement:  # the job's nodeSelector, node affinity and tolerations (ours come first)
        rules = pod_spec_rules(launch.placement)
        spec["tolerations"] += rules.pop("tolerations", [])
        spec.update(rules)
    if launch.workdir:
        container["workingDir"] = launch.workdir
    if settings.workdir_pvc:
        spec["volumes"] = [{"name": "work", "persistentVolumeClaim": {"claimName": settings.workdir_pvc}}]
        container["volumeMounts"] = [{"name": "work", "mountPath": WORKDIR_ROOT, "subPath": launch.job_id}]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(launch.job_id, launch.attempt),
            "namespace": settings.namespace,
            "labels": {
                JOB_LABEL: label_value(launch.job_id),
                ATTEMPT_LABEL: str(launch.attempt),
                PROJECT_LABEL: label_value(launch.project),
                MANAGED_BY_LABEL: MANAGED_BY,
            },
            "annotations": {"gpupool.io/user": launch.user, "gpupool.io/project": launch.project,
                            "gpupool.io/node": str(launch.assignment.get("node", ""))},
        },
        "spec": spec,
    }


@dataclass(frozen=True)
class PodEnd:
    """How an attempt's container ended: its exit code, and whether it ended before any disruption reached it.

    ``disruption``: when it did not, what reached it first, in words after "its pod X" (``was deleted by
    ...``, ``was evicted by ...``: :mod:`gpupool.backends.kubernetes.disruption`); "" when it did.
    ``finished_at``: the container's ``finishedAt`` (None where the kubelet recorded none).
    """

    exit_code: int | None
    on_its_own: bool
    disruption: str = ""
    finished_at: dt.datetime | None = None


def _terminated(pod: Obj) -> Obj | None:
    for cs in ob.container_statuses(pod):
        if cs.get("name") == CONTAINER and (term := ob.terminated(cs)) is not None:
            return term
    return None


CANNOT_START = frozenset({"ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull",
                          "CreateContainerConfigError", "CreateContainerError", "RunContainerError"})
"""Reasons a kubelet gives for a container it cannot start: retrying may help (a registry back), or not."""
NEVER_STARTS = frozenset({"InvalidImageName", "ErrImageNeverPull"})
"""Of those, the ones no retry can cure: the job fails at once."""


def start_problem(pod: Obj) -> tuple[str, bool] | None:
    """Why the job container cannot start, as the kubelet says it ("ImagePullBackOff: ..."), and whether no
    retry can cure it; None while it starts, runs, or waits for an ordinary reason (ContainerCreating)."""
    for cs in ob.container_statuses(pod):
        if cs.get("name") != CONTAINER:
            continue
        w = ob.waiting(cs)
        reason = str((w or {}).get("reason") or "")
        if reason not in CANNOT_START:
            return None
        message = str(w.get("message") or "").strip()  # type: ignore[union-attr]
        return (f"{reason}: {message}" if message else reason), reason in NEVER_STARTS
    return None


def pod_end(pod: Obj) -> PodEnd | None:
    """The attempt's end as this Pod (its JSON) shows it, or None while it may still run.

    Ended on its own: the Pod reached its end with no disruption shown (a
    watch delivers changes in order, so the terminal status came first), or
    its container finished before the second in which the disruption began
    (a deletion: ``deletionTimestamp`` minus the grace; a ``DisruptionTarget``
    condition: its transition). A kubelet's eviction (``reason: Evicted``)
    is never an end on its own. A container that ends in the very second of a
    disruption counts as disrupted: it resumes, from its checkpoint.
    """
    term = _terminated(pod)
    phase = ob.phase(pod)
    if term is None and phase not in ("Succeeded", "Failed"):
        return None
    if ob.spec(pod).get("restartPolicy") == "Always" and phase not in ("Succeeded", "Failed"):
        return None  # a kernel pod (kernel_pods.py): its container is restarted in place, the pod goes on
    code = ob.exit_code(term) if term is not None else (0 if phase == "Succeeded" else None)
    finished = ob.parse_time(term.get("finishedAt")) if term is not None else None
    d = disruption(pod)
    if d is None or ended_before(finished, d):
        return PodEnd(code, True, finished_at=finished)
    return PodEnd(code, False, d.what, finished)


def disrupted_reason(name: str, end: PodEnd) -> str:
    """Why an attempt whose pod was disrupted has no result of its own (the job's reason when gpupool had not
    asked for it: then it resumes from its checkpoint, as after a cordon)."""
    code = f"; its container then exited with code {end.exit_code}" if end.exit_code is not None else ""
    return f"its pod {name} {end.disruption or 'was stopped from outside'}{code}; requeued to resume"
