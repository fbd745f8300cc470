"""batch/v1 Jobs and JobSets labelled ``gpupool.io/project``, queued as gpupool jobs (the core's side of :mod:`.batch_jobs`).

One gpupool job per Job (its ``client_key`` is ``batchjob:<uid>``, a
JobSet's ``jobset:<uid>``, so a restart never queues it twice): kind
``train``, named ``namespace/name``, ``parallelism`` replicas
(``min(parallelism, completions)``; for a JobSet, that times ``replicas``,
summed over its replicated jobs) of the pod template's whole GPUs each (the
same in every template), one all-or-nothing gang under the project's
quota. Unlike a kubectl pod's job it *can* be paused: the Job is suspended
and unsuspended later, so the core treats it as its own job (``stands_for``
answers None); only queueing, cancelling and the words on the Job are here.

:class:`Adoptions` puts this beside the kubectl pods' :class:`.adoption.PodAdoption`
as the backend's one :class:`gpupool.backends.base.ForeignWork`.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, Protocol

from gpupool.backends.base import ForeignJobHost, ForeignWork, JobFacts
from gpupool.backends.kubernetes import objects as ob
from gpupool.backends.kubernetes.batch_jobs import BatchJobs
from gpupool.backends.kubernetes.batch_objects import JobRef, finished, post_job_event, suspended
from gpupool.backends.kubernetes.dra_allocation import with_affinity
from gpupool.backends.kubernetes.dra_claims import Ask, ClaimProblem, uses_claims
from gpupool.backends.kubernetes.dra_slices import DRA_NODE_LABEL
from gpupool.backends.kubernetes.foreign import USER_LABEL, gpus_asked
from gpupool.backends.kubernetes.names import PROJECT_LABEL
from gpupool.backends.kubernetes.objects import Obj
from gpupool.backends.kubernetes.pod_placement import Unsupported, rules_of_pod
from gpupool.wire.errors import InvalidRequest

BATCH_JOB_LABEL = "gpupool.io/batch-job"
"""On the gpupool job: ``<namespace>/<name>`` of the Job it stands for."""
BATCH_UID_LABEL = "gpupool.io/batch-job-uid"
JOBSET_LABEL = "gpupool.io/jobset"
"""On the gpupool job: ``<namespace>/<name>`` of the JobSet it stands for."""
JOBSET_UID_JOB_LABEL = "gpupool.io/jobset-uid"
_LABELS = {"Job": (BATCH_JOB_LABEL, BATCH_UID_LABEL), "JobSet": (JOBSET_LABEL, JOBSET_UID_JOB_LABEL)}


def job_key(uid: str, kind: str = "Job") -> str:
    return f"batchjob:{uid}" if kind == "Job" else f"jobset:{uid}"


def ref_of(job: JobFacts) -> JobRef | None:
    """The Job (JobSet) a gpupool job stands for (its labels), or None."""
    for kind, (name_label, uid_label) in _LABELS.items():
        text, uid = job.labels.get(name_label), job.labels.get(uid_label)
        if text and uid and "/" in text and job.client_key == job_key(uid, kind):
            ns, name = text.split("/", 1)
            return JobRef(ns, name, uid, kind)
    return None


def _pods_of_job(job_spec: Obj) -> int:
    """How many pods a Job runs at once: ``min(parallelism, completions)`` (parallelism defaults to 1)."""
    parallelism = job_spec.get("parallelism")
    parallelism = 1 if parallelism is None else int(parallelism)
    completions = job_spec.get("completions")
    return parallelism if completions is None else min(parallelism, int(completions))


CLAIMS_NOT_YET = ("its pod template claims devices through DRA (resourceClaims), and this gpupool reads no "
                  "ResourceClaimTemplates: ask for nvidia.com/gpu")


class TemplateClaims(Protocol):
    """What a pod template's DRA claims ask for (:class:`.dra_templates.DraTemplates`)."""

    def ask(self, namespace: str, pod_template: Obj) -> Ask: ...

    def any_nodes(self) -> bool: ...


