"""A pod a user created with kubectl for gpupool to place -> what gpupool queues for it (pure: no API calls).

Such a pod names ``schedulerName: gpupool``, is not one of gpupool's own job
pods, and says in labels and annotations which project it belongs to and how
much GPU it wants (docs/kubernetes.md, "Pods you create with kubectl"). This
module reads those into a job spec the core validates like any submit, and
reads how such a pod ended; the watching and binding are in
:mod:`gpupool.backends.kubernetes.foreign_jobs`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kubernetes.utils import parse_quantity

from gpupool.backends.kubernetes import objects as ob
from gpupool.backends.kubernetes.disruption import disruption
from gpupool.backends.kubernetes.names import GPU_RESOURCE, PROJECT_LABEL
from gpupool.backends.kubernetes.objects import Obj
from gpupool.backends.kubernetes.pod_placement import Unsupported, rules_of_pod
from gpupool.backends.kubernetes.pods import PodEnd
from gpupool.backends.kubernetes.workload_gangs import gang_refusal

USER_LABEL = "gpupool.io/user"
FRACTION_ANNOTATION = "gpupool.io/gpu-fraction"
MEMORY_ANNOTATION = "gpupool.io/gpu-memory"
KIND_ANNOTATION = "gpupool.io/kind"
POD_JOB_LABEL = "gpupool.io/pod"
"""On the Job (not the pod): ``<namespace>/<name>`` of the pod it stands for."""
POD_UID_JOB_LABEL = "gpupool.io/pod-uid"
ENV_ANNOTATION_PREFIX = "env.gpupool.io/"
"""``env.gpupool.io/<VARIABLE>``: one of the pod's GPU variables, written by its binding (gpu_env_configmap.py)."""
MAX_NAME = 253  # a ConfigMap's name is a DNS subdomain


def config_map_name(pod_name: str) -> str:
    """The ConfigMap holding a kubectl pod's GPU environment (its spec names it in ``envFrom``)."""
    return f"gpupool-{pod_name}"


def job_key(uid: str) -> str:
    """The Job's ``client_key`` for the pod with this uid: one job per pod, across restarts."""
    return f"pod:{uid}"


