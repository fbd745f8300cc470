"""Pods users create with kubectl, as jobs: the Kubernetes backend's :class:`gpupool.backends.base.ForeignWork`.

Each pending pod with ``schedulerName: gpupool`` in a namespace gpupool takes
pods from (``kube_pod_namespaces``), whose project that namespace may use,
becomes a queued Job of its project (one per pod uid, across restarts: the
job's ``client_key`` is ``pod:<uid>``), or gets a Warning event saying why not;
it is re-checked whenever the pods or the projects change (docs/kubernetes.md,
"Pods you create with kubectl").

The core owns such a job's states (gpupool/service/foreign.py): it is never
paused, since gpupool cannot recreate a pod it did not make, so a reclaim
(or its node leaving the pool) evicts the pod and the job ends
``cancelled``, and a user's pause is refused (409). This side knows the
pods: which job stands for which, the events that tell a pod's author what
happened, and deleting a pod whose job was cancelled before it ran. The
watching, binding and attempts of such pods are
:class:`gpupool.backends.kubernetes.foreign_jobs.KubectlPods`.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable
from typing import Any

from gpupool.backends.base import ForeignJobHost, JobFacts
from gpupool.backends.kubernetes import objects as ob
from gpupool.backends.kubernetes.foreign import (
    POD_JOB_LABEL,
    POD_UID_JOB_LABEL,
    KubectlPod,
    PodRef,
    job_key,
    read_pod,
)
from gpupool.backends.kubernetes.foreign_jobs import KubectlPods
from gpupool.backends.kubernetes.gates import other_gates
from gpupool.backends.kubernetes.objects import Obj
from gpupool.wire.errors import InvalidRequest

FULL_PASS_S = 30.0
"""Longest time between two passes over every kubectl pod while pods change (else only the changed ones)."""
REQUEUE_NOTE = "its owner (a Job, a Deployment) may recreate it, which queues it again"
STOP_EVENTS = {"preempt": "GpupoolPreempted", "cancel": "GpupoolCancelled", "watchdog": "GpupoolWatchdog",
               "pause": "GpupoolEvicted", "shutdown": "GpupoolEvicted"}


def pod_of(job: JobFacts) -> PodRef | None:
    """The pod a job stands for (its labels), or None for a job submitted to gpupool."""
    text, uid = job.labels.get(POD_JOB_LABEL), job.labels.get(POD_UID_JOB_LABEL)
    if not text or not uid or "/" not in text or job.client_key != job_key(uid):
        return None
    ns, name = text.split("/", 1)
    return PodRef(ns, name, uid)


def evicted_reason(reason: str) -> str:
    """The policy's pause reason, said of an eviction ("paused to give GPUs back" -> "evicted to give ...")."""
    reason = reason.removesuffix("; requeued")  # a pod gpupool did not make is not requeued
    if reason.startswith("paused "):
        return "evicted " + reason[len("paused "):]
    return f"evicted: {reason}" if reason else "evicted"


def _oldest_first(p: Obj) -> tuple[bool, float, str]:
    created = ob.creation_time(p)
    return created is None, created.timestamp() if created is not None else 0.0, ob.name(p)