def _template_gpus(what: str, namespace: str, template: Obj,
                   claims: TemplateClaims | None) -> tuple[int, dict[str, Any] | None, str]:
    """(whole GPUs per pod, the node-affinity expression its GPUs add or None, why not or "").

    A template with ``resourceClaims`` gets its GPUs from its claim templates
    (and may land only on nodes of the kinds their selectors accept); one with
    ``nvidia.com/gpu`` is kept off the nodes whose GPUs come from ResourceSlices.
    """
    if not uses_claims(template):
        off = claims is not None and claims.any_nodes()
        return gpus_asked(template), ({"key": DRA_NODE_LABEL, "operator": "DoesNotExist"} if off else None), ""
    if claims is None:
        return 0, None, f"gpupool cannot admit this {what}: {CLAIMS_NOT_YET}"
    if gpus_asked(template):
        return 0, None, (f"gpupool cannot admit this {what}: its pod template asks for GPUs both through "
                         "resourceClaims and a nvidia.com/gpu limit; give one of them")
    try:
        ask = claims.ask(namespace, template)
    except ClaimProblem as e:
        return 0, None, f"gpupool cannot place this {what}'s claims: {e}; checked again when they change"
    return ask.gpus, ask.node_affinity(), ""


def read_jobset(js: Obj, scheduler_name: str,
                claims: TemplateClaims | None = None) -> tuple[dict[str, Any], str, str]:
    """(the job spec, its user, why it cannot be queued or "") for a JobSet labelled with a project.

    Its replicated jobs' pods together are one gang: each replicated job's
    ``replicas`` x its pods at once, every pod on the same whole GPUs (asked
    through ``nvidia.com/gpu`` or DRA claims, on the same kinds of nodes).
    """
    ref = JobRef(ob.namespace(js), ob.name(js), ob.uid(js), "JobSet")
    labels = ob.labels(js)
    project = labels.get(PROJECT_LABEL, "")
    user = labels.get(USER_LABEL) or f"kubectl:{ref.namespace}"
    spec: dict[str, Any] = {"project": project, "kind": "train", "name": ref.text[:200],
                            "command": [f"(JobSet {ref.text})"],
                            "labels": {JOBSET_LABEL: ref.text, JOBSET_UID_JOB_LABEL: ref.uid}}
    pods, sizes, rules, wheres = 0, set[int](), None, set[str]()
    where: dict[str, Any] | None = None
    for rj in ob.spec(js).get("replicatedJobs") or []:
        job_spec = (rj.get("template") or {}).get("spec") or {}
        template = job_spec.get("template") or {}
        name = rj.get("name", "?")
        if (ob.spec(template).get("schedulerName") or "default-scheduler") != scheduler_name:
            return spec, user, (f"gpupool cannot admit this JobSet: the pod template of replicated job {name} has "
                                f"no schedulerName: {scheduler_name}")
        gpus, where, problem = _template_gpus(f"JobSet (replicated job {name})", ref.namespace, template, claims)
        if problem:
            return spec, user, problem
        pods += int(rj.get("replicas", 1) or 0) * _pods_of_job(job_spec)
        sizes.add(gpus)
        wheres.add(repr(where))
        try:
            rules = rules if rules is not None else rules_of_pod(template)
        except Unsupported as e:
            return spec, user, f"gpupool cannot admit this JobSet: {e}"
    if pods < 1:
        return spec, user, "gpupool cannot admit this JobSet: it runs no pods"
    if len(sizes) != 1 or min(sizes) < 1:
        return spec, user, ("gpupool cannot admit this JobSet: every pod template must ask for the same number of "
                            f"whole nvidia.com/gpu (at least 1), not {sorted(sizes)}")
    if len(wheres) != 1:
        return spec, user, ("gpupool cannot admit this JobSet: its pod templates claim GPUs differently (DRA claims "
                            "whose selectors accept different nodes, or claims beside nvidia.com/gpu); one gang "
                            "asks for the same GPUs in every pod")
    spec["gpus"] = sizes.pop()
    if pods > 1:
        spec["replicas"] = pods
    spec.update(rules or {})
    if where is not None:
        spec.update(with_affinity(spec, where))
    return spec, user, ""