@dataclass(frozen=True)
class PodRef:
    """Which pod a job stands for: its uid tells a recreated pod of the same name apart."""

    namespace: str
    name: str
    uid: str

    @property
    def text(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class KubectlPod:
    """What gpupool makes of a pending kubectl pod: the job spec to queue, or why it cannot.

    ``problem`` is the whole message of the Warning event the pod gets when it
    is not queued ("" when ``spec`` is queueable as far as the pod alone tells;
    the project's existence and the request's size are checked by the core).
    """

    ref: PodRef
    project: str
    user: str
    spec: dict[str, Any]
    problem: str = ""


def gpus_asked(pod: Obj) -> int:
    """Whole GPUs a pod asks for: its containers' ``nvidia.com/gpu`` limits (or requests), summed.

    Init containers run one at a time before the others, so the largest of
    them counts when it is more than the containers' sum (as the kubelet does).
    """
    def one(c: Obj) -> int:
        res = c.get("resources") or {}
        value = (res.get("limits") or {}).get(GPU_RESOURCE) or (res.get("requests") or {}).get(GPU_RESOURCE)
        try:
            return max(0, int(parse_quantity(value))) if value is not None else 0
        except (ValueError, TypeError):
            return 0

    main = sum(one(c) for c in ob.containers(pod))
    init = max((one(c) for c in ob.init_containers(pod)), default=0)
    return max(main, init)


def _config_map_refs(pod: Obj) -> list[Obj]:
    """The pod's containers' ``envFrom`` references to its gpupool ConfigMap."""
    want = config_map_name(ob.name(pod))
    return [ref for c in ob.containers(pod) for src in c.get("envFrom") or []
            if (ref := src.get("configMapRef")) is not None and ref.get("name") == want]


def names_config_map(pod: Obj) -> bool:
    """Whether a container names the pod's gpupool ConfigMap in ``envFrom`` (optional or not): it is written."""
    return bool(_config_map_refs(pod))


def reads_config_map(pod: Obj) -> bool:
    """Whether a container takes its environment from its gpupool ConfigMap, not optionally (it waits for it)."""
    return any(not ref.get("optional") for ref in _config_map_refs(pod))


def reads_env_annotations(pod: Obj) -> bool:
    """Whether the pod reads its GPU variables from the annotations its binding writes (the downward API).

    Either a container's ``env[].valueFrom.fieldRef`` of an
    ``env.gpupool.io/...`` annotation, or a ``downwardAPI`` volume holding
    such an annotation or all of ``metadata.annotations``.
    """
    ours = f"metadata.annotations['{ENV_ANNOTATION_PREFIX}"
    for c in ob.containers(pod):
        for e in c.get("env") or []:
            path = ((e.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath", "")
            if path.startswith(ours):
                return True
    for v in (pod.get("spec") or {}).get("volumes") or []:
        for item in (v.get("downwardAPI") or {}).get("items") or []:
            path = (item.get("fieldRef") or {}).get("fieldPath", "")
            if path == "metadata.annotations" or path.startswith(ours):
                return True
    return False


def read_pod(pod: Obj) -> KubectlPod:
    """The job spec for a pending kubectl pod (its JSON), or (``problem``) why it cannot be queued."""
    name = ob.name(pod)
    labels = ob.labels(pod)
    ann = ob.annotations_of(pod)
    ref = PodRef(ob.namespace(pod), name, ob.uid(pod))
    project = labels.get(PROJECT_LABEL, "")
    user = labels.get(USER_LABEL) or f"kubectl:{ref.namespace}"
    kind = ann.get(KIND_ANNOTATION, "train")
    first = next(iter(ob.containers(pod)), None)
    command = [*(first.get("command") or []), *(first.get("args") or [])] if first is not None else []
    spec: dict[str, Any] = {"project": project, "kind": kind, "name": name[:200],
                            "labels": {POD_JOB_LABEL: ref.text, POD_UID_JOB_LABEL: ref.uid}}
    if kind == "train":
        image = first.get("image") if first is not None else None
        spec["command"] = command or [f"(pod {ref.text}, image {image or '?'})"]

    def refused(why: str) -> KubectlPod:
        return KubectlPod(ref, project, user, spec, f"gpupool cannot queue this pod: {why}")

    if not project:
        return refused(f"it has no label {PROJECT_LABEL} (the gpupool project it runs in)")
    if kind not in ("train", "build"):
        return refused(f"annotation {KIND_ANNOTATION}={kind!r} is not train or build")
    if gang := gang_refusal(pod):
        return refused(gang)
    if len(config_map_name(name)) > MAX_NAME and names_config_map(pod):
        return refused(f"its name is too long for its ConfigMap {config_map_name(name)[:40]}...")
    whole = gpus_asked(pod)
    given = [f"annotation {n}" for n in (FRACTION_ANNOTATION, MEMORY_ANNOTATION) if n in ann]
    given += [f"{GPU_RESOURCE} limit"] if whole else []
    if len(given) > 1:
        return refused(f"give one of annotation {FRACTION_ANNOTATION}, annotation {MEMORY_ANNOTATION} and an "
                       f"{GPU_RESOURCE} limit, not {' and '.join(given)}")
    if FRACTION_ANNOTATION in ann:
        try:
            spec["gpu_fraction"] = float(ann[FRACTION_ANNOTATION])
        except ValueError:
            return refused(f"annotation {FRACTION_ANNOTATION}={ann[FRACTION_ANNOTATION]!r} is not a number "
                           "(write e.g. \"0.25\")")
    elif MEMORY_ANNOTATION in ann:
        try:
            spec["gpu_memory"] = int(parse_quantity(ann[MEMORY_ANNOTATION]))
        except (ValueError, TypeError):
            return refused(f"annotation {MEMORY_ANNOTATION}={ann[MEMORY_ANNOTATION]!r} is not a size "
                           "(bytes, or e.g. \"20Gi\")")
    elif whole:
        spec["gpus"] = whole
    try:  # its nodeSelector, node affinity and tolerations: placed only where its kubelet admits it
        spec.update(rules_of_pod(pod))
    except Unsupported as e:
        return refused(str(e))
    return KubectlPod(ref, project, user, spec, "")


def _exit_codes(pod: Obj) -> list[int]:
    out = []
    for cs in ob.container_statuses(pod):
        term = ob.terminated(cs)
        code = ob.exit_code(term) if term is not None else None
        if code is not None:
            out.append(code)
    return out


def kubectl_pod_end(pod: Obj) -> PodEnd | None:
    """How a kubectl pod ended (phase Succeeded or Failed, set by its kubelet), or None while it may run.

    Its exit code: 0 when it succeeded, else its first container's non-zero
    code (1 when the kubelet recorded none). Ended on its own: no deletion
    was asked for before the end (a watch delivers changes in order), and no
    other disruption shows (a kubelet's eviction, a ``DisruptionTarget``).
    """
    phase = ob.phase(pod)
    if phase not in ("Succeeded", "Failed"):
        return None
    codes = _exit_codes(pod)
    if phase == "Succeeded":
        code = 0
    else:
        code = next((c for c in codes if c != 0), 1)
    d = disruption(pod)
    return PodEnd(code, d is None, d.what if d is not None else "")


def deleted_end(pod: Obj) -> PodEnd | None:
    """A pod being deleted whose containers all ended: the exit status they left (the kubelet's last word)."""
    codes = _exit_codes(pod)
    n = len(ob.containers(pod))
    if not codes or len(codes) < n:
        return None
    return PodEnd(next((c for c in codes if c != 0), 0), False)
