"""batch/v1 Jobs and JobSets labelled ``gpupool.io/project``, admitted by gpupool as one gang each (docs/kubernetes.md).

A team creates its Job suspended; gpupool queues one gpupool job for it (the
pod template's whole GPUs per replica, ``parallelism`` replicas: one
all-or-nothing gang, :mod:`gpupool.backends.kubernetes.batch_adoption`) and
this is that job's executor, in the way Kueue admits a Job:

- **start** (admission) = one patch of the Job: ``spec.suspend: false``, the
  chosen nodes in an annotation of the Job (found again after a restart), and
  on the pod template the annotation ``gpupool.io/resume`` (``"1"`` from the
  second attempt on: the resume signal a container reads through the
  downward API as ``GPUPOOL_RESUME``). The Job controller then makes the pods
  (template ``schedulerName: gpupool``) and gpupool binds each pending one to
  a free replica slot of the placement, through ``pods/binding``;
- a pod template that claims GPUs through a ResourceClaimTemplate (DRA):
  before each pod is bound, the GPUs the policy chose for its replica slot
  are written into the pod's own claim (``before_bind``,
  :mod:`gpupool.backends.kubernetes.dra_templates`); the slots' GPUs are in
  an annotation of the Job too, for a restart;
- **stop** (pause, reclaim) = ``spec.suspend: true``: the Job controller
  deletes the pods with their grace period (SIGTERM, the checkpoint signal)
  and clears the Job's start time; a later attempt unsuspends it again;
- **cancel** = delete the Job (propagation Background: the garbage collector
  deletes its pods);
- **end** = the Job's ``Complete`` (exit code 0) or ``Failed`` (1) condition.

A JobSet (``jobset.x-k8s.io/v1alpha2``, watched when its CRD is served) is
admitted the same way through its own ``spec.suspend``: the JobSet controller
suspends and unsuspends its child Jobs, and on a resume copies the
replicated jobs' pod template annotations (``gpupool.io/resume``) into them;
its pods carry the label ``jobset.sigs.k8s.io/jobset-uid``. It ends with its
``Completed`` or ``Failed`` condition.

The pods are the Job controller's: they are watched by the kubectl-pod watch
(:class:`gpupool.backends.kubernetes.foreign_jobs.KubectlPods`, which sees every pod naming
gpupool), never queued as kubectl pods of their own (``owns_pod``).
"""

from __future__ import annotations

import asyncio
import copy
import datetime as dt
import functools
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpupool.backends.base import Interrupted, Launch, Recovered
from gpupool.backends.kubernetes import objects as ob
from gpupool.backends.kubernetes.admitted_gang import AdmittedGang
from gpupool.backends.kubernetes.batch_objects import (
    ADMITTED_ANNOTATION,
    GPUS_ANNOTATION,
    JOBSET_GROUP,
    JOBSET_UID_LABEL,
    JOBSET_VERSION,
    JOBSETS,
    NODES_ANNOTATION,
    RESUME_ANNOTATION,
    JobRef,
    active_pod,
    finished,
    member_of,
    owner_job_uid,
    owner_uid,
    post_job_event,
    suspended,
)
from gpupool.backends.kubernetes.calls import START_GIVE_UP_S, STOP_WAIT_AFTER_GRACE_S, Calls, bind_pod
from gpupool.backends.kubernetes.foreign import kubectl_pod_end
from gpupool.backends.kubernetes.foreign_jobs import KubectlPods
from gpupool.backends.kubernetes.gates import has_our_gate, other_gates, remove_gate
from gpupool.backends.kubernetes.health import Health, describe
from gpupool.backends.kubernetes.names import PROJECT_LABEL
from gpupool.backends.kubernetes.objects import Obj
from gpupool.backends.kubernetes.watcher import ListWatch

log = logging.getLogger("gpupool.backends.kubernetes")