def read_job(job: Obj, scheduler_name: str, claims: TemplateClaims | None = None) -> tuple[dict[str, Any], str, str]:
    """(the job spec, its user, why it cannot be queued or "") for a Job labelled with a project.

    ``claims`` reads a template's DRA claims (None: a template with claims is refused).
    """
    ref = JobRef(ob.namespace(job), ob.name(job), ob.uid(job))
    labels = ob.labels(job)
    project = labels.get(PROJECT_LABEL, "")
    user = labels.get(USER_LABEL) or f"kubectl:{ref.namespace}"
    template = ob.spec(job).get("template") or {}
    first: Any = next(iter(ob.containers(template)), None)
    image = first.get("image") if first is not None else None
    replicas = _pods_of_job(ob.spec(job))
    spec: dict[str, Any] = {"project": project, "kind": "train", "name": ref.text[:200],
                            "command": [f"(Job {ref.text}, image {image or '?'})"],
                            "labels": {BATCH_JOB_LABEL: ref.text, BATCH_UID_LABEL: ref.uid}}
    if (ob.spec(template).get("schedulerName") or "default-scheduler") != scheduler_name:
        return spec, user, (f"gpupool cannot admit this Job: its pod template has no schedulerName: "
                            f"{scheduler_name} (a suspended Job's schedulerName cannot be changed: recreate it)")
    if replicas < 1:
        return spec, user, "gpupool cannot admit this Job: its parallelism is 0"
    gpus, where, problem = _template_gpus("Job", ref.namespace, template, claims)
    if problem:
        return spec, user, problem
    if gpus < 1:
        return spec, user, ("gpupool cannot admit this Job: its pod template asks for no nvidia.com/gpu "
                            "(a Job is admitted as whole GPUs per pod)")
    spec["gpus"] = gpus
    if replicas > 1:
        spec["replicas"] = replicas
    try:
        spec.update(rules_of_pod(template))
    except Unsupported as e:
        return spec, user, f"gpupool cannot admit this Job: {e}"
    if where is not None:
        spec.update(with_affinity(spec, where))
    return spec, user, ""


def _claims_in(job: Obj) -> bool:
    """Whether a Job's (JobSet's) pod templates claim devices through DRA."""
    templates = [ob.spec(job).get("template") or {}]
    templates += [((rj.get("template") or {}).get("spec") or {}).get("template") or {}
                  for rj in ob.spec(job).get("replicatedJobs") or []]
    return any(uses_claims(t) for t in templates)


class JobAdoption:
    """Jobs labelled with a project as gpupool jobs, on the core's loop."""

    def __init__(self, batch: BatchJobs, scheduler_name: str) -> None:
        self.batch = batch
        self.scheduler_name = scheduler_name
        self._job_ids: dict[str, str] = {}  # Job uid -> gpupool job id ("" = none)
        self._warned: set[tuple[str, str]] = set()
        self._seen: Hashable = None
        self.claims: TemplateClaims | None = None
        """Reads pod templates' DRA claims (set where the cluster's DRA is watched; None refuses them)."""
        self.claims_changes: Callable[[], Hashable] = lambda: None
        """Moves when a ResourceClaimTemplate, DeviceClass or node's devices change: Jobs that wait are read again."""
        self.claims_synced: Callable[[], bool] = lambda: True

    def track(self, job: JobFacts) -> None:
        ref = ref_of(job)
        if ref is not None:
            self.batch.register(job.id, ref)
            self._job_ids[ref.uid] = job.id

    def _warn_once(self, ref: JobRef, reason: str, message: str) -> None:
        if (ref.uid, message) not in self._warned:
            self._warned.add((ref.uid, message))
            self.batch.calls.submit(post_job_event, self.batch.api, ref, "Warning", reason, message)

    def _job_for(self, host: ForeignJobHost, uid: str, kind: str) -> str:
        found = self._job_ids.get(uid)
        if found is None:
            found = self._job_ids[uid] = host.job_for_key(job_key(uid, kind))
        return found

    def sync(self, host: ForeignJobHost) -> None:
        """Queue new Jobs, suspend Jobs running unadmitted, end waiting jobs whose Job went away."""
        b = self.batch
        if not b.synced or not b.kubectl.synced:
            return
        jobs = b.jobs()
        for uid, job_id in list(self._job_ids.items()):  # every tick, so a requeue never starts it again first
            if job_id and uid not in jobs and host.is_live(job_id):
                ref = b.ref(job_id)
                what = f"{ref.kind} {ref.text}" if ref is not None else "Job"
                host.cancel(job_id, f"its {what} was deleted outside gpupool")
                b.abandon(job_id)  # its attempt, if one runs, is over: nothing of it is left to stop
                del self._job_ids[uid]
        key = (b.generation, host.fingerprint(), self.claims_changes())
        if self._seen == key:
            return
        self._seen = key
        queued = False
        namespaces = b.kubectl.namespaces
        for kind, job in sorted(jobs.values(), key=lambda kj: (ob.creation_time(kj[1]) is None, ob.name(kj[1]))):
            ref = JobRef(ob.namespace(job), ob.name(job), ob.uid(job), kind)
            if finished(job) is not None or ob.being_deleted(job) or not namespaces.takes(ref.namespace):
                continue
            job_id = self._job_for(host, ref.uid, kind)
            if not suspended(job) and not (job_id and b.running(job_id)):
                b.suspend_job(ref)  # created running (or unsuspended by someone else): gpupool admits it
                self._warn_once(ref, "GpupoolSuspended", f"gpupool suspended this {kind} until it admits it; "
                                f"create {kind}s with spec.suspend: true so no pod starts before admission")
            if job_id:
                continue
            if not self.claims_synced() and _claims_in(job):
                self._seen = None  # read again once the DRA watches have listed everything
                continue
            spec, user, problem = (read_job if kind == "Job" else read_jobset)(job, self.scheduler_name,
                                                                                self.claims)
            if not problem and (why := namespaces.refusal(ref.namespace, spec["project"])):
                problem = f"gpupool cannot admit this {kind}: {why}"
            if not problem:
                try:
                    job_id = host.queue(spec, user, f"queued from {kind} {ref.text}", job_key(ref.uid, kind))
                except InvalidRequest as e:
                    problem = f"gpupool cannot admit this {kind}: {e}"
            if problem:
                self._warn_once(ref, "GpupoolNotQueued", problem)
                continue
            self._job_ids[ref.uid] = job_id
            b.register(job_id, ref)
            queued = True
        if queued:
            host.request_cycle()

    def stopping(self, job: JobFacts, intent: str, reason: str) -> None:
        ref = ref_of(job)
        if ref is None:
            return
        self.batch.intents[job.id] = intent
        word = "deleted" if intent == "cancel" else "suspended"
        self.batch.calls.submit(post_job_event, self.batch.api, ref, "Normal", "GpupoolStopped",
                                f"gpupool: {reason}; the {ref.kind} is {word}")

    def rejected(self, job: JobFacts, reason: str) -> None:
        ref = ref_of(job)
        if ref is not None:
            self._warn_once(ref, "GpupoolRejected", f"gpupool rejected job {job.id} for this {ref.kind}: {reason}")

    def cancelled(self, job: JobFacts, by: str, grace_s: float) -> None:
        ref = ref_of(job)
        if ref is not None:
            self.batch.delete_job(ref)


