"""Pods users create with kubectl, run as gpupool jobs: watched, bound, evicted, and how they ended.

The core queues one job per such pod (:mod:`gpupool.backends.kubernetes.adoption`); this is
that job's executor. Start = bind the pod to the chosen node through
``pods/binding``, the binding's annotations carrying the pod's GPU environment
(:mod:`gpupool.backends.kubernetes.gpu_env_configmap`), after writing its GPU ConfigMap
only if the pod names it in ``envFrom``; the pod is the user's, so a refused bind leaves it
Pending (the job goes back to the queue) and gpupool never deletes it except
to evict it (a reclaim, a node leaving the pool) or when its job is cancelled.
Stop = delete with the grace period (SIGTERM is the checkpoint signal), after
an Event on the pod saying why. A pod that ends (its kubelet sets Succeeded or
Failed) ends its job with its exit code; a pod that someone else deletes or
evicts ends its job as cancelled once its containers have ended (its GPUs held
until then): gpupool never recreates a pod it did not make.

The watch takes pods whose ``spec.schedulerName`` is ours and that are not
labelled ``app.kubernetes.io/managed-by: gpupool``, in every namespace: which
namespaces' pods get *new* jobs is the core's decision at queueing time
(:mod:`gpupool.backends.kubernetes.pod_namespaces`). A pod whose job exists is followed
wherever it is, so a namespace taken out of the setting (and a restart) never
loses a running pod's job while the pod still holds its GPUs.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpupool.backends.base import Interrupted, Launch, Recovered
from gpupool.backends.kubernetes import objects as ob
from gpupool.backends.kubernetes.calls import (
    START_GIVE_UP_S,
    STOP_WAIT_AFTER_GRACE_S,
    Calls,
    StartBackoff,
    bind_pod,
)
from gpupool.backends.kubernetes.disruption import DELETED, disruption
from gpupool.backends.kubernetes.foreign import (
    ENV_ANNOTATION_PREFIX,
    FRACTION_ANNOTATION,
    MEMORY_ANNOTATION,
    PodRef,
    config_map_name,
    deleted_end,
    kubectl_pod_end,
    names_config_map,
    reads_config_map,
    reads_env_annotations,
)
from gpupool.backends.kubernetes.gates import has_our_gate, remove_gate
from gpupool.backends.kubernetes.gpu_env_configmap import binding_annotations, gpu_config_map
from gpupool.backends.kubernetes.health import Health, describe
from gpupool.backends.kubernetes.names import MANAGED_BY, MANAGED_BY_LABEL
from gpupool.backends.kubernetes.objects import Obj
from gpupool.backends.kubernetes.pod_events import post_event
from gpupool.backends.kubernetes.pod_namespaces import PodNamespaces
from gpupool.backends.kubernetes.pods import PodEnd, PodHandle, pod_environment
from gpupool.backends.kubernetes.watcher import ListWatch

log = logging.getLogger("gpupool.backends.kubernetes")

@dataclass
class _Run:
    """What we know of the current attempt's pod (guarded by the lock)."""

    handle: PodHandle
    ref: PodRef
    start: Any = None  # the (ConfigMap+) bind future (None when adopted after a restart)
    stopping: bool = False  # gpupool asked for the deletion
    deleted_by_other: bool = False  # a deletion gpupool did not ask for
    disruption: str = ""  # another disruption gpupool did not ask for (a kubelet's eviction), in words
    gone: bool = False
    end: PodEnd | None = None
    gpu_ids: tuple[str, ...] = ()  # the GPUs the policy chose (a claimed pod's devices)