@dataclass
class _Run:
    handle: AdmittedGang
    ref: JobRef
    slots: list[str]  # a node per replica
    gpus: list[tuple[str, ...]] = field(default_factory=list)  # the GPU ids per replica slot (a claim's devices)
    bound: dict[str, int] = field(default_factory=dict)  # pod uid -> its slot
    start: Any = None  # the admission patch's future (None when adopted after a restart)
    stopping: bool = False
    stopped: bool = False


class BatchJobs:
    """Every Job labelled with a project (its watch), and the attempts of the gpupool jobs standing for them."""

    def __init__(self, batch: client.BatchV1Api, api: client.CoreV1Api, kubectl: KubectlPods, calls: Calls,
                 health: Health, bind_every_s: float = 0.05) -> None:
        self.batch = batch
        self.custom = client.CustomObjectsApi(api.api_client)
        self.api = api
        self.kubectl = kubectl
        self.calls = calls
        self.bind_every_s = bind_every_s
        self.before_bind: Callable[[Obj, str, list[str]], None] | None = None
        """Writes a pod's slot GPUs into its DRA claims before its binding (a RuntimeError: not bound yet)."""
        self.held_gpus: Callable[[Obj], frozenset[str]] = lambda pod: frozenset()
        """The GPU ids a bound pod's DRA claims hold (after a restart: which slot it has)."""
        self._lock = threading.Lock()
        self._jobs: dict[str, Obj] = {}  # Job (JobSet) uid -> its JSON
        self._kinds: dict[str, str] = {}  # uid -> "Job" or "JobSet"
        self.generation = 0
        self._refs: dict[str, JobRef] = {}  # gpupool job id -> its Job
        self._runs: dict[str, _Run] = {}
        self._finished: dict[tuple[str, int], int] = {}  # ends found by recovery
        self.intents: dict[str, str] = {}  # gpupool job id -> the intent of the stop the core asked for
        self._marks = itertools.count(1)
        self.changes = 0
        self._halt = threading.Event()
        self._binder = threading.Thread(target=self._bind_loop, daemon=True, name="gpupool-batch-binder")
        self.watch = ListWatch("batch-jobs", batch.list_job_for_all_namespaces,
                               functools.partial(self._on_reset, "Job"), functools.partial(self._on_event, "Job"),
                               health, label_selector=PROJECT_LABEL)
        self.jobset_watch: ListWatch | None = None
        if self._jobsets_served():
            self.jobset_watch = ListWatch(
                "jobsets", functools.partial(self.custom.list_cluster_custom_object, JOBSET_GROUP, JOBSET_VERSION,
                                             JOBSETS), functools.partial(self._on_reset, "JobSet"),
                functools.partial(self._on_event, "JobSet"), health, label_selector=PROJECT_LABEL)

    def _jobsets_served(self) -> bool:
        """Whether the cluster serves JobSets (its CRD installed): only then are they watched (no CRD, no errors)."""
        try:
            groups = client.ApisApi(self.custom.api_client).get_api_versions(_request_timeout=10).groups or []
            return any(g.name == JOBSET_GROUP and any(v.version == JOBSET_VERSION for v in g.versions or [])
                       for g in groups)
        except Exception as e:
            log.warning("could not ask whether JobSets are served: %s", describe(e))
            return False

    def start(self) -> None:
        self.watch.start()
        if self.jobset_watch is not None:
            self.jobset_watch.start()
        self._binder.start()

    def close(self) -> None:
        self._halt.set()
        self.watch.stop(wait_s=0.5)
        if self.jobset_watch is not None:
            self.jobset_watch.stop(wait_s=0.5)

    # ------------------------------------------------------------ the watches (their threads)
    def _on_reset(self, kind: str, jobs: list[Obj]) -> None:
        with self._lock:
            for uid in [u for u, k in self._kinds.items() if k == kind]:
                del self._kinds[uid]
                self._jobs.pop(uid, None)
            for j in jobs:
                if kind == "Job" and owner_uid(j, "JobSet", JOBSET_GROUP) is not None:
                    continue  # a JobSet's child: the JobSet is what gpupool admits
                self._jobs[ob.uid(j)] = j
                self._kinds[ob.uid(j)] = kind
            self.generation += 1
            self._changed()

    def _on_event(self, kind: str, event: str, job: Obj) -> None:
        if kind == "Job" and owner_uid(job, "JobSet", JOBSET_GROUP) is not None:
            return
        with self._lock:
            if event == "DELETED":
                self._jobs.pop(ob.uid(job), None)
                self._kinds.pop(ob.uid(job), None)
            else:
                self._jobs[ob.uid(job)] = job
                self._kinds[ob.uid(job)] = kind
            self.generation += 1
            self._changed()

    def _changed(self) -> None:
        self.changes = next(self._marks)

    # ------------------------------------------------------------ reads
    @property
    def synced(self) -> bool:
        return self.watch.synced.is_set() and (self.jobset_watch is None or self.jobset_watch.synced.is_set())

    def jobs(self) -> dict[str, tuple[str, Obj]]:
        """Every Job and JobSet labelled with a project now, by uid: (its kind, its JSON)."""
        with self._lock:
            return {u: (self._kinds.get(u, "Job"), j) for u, j in self._jobs.items()}

    def job(self, uid: str) -> Obj | None:
        with self._lock:
            return self._jobs.get(uid)

    def owns_pod(self, pod: Obj) -> bool:
        """Whether the pod is made by a Job gpupool admits (not a kubectl pod to queue on its own)."""
        uids = (owner_job_uid(pod), ob.labels(pod).get(JOBSET_UID_LABEL))
        with self._lock:
            return any(u is not None and u in self._jobs for u in uids)

    def pod_jobs(self) -> dict[str, str]:
        """Pod UID -> job id of the pods gpupool bound for the Jobs (JobSets) it admitted."""
        with self._lock:
            return {uid: job_id for job_id, run in self._runs.items() if not run.stopped for uid in run.bound}

    def register(self, job_id: str, ref: JobRef) -> None:
        with self._lock:
            self._refs[job_id] = ref

    def owns(self, job_id: str) -> bool:
        return job_id in self._refs

    def ref(self, job_id: str) -> JobRef | None:
        with self._lock:
            return self._refs.get(job_id)

    def abandon(self, job_id: str) -> None:
        """The job was ended because its Job (JobSet) was deleted outside gpupool: its attempt is over."""
        with self._lock:
            run = self._runs.get(job_id)
            if run is not None:
                run.stopped = True
        self._changed()

    def running(self, job_id: str) -> bool:
        """Whether an attempt of this gpupool job is admitted (its Job is meant to run)."""
        with self._lock:
            run = self._runs.get(job_id)
            return run is not None and not run.stopped

    def _pods_of(self, ref: JobRef) -> list[Obj]:
        return [p for p in self.kubectl.pods().values() if member_of(p, ref)]

    # ------------------------------------------------------------ admission
    def launch(self, launch: Launch) -> AdmittedGang:
        ref = self._refs[launch.job_id]
        slots = [r.node for r in launch.replicas] or [str(launch.assignment.get("node", ""))]
        gpus = [tuple(str(g["id"]) for g in a.get("gpus") or [])
                for a in ([r.assignment for r in launch.replicas] or [launch.assignment])]
        handle = AdmittedGang(launch.job_id, launch.attempt, ref.name, start_time=int(time.time()))
        run = _Run(handle, ref, slots, gpus)
        with self._lock:
            self._runs[launch.job_id] = run
            run.start = self.calls.submit(self._admit, run)
            run.start.add_done_callback(lambda f: self._changed())
        return handle

    def _patch(self, ref: JobRef, body: dict[str, Any]) -> Any:
        if ref.kind == "JobSet":
            return self.custom.patch_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, ref.namespace, JOBSETS,
                                                              ref.name, body)
        return self.batch.patch_namespaced_job(ref.name, ref.namespace, body)

    def _delete(self, ref: JobRef) -> Any:
        if ref.kind == "JobSet":
            return self.custom.delete_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, ref.namespace, JOBSETS,
                                                               ref.name, propagation_policy="Background")
        return self.batch.delete_namespaced_job(ref.name, ref.namespace, propagation_policy="Background")

    def _admission(self, run: _Run) -> dict[str, Any]:
        """The one patch that admits: unsuspended, its nodes named, the resume signal on its pod templates."""
        h, ref = run.handle, run.ref
        resume = {"metadata": {"annotations": {RESUME_ANNOTATION: "1" if h.attempt > 1 else "0"}}}
        body: dict[str, Any] = {"metadata": {"annotations": {NODES_ANNOTATION: ",".join(run.slots),
                                                             GPUS_ANNOTATION: ";".join(",".join(g) for g in run.gpus),
                                                             ADMITTED_ANNOTATION: f"{h.job_id}/{h.attempt}"}},
                                "spec": {"suspend": False}}
        if ref.kind == "Job":
            body["spec"]["template"] = resume
            return body
        js = self.job(ref.uid)
        if js is None:
            raise RuntimeError(f"JobSet {ref.text} is gone")
        replicated = copy.deepcopy(ob.spec(js).get("replicatedJobs") or [])
        for rj in replicated:  # a merge patch replaces the list: the whole list, each pod template annotated
            pod = rj.setdefault("template", {}).setdefault("spec", {}).setdefault("template", {})
            pod.setdefault("metadata", {}).setdefault("annotations", {}).update(resume["metadata"]["annotations"])
        body["spec"]["replicatedJobs"] = replicated
        return body

    def _admit(self, run: _Run) -> None:
        """Unsuspend the Job (JobSet), naming its nodes and (on a resume) the resume signal, in one patch."""
        h, ref = run.handle, run.ref
        try:
            body = self._admission(run)
            self.calls.retrying("start", lambda: self._patch(ref, body), START_GIVE_UP_S)
        except Exception as e:
            raise RuntimeError(f"could not unsuspend {ref.kind} {ref.text}: {describe(e)}") from e
        post_job_event(self.api, ref, "Normal", "GpupoolAdmitted",
                       f"gpupool admitted this {ref.kind} as job {h.job_id} (attempt {h.attempt}) on "
                       f"{', '.join(run.slots)}" + ("; resuming: its pods see gpupool.io/resume=1" if h.attempt > 1
                                                    else ""))

    # ------------------------------------------------------------ binding the Job controller's pods
    def _bind_loop(self) -> None:
        """Look again whenever the pods or the admitted runs changed (and every 2 s, for a bind that failed)."""
        seen: Any = None
        last = 0.0
        while not self._halt.wait(self.bind_every_s):
            with self._lock:
                now_seen = (self.kubectl.generation, tuple((r.handle.job_id, r.handle.attempt, r.stopping,
                                                            r.start is None or r.start.done())
                                                           for r in self._runs.values()))
            if now_seen == seen and time.monotonic() - last < 2.0:
                continue
            seen, last = now_seen, time.monotonic()
            try:
                self.bind_pending()
            except Exception as e:  # a bad moment of the API server: the next round tries again
                log.warning("binding Job pods: %s", describe(e))

    def bind_pending(self) -> None:
        """Bind each pending pod of an admitted Job to a replica slot no running pod of it holds."""
        with self._lock:
            runs = [r for r in self._runs.values() if not r.stopping and not r.stopped
                    and (r.start is None or (r.start.done() and r.start.exception() is None))]
        if not runs:
            return
        pods = self.kubectl.pods()
        for run in runs:
            mine = {ob.uid(p): p for p in pods.values() if member_of(p, run.ref)}
            for uid in [u for u, _ in run.bound.items() if u not in mine or not active_pod(mine[u])]:
                del run.bound[uid]  # ended or gone: its slot is free for the Job's next pod
            for uid, p in mine.items():
                if ob.node_name(p) and uid not in run.bound and active_pod(p):
                    node = ob.node_name(p)  # bound before (a restart): it holds the first free slot on its node
                    free = [i for i, n in enumerate(run.slots) if n == node and i not in run.bound.values()]
                    held = self.held_gpus(p)  # (one whose claims hold GPUs: the slot of those GPUs)
                    free = [i for i in free if i < len(run.gpus) and frozenset(run.gpus[i]) == held] or free
                    if free:
                        run.bound[uid] = free[0]
            for p in sorted(mine.values(), key=ob.name):
                if ob.node_name(p) or ob.being_deleted(p) or not active_pod(p) or other_gates(p):
                    continue
                free = [i for i in range(len(run.slots)) if i not in run.bound.values()]
                if not free:
                    break
                self._bind(run, p, free[0])

    def _bind(self, run: _Run, pod: Obj, slot: int) -> None:
        node = run.slots[slot]
        if self.before_bind is not None and ob.spec(pod).get("resourceClaims"):
            try:  # its slot's GPUs into its own ResourceClaims first (its claim may not be made yet: next round)
                self.before_bind(pod, node, list(run.gpus[slot]) if slot < len(run.gpus) else [])
            except Exception as e:
                log.info("pod %s/%s of %s %s not bound to %s yet: %s", ob.namespace(pod), ob.name(pod),
                         run.ref.kind, run.ref.text, node, e)
                return
        try:
            if has_our_gate(pod):  # a template with gpupool's scheduling gate: removed first (gates.py)
                remove_gate(self.api, ob.namespace(pod), ob.name(pod))
            bind_pod(self.api, ob.namespace(pod), ob.name(pod), node, ob.uid(pod))
        except ApiException as e:
            if e.status not in (404, 409):
                log.warning("could not bind pod %s/%s of %s %s to %s: %s", ob.namespace(pod), ob.name(pod),
                            run.ref.kind, run.ref.text, node, describe(e))
            return
        run.bound[ob.uid(pod)] = slot

    # ------------------------------------------------------------ the core's questions
    def _job_of(self, run: _Run) -> Obj | None:
        with self._lock:
            return self._jobs.get(run.ref.uid)

    @staticmethod
    def _start_error(run: _Run) -> str | None:
        f = run.start
        if f is None or not f.done():
            return None
        e = f.exception()
        return None if e is None else str(e)

    def alive(self, handle: AdmittedGang) -> bool:
        with self._lock:
            run = self._runs.get(handle.job_id)
        if run is None or run.handle.attempt != handle.attempt or run.stopped:
            return False
        if run.start is not None and not run.start.done():
            return True
        if self._start_error(run) is not None:
            return False
        job = self._job_of(run)
        if job is None:  # deleted: by gpupool's cancel (stopping), else from outside, which the sync settles
            return not run.stopping
        return finished(job) is None

    def exit_code(self, job_id: str, attempt: int) -> int | None:
        with self._lock:
            run = self._runs.get(job_id)
            if run is None or run.handle.attempt != attempt:
                return self._finished.get((job_id, attempt))
        job = self._job_of(run)
        code = finished(job) if job is not None else None
        if code == 1:  # Failed: the exit code of its failed pod (the oldest one left), as a pod's job has
            failed = sorted((p for p in self._pods_of(run.ref) if ob.phase(p) == "Failed"),
                            key=lambda p: ob.creation_time(p) or dt.datetime.max.replace(tzinfo=dt.timezone.utc))
            ends = [e for e in (kubectl_pod_end(p) for p in failed) if e is not None and e.exit_code != 0]
            code = ends[0].exit_code if ends else 1
        return code

    def ended_on_its_own(self, job_id: str, attempt: int) -> bool:
        return self.exit_code(job_id, attempt) is not None

    def interrupted(self, handle: AdmittedGang) -> Interrupted | None:
        with self._lock:
            run = self._runs.get(handle.job_id)
        if run is None:
            return None
        err = self._start_error(run)
        if err is not None:
            return Interrupted("not-started", f"{err}; requeued")
        if self._job_of(run) is None and not run.stopping:
            return Interrupted("disrupted", f"its {run.ref.kind} {run.ref.text} was deleted outside gpupool")
        return None

    async def stop(self, handle: AdmittedGang, grace_s: float) -> bool:
        """Suspend the Job (cancel: delete it), then wait until its pods have ended; True if within the grace."""
        with self._lock:
            run = self._runs.get(handle.job_id)
        if run is None:
            return True
        run.stopping = True
        if run.start is not None:
            try:
                await asyncio.wrap_future(run.start)
            except Exception:
                run.stopped = True
                return True
        cancel = self.intents.pop(handle.job_id, "") == "cancel"
        await asyncio.get_running_loop().run_in_executor(None, self._stop_job, run.ref, cancel)
        deadline = time.monotonic() + grace_s + STOP_WAIT_AFTER_GRACE_S
        within = time.monotonic() + grace_s + 5.0
        while time.monotonic() < deadline:
            if not any(active_pod(p) for p in self._pods_of(run.ref)):
                break
            await asyncio.sleep(0.05)
        run.stopped = True
        self._changed()
        return time.monotonic() <= within

    def _stop_job(self, ref: JobRef, cancel: bool) -> None:
        what = f"{'delete' if cancel else 'suspend'} {ref.kind} {ref.text}"
        try:
            if cancel:
                self.calls.retrying("stop", lambda: self._delete(ref), 60.0)
            else:
                self.calls.retrying("stop", lambda: self._patch(ref, {"spec": {"suspend": True}}), 60.0)
        except ApiException as e:
            if e.status != 404:
                log.warning("could not %s: %s", what, describe(e))
        except Exception as e:
            log.warning("could not %s: %s", what, describe(e))

    def delete_job(self, ref: JobRef) -> None:
        """A cancelled job's Job is deleted (its pods by the garbage collector), in the background."""
        self.calls.submit(self._stop_job, ref, True)

    def suspend_job(self, ref: JobRef) -> None:
        self.calls.submit(self._stop_job, ref, False)

    def release(self, handle: AdmittedGang) -> None:
        with self._lock:
            run = self._runs.get(handle.job_id)
            if run is not None and run.handle.attempt == handle.attempt:
                del self._runs[handle.job_id]

    # ------------------------------------------------------------ recovery
    def recover(self, job_id: str, attempt: int) -> Recovered:
        """After a restart: the Job as the watch lists it (running, ended, or suspended: never started)."""
        self.watch.synced.wait(20.0)
        if self.jobset_watch is not None:
            self.jobset_watch.synced.wait(20.0)
        self.kubectl.watch.synced.wait(20.0)
        ref = self._refs[job_id]
        job = self.job(ref.uid)
        if job is None:  # deleted while gpupool was away: followed as running, and the sync ends it cancelled
            run = _Run(AdmittedGang(job_id, attempt, ref.name), ref, [])
            with self._lock:
                self._runs[job_id] = run
            return Recovered("running", run.handle)
        code = finished(job)
        if code is not None:
            with self._lock:
                self._finished[(job_id, attempt)] = code
            return Recovered("gone", exit_code=code)
        if suspended(job) or ob.annotations_of(job).get(ADMITTED_ANNOTATION) != f"{job_id}/{attempt}":
            return Recovered("not-started")
        slots = [n for n in ob.annotations_of(job).get(NODES_ANNOTATION, "").split(",") if n]
        gpus = [tuple(g for g in text.split(",") if g)
                for text in ob.annotations_of(job).get(GPUS_ANNOTATION, "").split(";")] if slots else []
        run = _Run(AdmittedGang(job_id, attempt, ref.name), ref, slots, gpus if len(gpus) == len(slots) else [])
        with self._lock:
            self._runs[job_id] = run
        return Recovered("running", run.handle)