class Adoptions:
    """kubectl pods, labelled Jobs and PodGroups' gangs together, as the backend's one ForeignWork.

    The pods' jobs and the PodGroups' gang jobs "stand for" foreign work in
    the core's sense (never paused); a Job's job is paused and resumed like gpupool's own.
    """

    def __init__(self, pods: ForeignWork, jobs: JobAdoption, gangs: ForeignWork | None = None) -> None:
        self.pods = pods
        self.jobs = jobs
        self.gangs = gangs

    def _foreign(self, job: JobFacts) -> ForeignWork:
        """Which of the never-paused kinds a job is (the pods' when it is no gang's)."""
        return self.gangs if self.gangs is not None and self.gangs.stands_for(job) else self.pods

    def _all(self) -> list[Any]:
        return [w for w in (self.pods, self.jobs, self.gangs) if w is not None]

    def stands_for(self, job: JobFacts) -> str | None:
        return self._foreign(job).stands_for(job)

    def track(self, job: JobFacts) -> None:
        for w in self._all():
            w.track(job)

    def sync(self, host: ForeignJobHost) -> None:
        self.jobs.sync(host)
        if self.gangs is not None:
            self.gangs.sync(host)
        self.pods.sync(host)

    def on_new_work(self, wake: Callable[[], None]) -> None:
        """The kubectl pods' watch wakes the core (a gang's pods are kubectl pods too); labelled Jobs wait a poll."""
        self.pods.on_new_work(wake)
        if self.gangs is not None:
            self.gangs.on_new_work(wake)

    def stopping(self, job: JobFacts, intent: str, reason: str) -> None:
        for w in self._all():
            w.stopping(job, intent, reason)

    def rejected(self, job: JobFacts, reason: str) -> None:
        for w in self._all():
            w.rejected(job, reason)

    def cancelled(self, job: JobFacts, by: str, grace_s: float) -> None:
        for w in self._all():
            w.cancelled(job, by, grace_s)

    def evicted_reason(self, job: JobFacts) -> str:
        return self._foreign(job).evicted_reason(job)

    def lost_reason(self, job: JobFacts, reason: str) -> str:
        return self._foreign(job).lost_reason(job, reason)

    def pause_refusal(self, job: JobFacts) -> str:
        return self._foreign(job).pause_refusal(job)
