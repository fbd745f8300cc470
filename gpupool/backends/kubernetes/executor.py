"""The pod executor: each attempt of a training job is a Pod that gpupool creates and binds.

Start: create the Pod (Pending, ``schedulerName`` ours), then bind it to the
chosen node through the ``pods/binding`` subresource; both on a worker thread.
A refused bind (409, node gone) deletes the pod and reports the attempt
"not started": the core requeues the job without counting the attempt. A
create the API server refuses (a ResourceQuota, an admission rule) reports it
"refused" with the server's message: the core holds the job for a backoff and
fails it after a bounded number of refusals in a row. A gang's pods are all
created before any is bound (:meth:`PodExecutor.launch_gang`). The create and
bind calls themselves are :mod:`gpupool.backends.kubernetes.pod_starts`'s.
Watch: our pods (label ``app.kubernetes.io/managed-by=gpupool``) are kept in a
cache by a list+watch thread, so :meth:`alive` and the exit status are answered
from memory, on the loop. Stop: delete with the grace period (the kubelet sends
SIGTERM, the checkpoint signal, and SIGKILL at its end); a pod on a node that is
lost (NotReady, deleted) is then deleted for good, since no kubelet will ever
confirm it. Logs: when an attempt is settled its pod's log is appended to the
job's log file (what ``gpupool logs`` reads), then the finished pod is deleted.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpupool.backends.base import Interrupted, Launch, Recovered
from gpupool.backends.kubernetes import objects as ob
from gpupool.backends.kubernetes.calls import STOP_WAIT_AFTER_GRACE_S, Calls
from gpupool.backends.kubernetes.disruption import disruption
from gpupool.backends.kubernetes.gang_pods import GangHandle, GangPods
from gpupool.backends.kubernetes.health import Health, describe
from gpupool.backends.kubernetes.logs import LiveLogs
from gpupool.backends.kubernetes.names import ATTEMPT_LABEL, JOB_LABEL, MANAGED_SELECTOR, pod_name
from gpupool.backends.kubernetes.objects import Obj
from gpupool.backends.kubernetes.pod_starts import (
    PodAttempt,
    PodStarts,
    rv_number,
    start_error,
    start_refused,
)
from gpupool.backends.kubernetes.pods import (
    WORKDIR_ROOT,
    PodEnd,
    PodHandle,
    PodSettings,
    disrupted_reason,
    pod_end,
    pod_manifest,
    start_problem,
)
from gpupool.backends.kubernetes.watcher import ListWatch

log = logging.getLogger("gpupool.backends.kubernetes")

class PodExecutor:
    """Runs attempts as pods in ``settings.namespace`` (a :class:`gpupool.backends.base.Executor`)."""

    def __init__(self, api: client.CoreV1Api, settings: PodSettings, jobs_dir: Path, calls: Calls, health: Health,
                 node_lost: Callable[[str], bool], sync_timeout_s: float = 20.0) -> None:
        """``node_lost(name)``: whether that node is NotReady or gone (its pods are then deleted for good)."""
        self.api = api
        self.settings = settings
        self.jobs_dir = Path(jobs_dir)
        self.jobs_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.calls = calls
        self.health = health
        self.node_lost = node_lost
        self.sync_timeout_s = sync_timeout_s
        self._lock = threading.Lock()
        self._pods: dict[str, Obj] = {}  # the watch's view of our pods (their JSON), by name
        self._attempts: dict[str, PodAttempt] = {}  # attempts the core holds, by pod name
        self._finished: dict[tuple[str, int], PodEnd] = {}  # ends found by recovery
        self._copying: dict[str, int] = {}  # job id -> final log copies still to land (see log_settled)
        self._marks = itertools.count(1)
        self.changes = 0
        """Moves (to a value it never had) whenever an attempt may have stopped being alive: its end seen,
        its pod gone, its start refused. The core skips its liveness scan while it stands still."""
        self.watch = ListWatch("pods", api.list_namespaced_pod, self._on_reset, self._on_event, health,
                               namespace=settings.namespace, label_selector=MANAGED_SELECTOR)
        # Running pods' output copied into their jobs' log files as it comes (logs.py).
        self.live = LiveLogs(api, settings.namespace, self._log_file, self._live_pods, calls.submit)
        self.starts = PodStarts(api, settings.namespace, calls, self._lock, self._delete_quietly)
        self.gangs = GangPods(self)  # multi-node gangs: a pod per replica, each one of ours (gang_pods.py)

    def start(self) -> None:
        self.watch.start()
        self.live.start()

    def close(self) -> None:
        self.watch.stop()
        self.live.stop()

    # ------------------------------------------------------------ the watch's view (watch thread)
    def _on_reset(self, pods: list[Obj]) -> None:
        with self._lock:
            listed = {ob.name(p): p for p in pods}
            list_rv = max((rv_number(ob.resource_version(p)) or 0 for p in pods), default=0)
            self._pods = listed
            for name, a in self._attempts.items():
                pod = listed.get(name)
                if pod is not None and self._mine(a, pod) and (ob.node_name(pod) or not a.adopted):
                    self._observe(a, pod)
                elif a.adopted or (a.start is not None and a.start.done() and a.created_rv is not None
                                   and list_rv >= a.created_rv):
                    a.gone = True  # listed after it existed and not there (or, adopted, never bound): it is gone
                    self._changed()

    def _on_event(self, kind: str, pod: Obj) -> None:
        name = ob.name(pod)
        with self._lock:
            if kind == "DELETED":
                self._pods.pop(name, None)
            else:
                self._pods[name] = pod
            a = self._attempts.get(name)
            if a is not None and self._mine(a, pod):
                running = a.end is None
                self._observe(a, pod)
                if running and a.end is not None and a.main:
                    self.live.ended(a.handle.job_id, a.handle.attempt, name)  # its last lines, now (logs.py)
                if kind == "DELETED":
                    a.gone = True
                    self._changed()

    def _changed(self) -> None:
        self.changes = next(self._marks)

    @staticmethod
    def _mine(a: PodAttempt, pod: Obj) -> bool:
        """Whether this pod object is the attempt's own, not an earlier pod of the same name.

        A start that was refused requeues the job with the same attempt number,
        so the next try's pod has the same name; the earlier pod's late events
        (its deletion) must not end the new one. Until its create call answers,
        an attempt owns no pod (nothing of it can end before its bind anyway);
        an adopted attempt owns the first it is shown.
        """
        uid = ob.uid(pod)
        if a.uid is None and a.adopted:
            a.uid = uid
        return a.uid is not None and a.uid == uid

    def _observe(self, a: PodAttempt, pod: Obj) -> None:
        a.seen = True
        if not a.disrupted and (d := disruption(pod)) is not None:
            a.disrupted, a.disrupted_since = d.what, d.since
            self._changed()
        if a.end is None:
            a.end = pod_end(pod)
            if a.end is not None:
                self._changed()
        problem = start_problem(pod) if a.end is None else None
        if problem is None:
            a.stuck = None
        else:
            if a.stuck is None:
                a.stuck_since = time.monotonic()
            a.stuck, a.never_starts = problem
            self._changed()

    def unstartable(self, a: PodAttempt) -> str | None:
        """Why the attempt's pod will not start, once it has failed to for ``start_timeout_s`` (at once for a
        problem no retry cures); None while it may still start. Its job then fails: held GPUs are freed."""
        if a.stuck is None:
            return None
        waited = time.monotonic() - a.stuck_since
        if not a.never_starts and waited < self.settings.start_timeout_s:
            return None
        after = "" if a.never_starts else f" (still failing after {waited:.0f} s)"
        return f"its pod {a.handle.name} could not start: {a.stuck}{after}"

    # ------------------------------------------------------------ start
    def launch(self, launch: Launch) -> PodHandle | GangHandle:
        """Begin to create and bind the attempt's pod (on a worker thread); the handle at once."""
        if launch.replicas:
            return self.gangs.launch(launch)
        node = str(launch.assignment.get("node", ""))
        return self.launch_pod(launch.job_id, launch.attempt, pod_name(launch.job_id, launch.attempt), node,
                               pod_manifest(launch, self.settings))

    def launch_pod(self, job_id: str, attempt: int, name: str, node: str, manifest: dict[str, Any],
                   before_bind: Callable[[Obj], None] | None = None) -> PodHandle:
        """Create and bind one pod of an attempt (a gang's replica, or the attempt's only pod), watched as ours.

        ``before_bind(created pod)``: what must exist before a kubelet may start it (a kernel pod's Secret,
        owned by the pod, so made after it); if it raises, the pod is deleted and the start fails with it.
        """
        handle = PodHandle(job_id, attempt, name, node)
        a = PodAttempt(handle)
        a.start = self.starts.one(a, manifest, node, before_bind)
        a.start.add_done_callback(self._start_done)
        with self._lock:
            self._attempts[handle.name] = a
        return handle

    def launch_gang(self, job_id: str, attempt: int, pods: list[tuple[str, str, dict[str, Any]]]) -> list[PodHandle]:
        """Create every pod of a gang's attempt (``(name, node, manifest)`` in rank order), then bind them all;
        one worker task for the whole gang, whose future every replica shares: a refusal of any pod deletes
        the ones created, so no pod of the gang is bound unless all of them exist."""
        attempts = [PodAttempt(PodHandle(job_id, attempt, name, node)) for name, node, _m in pods]
        future = self.starts.gang(attempts, [m for _n, _node, m in pods])
        with self._lock:
            for a in attempts:
                a.start = future
                self._attempts[a.handle.name] = a
        future.add_done_callback(self._start_done)
        return [a.handle for a in attempts]

    def _start_done(self, f: Any) -> None:
        if f.cancelled() or f.exception() is not None:
            self._changed()  # a refused start ends the attempt

    def pod_jobs(self) -> dict[str, str]:
        """Pod UID -> job id of the pods gpupool made, as the watch shows them now (its job label)."""
        with self._lock:
            pods = list(self._pods.values())
        out: dict[str, str] = {}
        for pod in pods:
            job, uid = ob.labels(pod).get(JOB_LABEL), ob.uid(pod)
            if job and uid:
                out[uid] = job
        return out

    def pod(self, name: str) -> Obj | None:
        """Our pod of that name as the watch last showed it (None: not seen, or gone)."""
        with self._lock:
            return self._pods.get(name)

    # ------------------------------------------------------------ watch
    def alive(self, handle: PodHandle | GangHandle) -> bool:
        if isinstance(handle, GangHandle):
            return self.gangs.alive(handle)
        with self._lock:
            a = self._attempts.get(handle.name)
            if a is None:
                return False
            if a.start is not None and not a.start.done():
                return True  # still being created and bound: a refused bind deletes the pod before it says so
            if start_error(a) is not None or self.unstartable(a) is not None:
                return False
            return a.end is None and not a.gone

    def _end_of(self, job_id: str, attempt: int) -> PodEnd | None:
        with self._lock:
            a = self._attempts.get(pod_name(job_id, attempt))
            return a.end if a is not None else self._finished.get((job_id, attempt))

    def exit_code(self, job_id: str, attempt: int) -> int | None:
        if (g := self.gangs.find(job_id, attempt)) is not None:
            return self.gangs.exit_code(g)
        end = self._end_of(job_id, attempt)
        return end.exit_code if end is not None else None

    def ended_on_its_own(self, job_id: str, attempt: int) -> bool:
        if (g := self.gangs.find(job_id, attempt)) is not None:
            return self.gangs.ended_on_its_own(g)
        end = self._end_of(job_id, attempt)
        return end is not None and end.on_its_own

    def interrupted(self, handle: PodHandle | GangHandle) -> Interrupted | None:
        if isinstance(handle, GangHandle):
            return self.gangs.interrupted(handle)
        with self._lock:
            a = self._attempts.get(handle.name)
            if a is None:
                return Interrupted("lost", "its pod is unknown to the scheduler; requeued")
            err = start_error(a)
            if err is not None and start_refused(a):
                return Interrupted("refused", err)
            if err is not None:
                return Interrupted("not-started", f"{err}; requeued")
            if a.end is None and (stuck := self.unstartable(a)) is not None:
                return Interrupted("unstartable", stuck)
            if a.end is None:
                return Interrupted("lost", f"its pod {handle.name} vanished without an exit status "
                                           f"(node {handle.node} lost, or the pod was deleted); requeued")
            if not a.end.on_its_own:
                return Interrupted("disrupted", disrupted_reason(handle.name, a.end))
            return None

    # ------------------------------------------------------------ stop
    async def stop(self, handle: PodHandle | GangHandle, grace_s: float) -> bool:
        """Delete the pod with the grace period; past it, delete it for good if its node is lost."""
        if isinstance(handle, GangHandle):
            return await self.gangs.stop(handle, grace_s)
        with self._lock:
            a = self._attempts.get(handle.name)
        if a is None:
            return True
        if a.start is not None:  # a delete before the create lands would be undone by the create
            try:
                await asyncio.wrap_future(a.start)
            except Exception:
                return True  # never started
        if not self.alive(handle):
            return True
        grace = max(0, int(round(grace_s)))
        await self._delete(handle.name, grace)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            if not self.alive(handle):
                return True
            await asyncio.sleep(0.05)
        forced = False
        while self.alive(handle) and time.monotonic() < deadline + STOP_WAIT_AFTER_GRACE_S:
            if not forced and self.node_lost(handle.node):
                log.warning("pod %s: node %s is lost; deleting the pod for good", handle.name, handle.node)
                await self._delete(handle.name, 0)
                forced = True
            await asyncio.sleep(0.1)
        return False

    async def _delete(self, name: str, grace: int) -> None:
        try:
            await asyncio.wrap_future(self.calls.submit(self._delete_retrying, name, grace))
        except Exception as e:
            log.warning("could not delete pod %s: %s", name, describe(e))

    def _delete_retrying(self, name: str, grace: int) -> None:
        try:
            self.calls.retrying("stop", lambda: self.api.delete_namespaced_pod(
                name, self.settings.namespace, grace_period_seconds=grace), STOP_WAIT_AFTER_GRACE_S)
        except ApiException as e:
            if e.status != 404:
                raise

    def _delete_quietly(self, name: str, grace: int) -> None:
        try:
            self._delete_retrying(name, grace)
        except Exception as e:
            log.warning("could not delete pod %s: %s", name, describe(e))

    # ------------------------------------------------------------ after the end
    def release(self, handle: PodHandle | GangHandle) -> None:
        """Keep the attempt's log (appended to the job's log file), then delete its finished pod."""
        if isinstance(handle, GangHandle):
            return self.gangs.release(handle)
        with self._lock:
            a = self._attempts.pop(handle.name, None)
        if a is None or start_error(a) is not None:
            return
        self._archive_later(handle.job_id, handle.attempt, handle.name)

    def _archive_later(self, job_id: str, attempt: int, name: str) -> None:
        """Queue the attempt's final log copy and its pod's deletion; until done the log is not settled."""
        with self._lock:
            self._copying[job_id] = self._copying.get(job_id, 0) + 1
        try:
            self.calls.submit(self._archive_and_delete, job_id, attempt, name)
        except RuntimeError:  # the pool is shut down (the service is stopping): nothing more will be copied
            self._copied(job_id)

    def _copied(self, job_id: str) -> None:
        with self._lock:
            left = self._copying.pop(job_id, 1) - 1
            if left > 0:
                self._copying[job_id] = left

    def _archive_and_delete(self, job_id: str, attempt: int, name: str) -> None:
        try:
            self.live.finish(job_id, attempt, name)  # what the live copy has not yet put in the job's log
        finally:
            self._copied(job_id)
        self._delete_quietly(name, 0)

    def log_settled(self, job_id: str) -> bool:
        """Whether the job's log file holds everything its ended pods printed (no final copy in flight).

        A job turns final as soon as the watch sees its container end; the
        last lines reach the file a moment later. ``gpupool logs -f`` stops at
        end-of-file of a final job, so it must not be told "the end" before.
        """
        with self._lock:
            return job_id not in self._copying

    def _live_pods(self) -> list[tuple[str, int, str]]:
        """(job, attempt, pod) of each single-pod attempt still running, for live logs (a gang's are its own)."""
        with self._lock:
            return [(a.handle.job_id, a.handle.attempt, name) for name, a in self._attempts.items()
                    if a.main and a.end is None and not a.gone]

    # ------------------------------------------------------------ recovery
    def recover(self, job_id: str, attempt: int, pid: int | None, pid_start: int | None) -> Recovered:
        """Find the attempt's pod by its name (job and attempt labels): adopt, finish, or requeue.

        Waits for the first list of our pods (at most ``sync_timeout_s``); an
        API server that does not answer by then leaves the attempt adopted, and
        the watch settles it once it can list.
        """
        name = pod_name(job_id, attempt)
        handle = PodHandle(job_id, attempt, name)
        a = PodAttempt(handle, adopted=True)
        if not self.watch.synced.wait(self.sync_timeout_s):
            with self._lock:
                self._attempts[name] = a
            return Recovered("running", handle)
        gang = self.gangs.recover(job_id, attempt)
        if gang is not None:
            return gang
        with self._lock:
            pod = self._pods.get(name)
            if pod is None:
                return Recovered("gone")  # never created, or deleted while we were away: resume it
            a.uid = ob.uid(pod)
            handle.node = ob.node_name(pod)
            if not handle.node:
                self.calls.submit(self._delete_quietly, name, 0)  # created, never bound: nothing ran
                return Recovered("not-started")
            self._observe(a, pod)
            end = a.end
            if end is not None and end.on_its_own:
                self._finished[(job_id, attempt)] = end
            else:  # running, or ended by a disruption: the core settles it knowing whether it asked for it
                self._attempts[name] = a
                end = None
        if end is not None:  # (outside the lock: _archive_later takes it)
            self._archive_later(job_id, attempt, name)
            return Recovered("gone", exit_code=end.exit_code)
        return Recovered("running", handle)

    def recovered(self, live: set[tuple[str, int]]) -> None:
        """Delete our pods that no running attempt accounts for (a crash between a job's end and its cleanup)."""
        self.calls.submit(self._sweep, set(live))

    def _sweep(self, live: set[tuple[str, int]]) -> None:
        if not self.watch.synced.wait(self.sync_timeout_s * 3):
            return
        with self._lock:
            ours = {pod_name(j, n) for j, n in live} | set(self._attempts)
            ours |= {pod_name(j, n) for j, n in self._finished}
            orphans = [p for p in self._pods.values() if ob.name(p) not in ours and not ob.being_deleted(p)]
        for p in orphans:
            labels = ob.labels(p)
            log.warning("deleting pod %s (job %s attempt %s): no running attempt of ours", ob.name(p),
                        labels.get(JOB_LABEL), labels.get(ATTEMPT_LABEL))
            self._delete_quietly(ob.name(p), self.settings_grace())
        self.gangs.sweep_services(live)

    def settings_grace(self) -> int:
        return max(0, int(round(self.settings.grace_s)))

    # ------------------------------------------------------------ paths
    def log_path(self, job_id: str) -> Path:
        """The job's log file; asked by ``read_log``, so someone reads it: its pod is followed closely."""
        self.live.viewed(job_id)
        return self._log_file(job_id)

    def _log_file(self, job_id: str) -> Path:
        return self.jobs_dir / job_id / "job.log"

    def replica_log_path(self, job_id: str, replica: int) -> Path:
        """A gang's replica ``replica``'s own log (archived from its pods)."""
        return self.jobs_dir / job_id / f"replica-{int(replica)}.log"

    def default_workdir(self, job_id: str) -> Path:
        return Path(WORKDIR_ROOT)
