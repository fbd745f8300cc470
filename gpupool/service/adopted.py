"""Jobs that stand for pods: pods users create with kubectl, and other schedulers' pods as used GPUs.

A mixin of :class:`gpupool.service.core.SchedulerCore`, one job per file,
active only with a backend that has them (the Kubernetes one: ``kubectl`` and
``other_pods``; docs/kubernetes.md). What it adds to the core:

- each pending pod with ``schedulerName: gpupool`` in a namespace gpupool
  takes pods from (``kube_pod_namespaces``), whose project that namespace may
  use, becomes a queued Job of its project (one per pod uid, across restarts: the job's
  ``client_key`` is ``pod:<uid>``), or gets a Warning event saying why not;
  it is re-checked whenever the pods or the projects change;
- such a job is never paused: a reclaim (or its node leaving the pool)
  evicts the pod and the job ends ``cancelled``, since gpupool cannot
  recreate a pod it did not make; a user's pause is refused (409);
- its pod deleted by someone else cancels it; ``gpupool cancel`` deletes it;
- other schedulers' GPU pods are in the policy's snapshot as running work of
  no project (placed around, never paused), in the double-booking guard, and
  in ``GET /pool`` as allocations of "(other scheduler)".
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from gpupool.backends.base import Launch
from gpupool.backends.kubernetes import objects as ob
from gpupool.backends.kubernetes.foreign import POD_JOB_LABEL, POD_UID_JOB_LABEL, PodRef, job_key, read_pod
from gpupool.policy.model import Snapshot
from gpupool.service.actor import Actor
from gpupool.service.attempts import PAUSE_INTENTS
from gpupool.service.store import JobRecord
from gpupool.service.validation import validate_spec
from gpupool.wire.errors import Conflict, InvalidRequest

log = logging.getLogger("gpupool.service")

REQUEUE_NOTE = "its owner (a Job, a Deployment) may recreate it, which queues it again"
STOP_EVENTS = {"preempt": "GpupoolPreempted", "cancel": "GpupoolCancelled", "watchdog": "GpupoolWatchdog",
               "pause": "GpupoolEvicted", "shutdown": "GpupoolEvicted"}


def pod_of(rec: JobRecord) -> PodRef | None:
    """The pod a job stands for (its labels), or None for a job submitted to gpupool."""
    text, uid = rec.labels.get(POD_JOB_LABEL), rec.labels.get(POD_UID_JOB_LABEL)
    if not text or not uid or "/" not in text or rec.client_key != job_key(uid):
        return None
    ns, name = text.split("/", 1)
    return PodRef(ns, name, uid)


def evicted_reason(reason: str) -> str:
    """The policy's pause reason, said of an eviction ("paused to give GPUs back" -> "evicted to give ...")."""
    reason = reason.removesuffix("; requeued")  # a pod gpupool did not make is not requeued
    if reason.startswith("paused "):
        return "evicted " + reason[len("paused "):]
    return f"evicted: {reason}" if reason else "evicted"