class KubectlPods:
    """Every kubectl pod for gpupool (``namespaces`` says which may get jobs), and the attempts of their jobs."""

    def __init__(self, api: client.CoreV1Api, namespaces: PodNamespaces, scheduler_name: str, calls: Calls,
                 health: Health, jobs_dir: Path, node_lost: Callable[[str], bool],
                 sync_timeout_s: float = 20.0) -> None:
        self.api = api
        self.namespaces = namespaces
        self.calls = calls
        self.jobs_dir = Path(jobs_dir)
        self.node_lost = node_lost
        self.sync_timeout_s = sync_timeout_s
        self._lock = threading.Lock()
        self._pods: dict[str, Obj] = {}  # their JSON, by uid
        self.generation = 0
        """Bumped on every change the watch sees: the core re-reads the pending pods only then."""
        self._touched: set[str] | None = None
        """Uids of the pods the watch changed since the core last took them; None: every pod (a relist)."""
        self._refs: dict[str, PodRef] = {}  # job id -> its pod
        self._job_of_uid: dict[str, str] = {}  # pod uid -> job id (a watch event finds its attempt at once)
        self._runs: dict[str, _Run] = {}  # job id -> its current attempt
        self._finished: dict[tuple[str, int], PodEnd] = {}  # ends found by recovery
        self._stop_notes: dict[str, tuple[str, str]] = {}  # job id -> (event reason, message) for its stop
        self._warned: set[tuple[str, str]] = set()  # (pod uid, message): each warning once per pod
        self._start_backoff = StartBackoff()  # starts refused in a row: the next one waits
        self._marks = itertools.count(1)
        self.changes = 0
        """Moves whenever an attempt may have stopped being alive (see PodExecutor.changes)."""
        self.new_work: Callable[[], None] = lambda: None
        """Called (the watch thread) when a pod with no job yet arrives or changes: the core queues it at once."""
        self.before_bind: Callable[[PodRef, Obj | None, str, list[str]], None] | None = None
        """Called before a pod's binding (a worker thread): a claimed pod's devices go into its claims
        (dra_allocation.py); a RuntimeError refuses the start, the pod stays queued."""
        # every namespace (rbac.yaml grants list+watch of pods cluster-wide, for other schedulers' pods too)
        self.watch = ListWatch("kubectl-pods", api.list_pod_for_all_namespaces, self._on_reset, self._on_event,
                               health, field_selector=f"spec.schedulerName={scheduler_name}",
                               label_selector=f"{MANAGED_BY_LABEL}!={MANAGED_BY}")

    def start(self) -> None:
        self.watch.start()

    def close(self) -> None:
        self.watch.stop(wait_s=0.5)

    # ------------------------------------------------------------ the watch's view (watch thread)
    def _on_reset(self, pods: list[Obj]) -> None:
        with self._lock:
            self._pods = {ob.uid(p): p for p in pods}
            self.generation += 1
            self._touched = None
            self.new_work()
            for run in self._runs.values():
                pod = self._pods.get(run.ref.uid)
                if pod is not None:
                    self._observe(run, pod)
                elif run.start is None or run.start.done():
                    run.gone = True
                    self._changed()

    def _on_event(self, kind: str, pod: Obj) -> None:
        uid = ob.uid(pod)
        with self._lock:
            if kind == "DELETED":
                self._pods.pop(uid, None)
            else:
                self._pods[uid] = pod
            self.generation += 1
            if self._touched is not None:
                self._touched.add(uid)
            job_id = self._job_of_uid.get(uid)
            if job_id is None and kind != "DELETED":
                self.new_work()
            run = self._runs.get(job_id) if job_id is not None else None
            if run is not None:
                self._observe(run, pod)
                if kind == "DELETED":
                    run.gone = True
                    self._changed()

    def _changed(self) -> None:
        self.changes = next(self._marks)

    def _observe(self, run: _Run, pod: Obj) -> None:
        """Take what ``pod`` says of its attempt; the mark moves only when that changed.

        A pod's status changes several times as it runs (scheduled, running, its
        conditions): at thousands of running kubectl pods, moving the mark on each
        would make every monitor tick scan every attempt.
        """
        before = (run.end, run.deleted_by_other, run.disruption)
        self._observe_now(run, pod)
        if (run.end, run.deleted_by_other, run.disruption) != before:
            self._changed()

    def _observe_now(self, run: _Run, pod: Obj) -> None:
        if ob.being_deleted(pod) and not run.stopping:
            run.deleted_by_other = True
        if not run.stopping and not run.disruption and (d := disruption(pod)) is not None and d.cause != DELETED:
            run.disruption = d.what  # evicted (the kubelet, the Eviction API): said so, rather than "deleted"
        if run.end is None:
            run.end = kubectl_pod_end(pod)
            if run.end is None and ob.being_deleted(pod):
                run.end = deleted_end(pod)

    # ------------------------------------------------------------ the core's reads (its loop)
    @property
    def synced(self) -> bool:
        return self.watch.synced.is_set()

    def pods(self) -> dict[str, Obj]:
        """Every kubectl pod now (its JSON), by uid (a copy of the map)."""
        with self._lock:
            return dict(self._pods)

    def take_touched(self) -> set[str] | None:
        """The uids of the pods changed (added, modified, deleted) since the last call; None: look at every pod.

        The core's queueing looks only at these between its full passes, so a
        tick costs what changed, not every kubectl pod in the cluster.
        """
        with self._lock:
            touched, self._touched = self._touched, set()
        return touched

    def pods_of(self, uids: set[str]) -> dict[str, Obj]:
        """The pods among ``uids`` that exist now (their JSON), by uid."""
        with self._lock:
            return {u: p for u in uids if (p := self._pods.get(u)) is not None}

    def pod_jobs(self) -> dict[str, str]:
        """Pod UID -> job id of every kubectl pod a job stands for (a copy)."""
        with self._lock:
            return dict(self._job_of_uid)

    def register(self, job_id: str, ref: PodRef) -> None:
        """``job_id`` stands for ``ref``: its attempts are this executor's."""
        with self._lock:
            self._refs[job_id] = ref
            self._job_of_uid[ref.uid] = job_id

    def owns(self, job_id: str) -> bool:
        return job_id in self._refs

    def note_stop(self, job_id: str, reason: str, message: str) -> None:
        """The Event to record on the pod when its job's attempt is stopped (posted before the deletion)."""
        self._stop_notes[job_id] = (reason, message)

    def warn_once(self, ref: PodRef, reason: str, message: str) -> None:
        """A Warning event on the pod, once per pod and message (the core re-checks pods often)."""
        key = (ref.uid, message)
        with self._lock:
            if key in self._warned:
                return
            self._warned.add(key)
        self.calls.submit(post_event, self.api, ref, "Warning", reason, message)

    def delete_pod(self, ref: PodRef, grace_s: float, reason: str, message: str) -> None:
        """Record why, then delete the pod with the grace period (its job was cancelled before it ran)."""
        def go() -> None:
            post_event(self.api, ref, "Normal", reason, message)
            self._delete(ref, max(0, int(round(grace_s))))
        self.calls.submit(go)

    # ------------------------------------------------------------ start
    def launch(self, launch: Launch) -> PodHandle:
        """Begin to bind the pod (its ConfigMap first, if it reads one) on a worker thread; the handle at once."""
        ref = self._refs[launch.job_id]
        node = str(launch.assignment.get("node", ""))
        handle = PodHandle(launch.job_id, launch.attempt, ref.name, node)
        run = _Run(handle, ref, gpu_ids=tuple(str(g["id"]) for g in launch.assignment.get("gpus") or []))
        env = pod_environment(launch)
        env.pop("PYTHONPATH", None)
        with self._lock:
            self._runs[launch.job_id] = run
            run.start = self.calls.submit(self._configure_and_bind, run, env, node)
            run.start.add_done_callback(self._start_done)
        return handle

    def _start_done(self, f: Any) -> None:
        if f.cancelled() or f.exception() is not None:
            self._changed()  # a refused start ends the attempt

    def _configure_and_bind(self, run: _Run, env: dict[str, str], node: str) -> None:
        """Back off after refused starts (0.2 s doubling to 30 s), then write the ConfigMap (if read) and bind.

        A refused start requeues the job and the next cycle tries again: without
        the backoff a setup that always refuses (RBAC) would churn the API server.
        """
        try:
            self._start_backoff.run(lambda: self._configure_and_bind_now(run, env, node))
        except BaseException as e:
            self.warn_once(run.ref, "GpupoolBindFailed", f"gpupool: {e}; the pod stays queued")
            raise

    def _configure_and_bind_now(self, run: _Run, env: dict[str, str], node: str) -> None:
        """The ConfigMap if the pod names it, the gate off if it has one, then the binding and its event.

        A pod that names no ConfigMap costs kube-scheduler's two writes: the
        binding (its annotations carry the GPU environment) and the event.
        """
        ref = run.ref
        with self._lock:
            pod = self._pods.get(ref.uid)
        with_config_map = pod is None or names_config_map(pod)  # not seen (yet): written, as before
        if with_config_map:
            cm = gpu_config_map(ref, env)
            try:
                self._write_config_map(cm)
            except Exception as e:
                raise RuntimeError(f"could not write ConfigMap {cm['metadata']['name']} for pod {ref.text}: "
                                   f"{describe(e)}") from e
        if self.before_bind is not None:  # a claimed pod: its devices into its ResourceClaims first
            self.before_bind(ref, pod, node, list(run.gpu_ids))
        self._ungate(ref)
        annotations = binding_annotations(env)
        try:
            status = self.calls.retrying("start", lambda: bind_pod(self.api, ref.namespace, ref.name, node, ref.uid,
                                                                   annotations), START_GIVE_UP_S)
            if status != 201:
                raise RuntimeError(f"binding answered HTTP {status}")
        except Exception as e:  # the pod is the user's: it stays, Pending, and the job is queued again
            raise RuntimeError(f"could not bind pod {ref.text} to node {node}: {describe(e)}") from e
        gpus = env.get("NVIDIA_VISIBLE_DEVICES", "")
        where = (f"ConfigMap {config_map_name(ref.name)} and " if with_config_map else "") + \
            f"annotations {ENV_ANNOTATION_PREFIX}*"
        # The events are posted by another of the calls' workers (as kube-scheduler's event broadcaster posts its own): the
        # start is done once the pod is bound, and the next pod's binding does not wait behind this one's event.
        self.calls.submit(post_event, self.api, ref, "Normal", "Scheduled",
                          f"gpupool assigned {ref.text} to {node} as job {run.handle.job_id} (GPUs "
                          f"{gpus or 'none'}, fraction {env.get('GPUPOOL_GPU_FRACTION', '0')}; environment in {where})")
        if pod is not None and not reads_config_map(pod) and not reads_env_annotations(pod):
            ann = ob.annotations_of(pod)
            if FRACTION_ANNOTATION in ann or MEMORY_ANNOTATION in ann:
                self.calls.submit(post_event, self.api, ref, "Warning", "GpupoolNoGpuEnv",
                                  f"this pod holds a share of one GPU but reads neither its annotations "
                                  f"{ENV_ANNOTATION_PREFIX}* (env valueFrom fieldRef) nor its ConfigMap (envFrom: "
                                  f"[{{configMapRef: {{name: {config_map_name(ref.name)}}}}}]): its container will "
                                  f"see every GPU on node {node}, not only its share")

    def _ungate(self, ref: PodRef) -> None:
        """Remove gpupool's scheduling gate from the pod, if it has one: the API server binds no gated pod."""
        with self._lock:
            pod = self._pods.get(ref.uid)
        if pod is None or not has_our_gate(pod):
            return
        try:
            self.calls.retrying("start", lambda: remove_gate(self.api, ref.namespace, ref.name), START_GIVE_UP_S)
        except Exception as e:  # the job goes back to the queue; the pod keeps its gate
            raise RuntimeError(f"could not remove scheduling gate gpupool.io/admission from pod {ref.text}: "
                               f"{describe(e)}") from e

    def _write_config_map(self, cm: dict[str, Any]) -> None:
        """Create the ConfigMap; one left by an earlier try (a restart, a refused bind) is replaced."""
        ns, name = cm["metadata"]["namespace"], cm["metadata"]["name"]
        try:
            self.calls.retrying("start", lambda: self.api.create_namespaced_config_map(ns, ob.client_body(cm)),
                                START_GIVE_UP_S)
            return
        except ApiException as e:
            if e.status != 409:
                raise
        try:
            self.calls.retrying("start", lambda: self.api.delete_namespaced_config_map(name, ns), START_GIVE_UP_S)
        except ApiException as e:
            if e.status != 404:
                raise
        self.calls.retrying("start", lambda: self.api.create_namespaced_config_map(ns, ob.client_body(cm)),
                            START_GIVE_UP_S)

    @staticmethod
    def _start_error(run: _Run) -> str | None:
        f = run.start
        if f is None or not f.done():
            return None
        if f.cancelled():
            return "the start was cancelled"
        e = f.exception()
        return None if e is None else str(e) if isinstance(e, RuntimeError) else describe(e)

    # ------------------------------------------------------------ watch
    def alive(self, handle: PodHandle) -> bool:
        with self._lock:
            run = self._runs.get(handle.job_id)
            if run is None or run.handle.attempt != handle.attempt:
                return False
            if run.start is not None and not run.start.done():
                return True
            if self._start_error(run) is not None:
                return False
            # A pod its user deletes runs on through its grace period: its GPUs stay held until it has ended.
            return run.end is None and not run.gone

    def _end_of(self, job_id: str, attempt: int) -> PodEnd | None:
        with self._lock:
            run = self._runs.get(job_id)
            if run is not None and run.handle.attempt == attempt:
                return run.end
            return self._finished.get((job_id, attempt))

    def exit_code(self, job_id: str, attempt: int) -> int | None:
        end = self._end_of(job_id, attempt)
        return end.exit_code if end is not None else None

    def ended_on_its_own(self, job_id: str, attempt: int) -> bool:
        end = self._end_of(job_id, attempt)
        return end is not None and end.on_its_own

    def interrupted(self, handle: PodHandle) -> Interrupted | None:
        with self._lock:
            run = self._runs.get(handle.job_id)
            if run is None:
                return Interrupted("lost", f"its pod {handle.name} is unknown to the scheduler")
            err = self._start_error(run)
            if err is not None:
                return Interrupted("not-started", f"{err}; requeued")
            if (run.deleted_by_other or run.disruption) and not (run.end is not None and run.end.on_its_own):
                how = run.disruption or "was deleted, not by gpupool (by its user or its owner)"
                return Interrupted("lost", f"its pod {run.ref.text} {how}; gpupool does not recreate it")
            if run.end is None:
                return Interrupted("lost", f"its pod {run.ref.text} vanished without an exit status "
                                           f"(node {handle.node} lost?); gpupool does not recreate it")
            return None

    # ------------------------------------------------------------ stop
    async def stop(self, handle: PodHandle, grace_s: float) -> bool:
        """Record why on the pod, then delete it with the grace period; past it, for good if its node is lost."""
        with self._lock:
            run = self._runs.get(handle.job_id)
        if run is None:
            return True
        if run.start is not None:
            try:
                await asyncio.wrap_future(run.start)
            except Exception:
                return True  # never bound: nothing ran
        if not self.alive(handle):
            return True
        note = self._stop_notes.pop(handle.job_id, None)
        with self._lock:
            run.stopping = True
        grace = max(0, int(round(grace_s)))
        try:
            await asyncio.wrap_future(self.calls.submit(self._evict, run.ref, grace, note))
        except Exception as e:  # the worker pool is closing: the service is stopping
            log.warning("could not evict pod %s: %s", run.ref.text, describe(e))
            return False
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not self.alive(handle):
                return True
            await asyncio.sleep(0.05)
        forced = False
        while self.alive(handle) and time.monotonic() < deadline + STOP_WAIT_AFTER_GRACE_S:
            if not forced and self.node_lost(handle.node):
                log.warning("pod %s: node %s is lost; deleting the pod for good", run.ref.text, handle.node)
                try:
                    await asyncio.wrap_future(self.calls.submit(self._delete, run.ref, 0))
                except Exception as e:
                    log.warning("could not delete pod %s: %s", run.ref.text, describe(e))
                forced = True
            await asyncio.sleep(0.1)
        return False

    def _evict(self, ref: PodRef, grace: int, note: tuple[str, str] | None) -> None:
        if note is not None:
            post_event(self.api, ref, "Warning", note[0], note[1])
        self._delete(ref, grace)

    def _delete(self, ref: PodRef, grace: int) -> None:
        """Delete this pod (by uid: never a newer pod of the same name); gone already is fine."""
        opts = client.V1DeleteOptions(grace_period_seconds=grace, preconditions=client.V1Preconditions(uid=ref.uid))
        try:
            self.calls.retrying("stop", lambda: self.api.delete_namespaced_pod(ref.name, ref.namespace, body=opts),
                                STOP_WAIT_AFTER_GRACE_S)
        except ApiException as e:
            if e.status not in (404, 409):  # 409: the uid precondition failed, a newer pod of that name
                log.warning("could not delete pod %s: %s", ref.text, describe(e))
        except Exception as e:
            log.warning("could not delete pod %s: %s", ref.text, describe(e))

    # ------------------------------------------------------------ after the end
    def release(self, handle: PodHandle) -> None:
        """Keep what the pod printed in the job's log; the pod itself stays (it is its user's)."""
        with self._lock:
            run = self._runs.pop(handle.job_id, None)
        self._stop_notes.pop(handle.job_id, None)
        if run is None or run.handle.attempt != handle.attempt or self._start_error(run) is not None:
            return
        self.calls.submit(self._archive, handle, run.ref)

    def _archive(self, handle: PodHandle, ref: PodRef) -> None:
        try:
            text = self.api.read_namespaced_pod_log(ref.name, ref.namespace)
        except Exception as e:
            text = f"(the log of pod {ref.text} could not be read: {describe(e)})\n"
        path = self.jobs_dir / handle.job_id / "job.log"
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(path, "a") as f:
            f.write(f"--- gpupool: attempt {handle.attempt} of {handle.job_id} (pod {ref.text}) ---\n{text}")
            if text and not text.endswith("\n"):
                f.write("\n")

    # ------------------------------------------------------------ recovery
    def recover(self, job_id: str, attempt: int, pid: int | None, pid_start: int | None) -> Recovered:
        """Find the job's pod by uid: bound and running (adopt), ended (its code), Pending (requeue), or gone."""
        ref = self._refs[job_id]
        handle = PodHandle(job_id, attempt, ref.name)
        run = _Run(handle, ref)
        if not self.watch.synced.wait(self.sync_timeout_s):
            with self._lock:
                self._runs[job_id] = run
            return Recovered("running", handle)
        with self._lock:
            pod = self._pods.get(ref.uid)
            if pod is None:
                return Recovered("gone")
            handle.node = ob.node_name(pod)
            if not handle.node:
                return Recovered("not-started")
            self._observe(run, pod)
            if run.end is not None and run.end.on_its_own:  # (else the core settles it, knowing its stop intent)
                self._finished[(job_id, attempt)] = run.end
                return Recovered("gone", exit_code=run.end.exit_code)
            self._runs[job_id] = run
        return Recovered("running", handle)

    def recovered(self, live: set[tuple[str, int]]) -> None:
        """Nothing to sweep: kubectl pods are their users', never deleted for want of a job."""