class PodAdoption:
    """kubectl pods as jobs, on the core's loop (a :class:`gpupool.backends.base.ForeignWork`)."""

    def __init__(self, kubectl: KubectlPods) -> None:
        self.kubectl = kubectl
        self._pod_jobs: dict[str, str] = {}
        """Pod uid -> its job id ("" when it has none), for every pod looked up so far.

        Only this process makes jobs for pods, so once the store has been
        asked about a pod, memory answers for it: the store is read once per pod."""
        self._seen: Hashable = None  # what the last queueing looked at: nothing changed, nothing to do
        self._outer: Hashable = None  # the core's fingerprint at the last full pass
        self._claims: Hashable = None  # claims_changes() when pods waiting on claims were last read again
        self._full_at = float("-inf")  # when that was (time.monotonic)
        self.made_elsewhere: Callable[[Obj], bool] = lambda pod: False
        """Pods that are another adoption's (a labelled Job's pods): never queued on their own."""
        self.read_claims: Callable[[Obj, KubectlPod], KubectlPod | None] | None = None
        """A pod's GPUs on a cluster with DRA nodes (its ResourceClaims, or the nodes its nvidia.com/gpu limit
        can go to) into its job spec; None: it waits, or was told why not (dra_allocation.py)."""
        self.claims_changes: Callable[[], Hashable] = lambda: 0
        """Moves when claims, classes or slices change: pods waiting on them are read again."""

    def stands_for(self, job: JobFacts) -> str | None:
        ref = pod_of(job)
        return ref.text if ref is not None else None

    def track(self, job: JobFacts) -> None:
        """Tell the executor which live jobs are pods' before recovery asks it about them."""
        ref = pod_of(job)
        if ref is not None:
            self.kubectl.register(job.id, ref)
            self._pod_jobs[ref.uid] = job.id

    def _job_for_pod(self, host: ForeignJobHost, uid: str) -> str:
        """The job standing for the pod with this uid, of any state ("" when none): never two for one pod."""
        found = self._pod_jobs.get(uid)
        if found is None:
            found = self._pod_jobs[uid] = host.job_for_key(job_key(uid))
        return found

    # ------------------------------------------------------------ queueing pods (the monitor's tick)
    def on_new_work(self, wake: Callable[[], None]) -> None:
        self.kubectl.new_work = wake

    def sync(self, host: ForeignJobHost) -> None:
        """Queue new kubectl pods, and end queued jobs whose pod went away; only after a change.

        Between full passes only the pods the watch changed are looked at: a
        tick costs what changed, not every kubectl pod (tens of thousands at a
        cluster's scale, each tick while pods arrive). A full pass comes after a
        relist, when what a pod's validity depends on changes (projects, pool
        size), and at least every ``FULL_PASS_S`` while pods change. A change of
        claims, classes or slices (two claim events per claimed pod) reads again
        only the pods not queued yet that use claims: those waiting on them.
        """
        kc = self.kubectl
        if not kc.synced:
            return
        claims, outer = self.claims_changes(), host.fingerprint()
        key = (kc.generation, claims, outer)
        if self._seen == key:
            return
        self._seen = key
        touched = kc.take_touched()
        now = time.monotonic()
        if touched is None or outer != self._outer or now - self._full_at >= FULL_PASS_S:
            self._outer, self._claims, self._full_at = outer, claims, now
            self._look(host, kc.pods(), None)
            return
        if claims != self._claims:
            self._claims = claims
            known = self._pod_jobs
            touched |= {uid for uid, pod in kc.pods().items()
                        if not known.get(uid) and ob.spec(pod).get("resourceClaims")}
        self._look(host, kc.pods_of(touched), touched)

    def _look(self, host: ForeignJobHost, pods: dict[str, Obj], uids: set[str] | None) -> None:
        """The pass over the pods with these ``uids`` (``pods``: those that exist), or over every pod (None)."""
        known = self._pod_jobs
        looked = list(known) if uids is None else [u for u in uids if u in known]
        for uid in looked:
            job_id = known[uid]
            job = host.waiting_job(job_id) if job_id else None
            ref = pod_of(job) if job is not None else None
            if job is None or ref is None:
                continue
            pod = pods.get(ref.uid)
            if pod is None or ob.being_deleted(pod):
                host.cancel(job_id, f"its pod {ref.text} was deleted before gpupool bound it")
            elif ob.node_name(pod):
                host.cancel(job_id, f"its pod {ref.text} was bound to {ob.node_name(pod)} by someone else")
        for uid in [u for u in looked if u not in pods and (not known[u] or not host.is_live(known[u]))]:
            del known[uid]  # a deleted pod's uid never comes back: forget it
        queued = False
        taken = self.kubectl.namespaces.takes
        new = [p for p in pods.values() if not known.get(ob.uid(p))]  # a pod with a job: nothing to queue
        for pod in sorted(new, key=_oldest_first):
            if ob.node_name(pod) or ob.being_deleted(pod) or not taken(ob.namespace(pod)):
                continue  # (a namespace the setting does not name: not ours to queue, nor to warn about)
            if self.made_elsewhere(pod):
                continue
            if other_gates(pod):
                continue  # another tool's scheduling gate: not ready for any scheduler yet (gates.py)
            if self._job_for_pod(host, ob.uid(pod)):
                continue
            queued = self._queue_pod(host, pod) or queued
        if queued:
            host.request_cycle()

    def _queue_pod(self, host: ForeignJobHost, pod: Any) -> bool:
        """One job for this pod, or a Warning event on it saying exactly why not."""
        kc = self.kubectl
        kp = read_pod(pod)
        if not kp.problem and self.read_claims is not None:
            amended = self.read_claims(pod, kp)
            if amended is None:
                return False
            kp = amended
        problem = kp.problem
        if not problem and (why := kc.namespaces.refusal(kp.ref.namespace, kp.project)):
            problem = f"gpupool cannot queue this pod: {why}"  # the namespace may not use that project
        if problem:
            kc.warn_once(kp.ref, "GpupoolNotQueued", problem)
            return False
        try:
            job_id = host.queue(kp.spec, kp.user, f"queued from pod {kp.ref.text}", job_key(kp.ref.uid))
        except InvalidRequest as e:
            kc.warn_once(kp.ref, "GpupoolNotQueued", f"gpupool cannot queue this pod: {e}")
            return False
        self._pod_jobs[kp.ref.uid] = job_id
        kc.register(job_id, kp.ref)
        return True

    # ------------------------------------------------------------ what happens to their jobs
    def stopping(self, job: JobFacts, intent: str, reason: str) -> None:
        """Before a pod's job is stopped, say on the pod why (``kubectl describe pod`` shows it)."""
        ref = pod_of(job)
        if ref is None:
            return
        if intent in ("preempt", "pause", "shutdown"):
            message = f"{evicted_reason(reason)}; {REQUEUE_NOTE}"
        else:
            message = reason
        self.kubectl.note_stop(job.id, STOP_EVENTS.get(intent, "GpupoolEvicted"), f"gpupool: {message}")

    def rejected(self, job: JobFacts, reason: str) -> None:
        """A pod whose job the policy rejects is told why (it stays Pending, never bound)."""
        ref = pod_of(job)
        if ref is not None:
            self.kubectl.warn_once(ref, "GpupoolRejected", f"gpupool rejected job {job.id} for this pod: {reason}")

    def cancelled(self, job: JobFacts, by: str, grace_s: float) -> None:
        """A pod's job cancelled before it ran (or a build share): its pod is deleted."""
        ref = pod_of(job)
        if ref is not None:
            self.kubectl.delete_pod(ref, grace_s, "GpupoolCancelled",
                                    f"gpupool: job {job.id} cancelled by {by}; its pod is deleted")

    def evicted_reason(self, job: JobFacts) -> str:
        return f"{evicted_reason(job.reason)}; {REQUEUE_NOTE}"

    def lost_reason(self, job: JobFacts, reason: str) -> str:
        if reason.startswith("its pod"):
            return reason  # the executor's own words: deleted, or its node lost
        ref = pod_of(job)
        text = ref.text if ref is not None else "?"
        return f"its pod {text} was gone when the scheduler restarted; gpupool does not recreate it"

    def pause_refusal(self, job: JobFacts) -> str:
        ref = pod_of(job)
        text = ref.text if ref is not None else "?"
        return (f"job {job.id} stands for pod {text}, which gpupool did not create and could not "
                "recreate after a pause; cancel the job (it deletes the pod) or delete the pod")