class AdoptedPodsMixin:
    """Pods as jobs (state lives on the core; see SchedulerCore.__init__)."""

    backend: Any
    executor: Any
    config: Any
    _store: Any
    _live: dict[str, JobRecord]
    _procs: dict[str, Any]
    _metrics: Any
    _watchdog: Any
    _closing: bool

    # ================================================================ helpers
    def _kubectl_pods(self) -> Any | None:
        return getattr(self.backend, "kubectl", None)

    def _pod_jobs(self) -> dict[str, str]:
        """Pod uid -> its job id ("" when it has none), for every pod looked up so far.

        Only this process makes jobs for pods, so once the store has been asked
        about a pod, memory answers for it: the store is read once per pod.
        """
        index: dict[str, str] | None = getattr(self, "_pod_job_index", None)
        if index is None:
            index = self._pod_job_index = {}
        return index

    def _job_for_pod(self, uid: str) -> str:
        """The job standing for the pod with this uid, of any state ("" when none): never two for one pod."""
        index = self._pod_jobs()
        found = index.get(uid)
        if found is None:
            with self._store.transaction() as db:
                row = db.execute("SELECT id FROM jobs WHERE client_key=? ORDER BY num LIMIT 1",
                                 (job_key(uid),)).fetchone()
            found = index[uid] = str(row[0]) if row is not None else ""
        return found

    # ================================================================ queueing pods (the monitor's tick)
    def _follow_pool(self) -> None:
        super()._follow_pool()  # type: ignore[misc]
        try:
            self._adopt_pods()
        except Exception:  # a bad pod must not stop the monitor
            log.exception("queueing kubectl pods failed")

    def _adopt_pods(self) -> None:
        """Queue new kubectl pods, and end queued jobs whose pod went away; only after a change."""
        kc = self._kubectl_pods()
        if kc is None or not kc.synced or self._closing:
            return
        projects = self._projects()  # type: ignore[attr-defined]
        key = (kc.generation, tuple((p.name, p.train_guarantee_milli) for p in projects.values()),
               len(self._gpus), len(self._nodes))  # type: ignore[attr-defined]
        if getattr(self, "_adopt_seen", None) == key:
            return
        self._adopt_seen = key
        pods = kc.pods()
        for job_id in [j for j in self._pod_jobs().values() if j]:
            rec = self._live.get(job_id)
            ref = pod_of(rec) if rec is not None and rec.state in ("queued", "paused") else None
            if rec is None or ref is None:
                continue
            pod = pods.get(ref.uid)
            if pod is None or ob.being_deleted(pod):
                self._finish(rec, "cancelled",  # type: ignore[attr-defined]
                             f"its pod {ref.text} was deleted before gpupool bound it")
            elif ob.node_name(pod):
                self._finish(rec, "cancelled",  # type: ignore[attr-defined]
                             f"its pod {ref.text} was bound to {ob.node_name(pod)} by someone else")
        index = self._pod_jobs()
        for uid in [u for u, j in index.items() if u not in pods and (not j or j not in self._live)]:
            del index[uid]  # a deleted pod's uid never comes back: forget it
        queued = False
        def oldest_first(p: Any) -> tuple[bool, float, str]:
            created = ob.creation_time(p)
            return created is None, created.timestamp() if created is not None else 0.0, ob.name(p)

        taken = kc.namespaces.takes
        for pod in sorted(pods.values(), key=oldest_first):
            if ob.node_name(pod) or ob.being_deleted(pod) or not taken(ob.namespace(pod)):
                continue  # (a namespace the setting does not name: not ours to queue, nor to warn about)
            if self._job_for_pod(ob.uid(pod)):
                continue
            queued = self._queue_pod(kc, pod, projects) or queued
        if queued:
            self._request_cycle()  # type: ignore[attr-defined]

    def _queue_pod(self, kc: Any, pod: Any, projects: dict[str, Any]) -> bool:
        """One job for this pod, or a Warning event on it saying exactly why not."""
        kp = read_pod(pod)
        problem = kp.problem
        if not problem and (why := kc.namespaces.refusal(kp.ref.namespace, kp.project)):
            problem = f"gpupool cannot queue this pod: {why}"  # the namespace may not use that project
        if problem:
            kc.warn_once(kp.ref, "GpupoolNotQueued", problem)
            return False
        try:
            js = validate_spec(kp.spec, set(projects), self._limits())  # type: ignore[attr-defined]
        except InvalidRequest as e:
            kc.warn_once(kp.ref, "GpupoolNotQueued", f"gpupool cannot queue this pod: {e}")
            return False
        now = time.time()
        job_id = self._insert_new_job(lambda job_id, num: JobRecord(  # type: ignore[attr-defined]
            id=job_id, num=num, name=js.name, project=js.project, user=kp.user, kind=js.kind, state="queued",
            request=js.request(), priority=js.priority, submitted_at=now,
            reason=f"queued from pod {kp.ref.text}", workdir="", command=js.command, labels=js.labels,
            client_key=job_key(kp.ref.uid), lease_expires_at=None,
        )).id
        self._pod_jobs()[kp.ref.uid] = job_id
        kc.register(job_id, kp.ref)
        self._metrics.submitted.labels(js.kind).inc()
        return True

    # ================================================================ attempts of pod jobs
    def _recover(self) -> None:
        """Tell the backend which live jobs are pods' before recovery asks it about them."""
        kc = self._kubectl_pods()
        if kc is not None:
            for rec in self._live.values():
                ref = pod_of(rec)
                if ref is not None:
                    kc.register(rec.id, ref)
                    self._pod_jobs()[ref.uid] = rec.id
        super()._recover()  # type: ignore[misc]
        if kc is None:
            return
        for rec in self._live_jobs(("running",), kind="build"):  # type: ignore[attr-defined]
            if pod_of(rec) is not None and rec.id not in self._procs:  # a build share's pod is watched too
                found = self.executor.recover(rec.id, rec.attempts, None, None)
                if found.outcome == "running" and found.handle is not None:
                    self._procs[rec.id] = found.handle
                elif found.outcome == "not-started":
                    self._requeue_unstarted(rec, "start interrupted by a service restart; requeued")  # type: ignore[attr-defined]
                else:
                    self._finish_attempt(rec, found.exit_code, lost=found.exit_code is None)

    def _start(self, rec: JobRecord, starts: Any) -> None:
        """A pod's build share is bound like a training pod (a build job otherwise starts nothing)."""
        super()._start(rec, starts)  # type: ignore[misc]
        if rec.kind != "build" or pod_of(rec) is None:
            return
        fresh = self._job(rec.id)  # type: ignore[attr-defined]
        if fresh is None or fresh.state != "running":
            return
        self._update(rec.id, lease_expires_at=None)  # type: ignore[attr-defined]  # it lives as long as its pod
        launch = Launch(rec.id, fresh.attempts, [], "", rec.user, rec.project, {}, dict(fresh.env),
                        dict(fresh.assignment or {}))
        try:
            self._procs[rec.id] = self.executor.launch(launch)
        except Exception as e:
            self._finish(fresh, "failed", f"could not start: {e}")  # type: ignore[attr-defined]

    def _begin_stop(self, rec: JobRecord, intent: str, reason: str) -> None:
        """Before a pod's job is stopped, say on the pod why (``kubectl describe pod`` shows it)."""
        kc = self._kubectl_pods()
        ref = pod_of(rec)
        if kc is not None and ref is not None:
            if intent in ("preempt", "pause", "shutdown"):
                message = f"{evicted_reason(reason)}; {REQUEUE_NOTE}"
            else:
                message = reason
            kc.note_stop(rec.id, STOP_EVENTS.get(intent, "GpupoolEvicted"), f"gpupool: {message}")
        super()._begin_stop(rec, intent, reason)  # type: ignore[misc]

    def _finish_attempt(self, rec: JobRecord, code: int | None, lost: bool = False,
                        lost_reason: str = "process lost during restart; requeued") -> None:
        """A pod's job is never paused: evicted or lost, it ends cancelled (its pod is not ours to recreate)."""
        ref = pod_of(rec)
        if ref is None:
            super()._finish_attempt(rec, code, lost, lost_reason)  # type: ignore[misc]
            return
        intent = rec.stop_intent
        if intent is not None and code is not None and self.executor.ended_on_its_own(rec.id, rec.attempts):
            intent = None  # it finished before the eviction reached it: its own status wins
        if intent in PAUSE_INTENTS:
            self._watchdog.forget(rec.id)
            self._finish(rec, "cancelled", f"{evicted_reason(rec.reason)}; {REQUEUE_NOTE}",  # type: ignore[attr-defined]
                         exit_code=code)
        elif intent is None and lost:
            self._watchdog.forget(rec.id)
            why = lost_reason if lost_reason.startswith("its pod") else (
                f"its pod {ref.text} was gone when the scheduler restarted; gpupool does not recreate it")
            self._finish(rec, "cancelled", why)  # type: ignore[attr-defined]
        else:
            super()._finish_attempt(rec, code, lost, lost_reason)  # type: ignore[misc]

    def _finish(self, rec: JobRecord, state: str, reason: str, exit_code: int | None = None, **more: Any) -> None:
        """As for any job; a pod whose job the policy rejects is told why (it stays Pending, never bound)."""
        super()._finish(rec, state, reason, exit_code=exit_code, **more)  # type: ignore[misc]
        kc = self._kubectl_pods()
        ref = pod_of(rec)
        if state == "rejected" and kc is not None and ref is not None:
            kc.warn_once(ref, "GpupoolRejected", f"gpupool rejected job {rec.id} for this pod: {reason}")

    # ================================================================ what users may do to them
    async def pause(self, actor: Actor, job_id: str) -> dict[str, Any]:
        rec = self._owned(actor, job_id, "pause")  # type: ignore[attr-defined]
        ref = pod_of(rec)
        if ref is not None and rec.live:
            raise Conflict(f"job {rec.id} stands for pod {ref.text}, which gpupool did not create and could not "
                           "recreate after a pause; cancel the job (it deletes the pod) or delete the pod")
        return await super().pause(actor, job_id)  # type: ignore[misc,no-any-return]

    async def cancel(self, actor: Actor, job_id: str) -> dict[str, Any]:
        """As for any job; a pod's job that was not running (or a build share) also deletes its pod."""
        rec = self._owned(actor, job_id, "cancel")  # type: ignore[attr-defined]
        ref, before, kind = pod_of(rec), rec.state, rec.kind
        out = await super().cancel(actor, job_id)  # type: ignore[misc]
        kc = self._kubectl_pods()
        if kc is not None and ref is not None and (before in ("queued", "paused") or kind == "build"):
            kc.delete_pod(ref, self.config.pause_grace_s, "GpupoolCancelled",
                          f"gpupool: job {rec.id} cancelled by {actor.user}; its pod is deleted")
        return out  # type: ignore[no-any-return]

    # ================================================================ other schedulers' pods
    def _other_holdings(self) -> tuple[Any, ...]:
        other = getattr(self.backend, "other_pods", None)
        return other.holdings if other is not None else ()

    def _snapshot(self, live: list[JobRecord], hold_stopping: bool = False) -> Snapshot:
        snap: Snapshot = super()._snapshot(live, hold_stopping)  # type: ignore[misc]
        other = getattr(self.backend, "other_pods", None)
        if other is None or not other.holdings:
            return snap
        return dataclasses.replace(snap, workloads=snap.workloads + other.workloads())

    def _allocations(self, running: list[JobRecord] | None = None) -> dict[str, int]:
        used: dict[str, int] = super()._allocations(running)  # type: ignore[misc]
        for h in self._other_holdings():
            for gid in h.gpu_ids:
                used[gid] = used.get(gid, 0) + 1000
        return used

    def pool(self) -> dict[str, Any]:
        """The Pool, with other schedulers' pods as allocations ("(other scheduler)", user ``ns/name``)."""
        view: dict[str, Any] = super().pool()  # type: ignore[misc]
        holdings = self._other_holdings()
        if not holdings:
            return view
        by_gpu: dict[str, list[str]] = {}
        for h in holdings:
            for gid in h.gpu_ids:
                by_gpu.setdefault(gid, []).append(h.pod.text)
        for node in view["nodes"]:
            for g in node["gpus"]:
                for text in by_gpu.get(g["id"], []):
                    g["allocations"].append({"job_id": "-", "project": "(other scheduler)", "user": text,
                                             "kind": "other", "fraction": 1, "pod": text})
                    g["allocated"] = round(g["allocated"] + 1, 3)
        return view
