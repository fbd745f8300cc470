"""Attempts of training jobs: start, stop, settle an ended process, follow the pool's changes.

:class:`Attempts` is one of the core's parts (gpupool.service.core builds
them): every transition is committed (with its event) before the action it
describes; a recorded exit status wins over a stop that came too late. After a
restart, :func:`gpupool.service.recovery.recover_attempts` adopts, finishes or
requeues each job stored as running, through these methods. A job that stands for
foreign work (a backend that ``AdoptsForeignPods``: a kubectl pod) is never
paused: evicted or lost, it ends cancelled, since gpupool cannot recreate
what it did not make.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from gpupool.backends.base import (
    AttemptHandle,
    Executor,
    ForeignJobHost,
    ForeignWork,
    KernelPods,
    Launch,
    ReplicaLaunch,
    kernel_pods_of,
)
from gpupool.envbuilder import gpu_environment, mps_running
from gpupool.inventory import GpuInfo
from gpupool.policy.model import MILLI, Start
from gpupool.service.book import JobBook, Lifecycle
from gpupool.service.config import ServiceConfig
from gpupool.service.jobs import assigned_gpus, job_reason
from gpupool.service.metrics import Metrics
from gpupool.service.placement_rules import placement_fields
from gpupool.service.pool_state import PoolState
from gpupool.service.store import JobRecord
from gpupool.service.watchdog import Watchdog

REFUSED_BACKOFF_MAX_S = 300.0
"""The longest a job whose pod the cluster refused waits before the next try (the backoff doubles to it)."""

FULL_SCAN_S = 2.0
"""The longest an executor's ``changes`` mark spares the liveness scan of every running attempt."""

log = logging.getLogger("gpupool.service")

PAUSE_INTENTS = {"pause": "paused by user", "preempt": "paused to make room", "shutdown": "paused by a service shutdown"}


def _gone_node(rec: JobRecord, gpus: dict[str, GpuInfo]) -> str:
    """The node of a running job's GPU that is no longer in the pool: a gang's replica's own, else the job's."""
    for r in (rec.assignment or {}).get("replicas", []):
        if any(g["id"] not in gpus for g in r.get("gpus", [])):
            return str(r.get("node"))
    return str((rec.assignment or {}).get("node"))


def _ran_on(rec: JobRecord) -> dict[str, Any]:
    """``last_assignment`` for an attempt that ends now: where it ran; nothing when it held no GPUs.

    The attempt's ``assignment`` is cleared as it ends (what a project holds
    is counted from it), so this copy is what still says, once the job is
    finished or paused, which GPUs it last ran on. A job that ends without
    holding any (cancelled while queued or paused) keeps the last one it had.
    """
    return {"last_assignment": rec.assignment} if rec.assignment else {}


class Attempts:
    """The attempts of the core's jobs: the running ones' handles, their stops, how each ended.

    ``request_cycle`` asks the cycle for a run soon (an attempt ended, the
    pool changed, a hold is over). ``foreign`` (with ``foreign_host``) is the
    backend's :class:`gpupool.backends.base.ForeignWork` when it has that
    capability, else None.
    """

    def __init__(self, config: ServiceConfig, book: JobBook, pool: PoolState, executor: Executor[Any], metrics: Metrics,
                 watchdog: Watchdog, life: Lifecycle, request_cycle: Callable[[], None],
                 foreign: ForeignWork | None = None, foreign_host: ForeignJobHost | None = None) -> None:
        self.config = config
        self.book = book
        self.pool = pool
        self.executor = executor
        self.metrics = metrics
        self.watchdog = watchdog
        self.life = life
        self.request_cycle = request_cycle
        self.foreign = foreign
        self.foreign_host = foreign_host
        self.procs: dict[str, AttemptHandle] = {}
        # Keyed by (job, attempt): a stop of an attempt that already ended must never hide
        # the stop of the job's next attempt (pause, resume, cancel in quick succession).
        self.stop_tasks: dict[tuple[str, int], asyncio.Task[bool]] = {}
        self.settled: dict[str, asyncio.Event] = {}
        self._mps_checked: tuple[float, bool] | None = None
        self._alive_mark: Any = None  # the executor's change mark at the last liveness scan
        self._alive_scanned_at = 0.0

    def mps(self) -> bool:
        """Whether to add MPS limits: the config, else a detection cached for a minute (it scans /proc)."""
        if self.config.mps is not None:
            return self.config.mps
        now = time.monotonic()
        if self._mps_checked is None or now - self._mps_checked[0] > 60:
            self._mps_checked = (now, mps_running())
        return self._mps_checked[1]

    def assignment_wire(self, rec: JobRecord, s: Start) -> dict[str, Any]:
        gpus = []
        want_mem = rec.request.get("gpu_memory")
        for gid, m in s.assignment.gpus:
            g = self.pool.gpus[gid]
            limit = min(int(want_mem), g.memory) if want_mem and m < MILLI else g.memory * m // MILLI
            gpus.append({"id": gid, "index": g.index, "model": g.model, "milli": m, "memory_limit": limit})
        return {"node": s.assignment.node, "gpus": gpus}

    def gang_assignment_wire(self, rec: JobRecord, starts: list[Start]) -> dict[str, Any]:
        """A gang's Job assignment: rank 0's node, every replica's GPUs in rank order, and each replica's own."""
        replicas = [{"rank": k, **self.assignment_wire(rec, x)} for k, x in enumerate(starts)]
        return {"node": replicas[0]["node"], "gpus": [g for r in replicas for g in r["gpus"]], "replicas": replicas}

    def gpu_env(self, rec: JobRecord, gpus: list[dict[str, Any]], attempt: int) -> dict[str, str]:
        """:func:`gpu_environment` for these GPUs (a job's, or one replica's own)."""
        shares = [(g["id"], g["milli"], g["memory_limit"]) for g in gpus]
        env = gpu_environment(rec.id, rec.project, shares, attempt, attempt > 1, self.pool.simulated,
                              mps=self.mps(),
                              pythonpath=rec.job_env.get("PYTHONPATH", os.environ.get("PYTHONPATH", "")))
        if self.pool.sim_use_dir is not None and shares:  # the simulation hook's folder (gpupool.sim_use)
            env["GPUPOOL_SIM_USE_DIR"] = str(self.pool.sim_use_dir)
        return env

    def start(self, rec: JobRecord, starts: list[Start]) -> None:
        """Start the job's attempt (:meth:`_start_attempt`); a foreign build share is then bound like a train job.

        A build job otherwise starts nothing (its share is a lease); one that
        stands for foreign work (a kubectl pod asking for a build share) has
        that work to bind, and lives as long as it does (no lease).
        """
        self._start_attempt(rec, starts)
        if rec.kind == "build" and (pods := kernel_pods_of(self.pool.backend)) is not None and pods.runs(rec):
            self._launch_kernel_pod(rec, pods)
            return
        if rec.kind != "build" or self.foreign is None or self.foreign.stands_for(rec) is None:
            return
        fresh = self.book.job(rec.id)
        if fresh is None or fresh.state != "running":
            return
        self.book.update(rec.id, lease_expires_at=None)  # it lives as long as its pod
        launch = Launch(rec.id, fresh.attempts, [], "", rec.user, rec.project, {}, dict(fresh.env),
                        dict(fresh.assignment or {}))
        try:
            self.procs[rec.id] = self.executor.launch(launch)
        except Exception as e:
            self.finish(fresh, "failed", f"could not start: {e}")

    def _launch_kernel_pod(self, rec: JobRecord, pods: KernelPods) -> None:
        """A granted share with a kernel pod: the backend makes and binds the pod, watched as an attempt.

        The share keeps its lease (its Jupyter server renews it, so culling and a lost server end it as for
        a local kernel); ending the share deletes the pod (:meth:`finish`), and the pod ending ends the share.
        """
        fresh = self.book.job(rec.id)
        if fresh is None or fresh.state != "running":
            return
        launch = Launch(rec.id, fresh.attempts, [], "", rec.user, rec.project, {}, dict(fresh.env),
                        dict(fresh.assignment or {}), placement=placement_fields(rec.request))
        try:
            self.procs[rec.id] = pods.launch(launch)
        except Exception as e:
            self.finish(fresh, "cancelled", f"its kernel pod could not be made: {e}")

    def _start_attempt(self, rec: JobRecord, starts: list[Start]) -> None:
        """Record "starting attempt N" durably, then act (spawn, or grant the lease).

        ``starts``: the policy's start of the job, or of each replica of a
        gang in rank order (all of them: a gang starts whole). A gang is one
        attempt of one job: one Launch whose ``replicas`` give each rank its
        node, the GPU environment of its own GPUs and its own assignment.
        """
        attempt = rec.attempts + 1
        now = time.time()
        gang = len(starts) > 1
        assignment = self.gang_assignment_wire(rec, starts) if gang else self.assignment_wire(rec, starts[0])
        replica_assignments = assignment.get("replicas", [])
        gpu_env = self.gpu_env(rec, replica_assignments[0]["gpus"] if gang else assignment["gpus"], attempt)
        lead = starts[0]
        fields: dict[str, Any] = dict(
            state="running", attempts=attempt, assignment=assignment, started_at=now,
            preemptible=any(x.preemptible for x in starts),
            pid=None, pid_start=None, stop_intent=None, exit_code=None,
        )
        if rec.held_until is not None:
            fields["held_until"] = None  # its hold (after a refused pod) is over
        if rec.kind == "build":
            fields.update(env=gpu_env, reason=lead.reason, lease_expires_at=now + self.config.lease_s)
            self.book.transition(rec.id, **fields)
            return
        reason = job_reason(rec, lead.reason)
        # "running" is committed, with its event, before the process exists: a service killed
        # before the spawn finds the launch ticket unclaimed at restart and requeues the job.
        self.book.transition(rec.id, reason=(f"resumed (attempt {attempt}): " if attempt > 1 else "") + reason,
                         **fields)
        replicas = tuple(
            ReplicaLaunch(r["rank"], r["node"], self.gpu_env(rec, r["gpus"], attempt) if r["rank"] else gpu_env,
                          {"node": r["node"], "gpus": r["gpus"]})
            for r in replica_assignments)
        launch = Launch(rec.id, attempt, list(rec.command or []), rec.workdir, rec.user, rec.project,
                        dict(rec.job_env), gpu_env, assignment, image=rec.image or "", replicas=replicas,
                        placement=placement_fields(rec.request))
        try:
            handle = self.executor.launch(launch)
        except Exception as e:  # cannot spawn: a clear, final failure rather than a retry loop
            self.finish(rec, "failed", f"could not start: {e}")
            return
        self.procs[rec.id] = handle
        if handle.pid is not None:  # a local process: kept for re-adoption after a restart
            self.book.update(rec.id, pid=handle.pid, pid_start=handle.start_time)
        # else (a pod): nothing to re-adopt by pid; the record already says pid None, and recovery finds
        # the attempt by its name, so a second write (and commit) per start would store nothing of use

    # ================================================================ stopping and finishing
    def begin_stop(self, rec: JobRecord, intent: str, reason: str) -> None:
        """Record the intent, then ask the job's process to stop (SIGKILL after the grace) in the background.

        A command that has already ended is settled from its own exit status
        instead: the stop comes too late, and a finished job never runs again. Foreign work is
        told first why it is stopped (``kubectl describe pod`` shows it).
        """
        if self.foreign is not None:
            self.foreign.stopping(rec, intent, reason)
        handle = self.procs.get(rec.id)
        if handle is not None and not self.executor.alive(handle):
            self.settle_ended(rec.id, handle)
            return
        self.book.transition(rec.id, stop_intent=intent, reason=reason)
        if handle is None:
            fresh = self.book.job(rec.id)
            if fresh is not None:
                self.finish_attempt(fresh, None)
            return
        self.spawn_stop(rec.id, handle)

    def spawn_stop(self, job_id: str, handle: AttemptHandle) -> None:
        """Stop this attempt's process group in the background (once per attempt)."""
        key = (job_id, handle.attempt)
        if key in self.stop_tasks:
            return
        task = asyncio.get_running_loop().create_task(self.executor.stop(handle, self.config.pause_grace_s))
        self.stop_tasks[key] = task
        task.add_done_callback(lambda _t: self.stop_tasks.pop(key, None))

    def check_processes(self) -> None:
        """Monitor: follow the pool's changes, and settle every attempt whose wrapper has ended.

        An executor with a ``changes`` mark (the Kubernetes one: it moves
        whenever an attempt may have stopped being alive) spares the scan of
        every running attempt while the mark stands still; one runs at least
        every ``FULL_SCAN_S`` all the same. Executors without it (local
        processes, which end unannounced) are scanned every time.
        """
        self.follow_pool()
        if self.foreign is not None and self.foreign_host is not None and not self.life.closing:
            try:
                self.foreign.sync(self.foreign_host)
            except Exception:  # a bad pod must not stop the monitor
                log.exception("queueing kubectl pods failed")
        mark = getattr(self.executor, "changes", None)
        now = time.monotonic()
        if mark is not None and mark == self._alive_mark and now - self._alive_scanned_at < FULL_SCAN_S:
            return
        self._alive_mark, self._alive_scanned_at = mark, now  # read before the scan: a change during it rescans
        ended = [(jid, h) for jid, h in list(self.procs.items()) if not self.executor.alive(h)]
        for jid, h in ended:
            self.settle_ended(jid, h)
        if ended and not self.life.closing:
            self.request_cycle()

    def follow_pool(self) -> None:
        """Take the backend's pool changes (a cluster's nodes come and go); requeue work off the pool.

        A job on a node that left the pool (cordoned, not ready, deleted) is
        stopped like a preemption and resumes elsewhere from its checkpoint: it
        did nothing wrong, so it is never failed. A build share there is cancelled
        (its kernel gets a new one by asking again).
        """
        if not self.pool.follow():
            return
        for rec in self.book.live_jobs(("running",)):
            if all(g["id"] in self.pool.gpus for g in assigned_gpus(rec)):
                continue
            why = (f"node {_gone_node(rec, self.pool.gpus)} left the pool (cordoned, not ready or deleted); "
                   "requeued")
            if rec.kind == "build":
                self.finish(rec, "cancelled", why)
            elif rec.stop_intent is None:
                self.metrics.pauses.labels("node").inc()
                self.begin_stop(rec, "preempt", why)
        if not self.life.closing:
            self.request_cycle()

    def settle_ended(self, job_id: str, handle: AttemptHandle) -> None:
        """An attempt has ended: forget it, record how it ended, then let the executor free what it left."""
        self.procs.pop(job_id, None)
        try:
            rec = self.book.job(job_id)
            if rec is None or rec.state != "running" or rec.attempts != handle.attempt:
                return
            why = self.executor.interrupted(handle)
            if rec.refusals and (why is None or why.kind != "refused"):
                self.book.update(job_id, refusals=0)  # a start not refused ends the run of refusals
            if why is not None and why.kind == "refused":
                self.requeue_refused(rec, why.reason)  # never ran: even a stop asked meanwhile has nothing to stop
                return
            if why is not None and rec.stop_intent is None:
                if why.kind == "not-started":
                    self.requeue_unstarted(rec, why.reason)
                elif why.kind == "unstartable":
                    self.finish(rec, "failed", why.reason)
                else:  # lost, or disrupted by someone else (gpupool asked for no stop): resume it
                    self.finish_attempt(rec, None, lost=True, lost_reason=why.reason)
                return
            # No interruption, or a disruption gpupool itself asked for (its stop intent, kept in the store):
            # the exit status is read as for any stop.
            ended = why is None or why.kind == "disrupted"
            self.finish_attempt(rec, self.executor.exit_code(job_id, handle.attempt) if ended else None)
        finally:
            self.executor.release(handle)

    def requeue_unstarted(self, rec: JobRecord, reason: str) -> None:
        """The attempt provably never ran: back to the queue as before it, the attempt not counted."""
        attempt = rec.attempts
        self.book.transition(rec.id, state="queued" if attempt <= 1 else "paused", attempts=attempt - 1,
                         assignment=None, started_at=None, stop_intent=None, pid=None, pid_start=None,
                         reason=reason)
        ev = self.settled.pop(rec.id, None)
        if ev is not None:
            ev.set()

    def requeue_refused(self, rec: JobRecord, reason: str) -> None:
        """The cluster refused the attempt's pod: it never ran. Its GPUs go back now; the job waits, held for a
        backoff (the policy does not see it meanwhile, so the jobs behind it get the room), with the API
        server's message as its reason; the ``kube_refusals_before_failure``-th refusal in a row fails it.

        A stop asked while the pod was being created (pause, cancel, preempt) is honoured as for a job that
        had not started: cancel finishes it, a user pause keeps it paused, anything else requeues it.
        """
        refusals = rec.refusals + 1
        limit = self.config.kube_refusals_before_failure
        intent = rec.stop_intent
        uncounted: dict[str, Any] = {"attempts": rec.attempts - 1, "refusals": refusals, "last_assignment": rec.last_assignment}
        if intent == "cancel":
            self.finish(rec, "cancelled", rec.reason or "cancelled", **uncounted)
            return
        if refusals >= limit and intent is None:
            self.finish(rec, "failed", f"{reason} (refused {refusals} time{'s' if refusals > 1 else ''} in a row; "
                                        "failed after kube_refusals_before_failure)", **uncounted)
            return
        wait = min(self.config.kube_refused_backoff_s * 2 ** (refusals - 1), REFUSED_BACKOFF_MAX_S)
        attempt = rec.attempts
        user_paused = intent == "pause"
        state = "paused" if attempt > 1 or user_paused else "queued"
        self.book.transition(rec.id, state=state, attempts=attempt - 1, assignment=None, started_at=None,
                         stop_intent=None, pid=None, pid_start=None, refusals=refusals,
                         held_until=time.time() + wait, user_paused=user_paused,
                         reason=f"{reason}; refusal {refusals} of {limit}, tried again in {wait:g} s")
        if not self.life.closing:  # run a cycle when the hold is over (the tick would, a little later)
            asyncio.get_running_loop().call_later(wait + 0.01, self.request_cycle)
        ev = self.settled.pop(rec.id, None)
        if ev is not None:
            ev.set()

    def finish_attempt(self, rec: JobRecord, code: int | None, lost: bool = False,
                       lost_reason: str = "process lost during restart; requeued") -> None:
        """An attempt's process is gone: decide the job's next state from the stop intent and the exit code.

        A command that ended on its own before the stop reached it (its wrapper
        says so) has finished: its exit status wins over the intent. A job that
        stands for foreign work is never paused: evicted or lost, it ends
        cancelled (the work is not ours to recreate).
        """
        pods = kernel_pods_of(self.pool.backend) if rec.kind == "build" else None
        if pods is not None and pods.runs(rec):  # a kernel pod's share: its kernel is gone; a new one asks again
            how = lost_reason if lost else f"exit code {code}" if code is not None else "no exit status"
            self.finish(rec, "cancelled", f"its kernel pod ended ({how})", exit_code=code)
            return
        intent = rec.stop_intent
        if intent is not None and code is not None and self.executor.ended_on_its_own(rec.id, rec.attempts):
            intent = None
        if self.foreign is not None and self.foreign.stands_for(rec) is not None:
            if intent in PAUSE_INTENTS:
                self.watchdog.forget(rec.id)
                self.finish(rec, "cancelled", self.foreign.evicted_reason(rec), exit_code=code)
                return
            if intent is None and lost:
                self.watchdog.forget(rec.id)
                self.finish(rec, "cancelled", self.foreign.lost_reason(rec, lost_reason))
                return
        self.watchdog.forget(rec.id)
        if intent in PAUSE_INTENTS:
            reason = rec.reason or PAUSE_INTENTS[intent]
            self.book.transition(rec.id, state="paused", paused_at=time.time(), assignment=None, pid=None,
                             pid_start=None, stop_intent=None, exit_code=code, reason=reason,
                             user_paused=(intent == "pause"), preemptible=False, **_ran_on(rec))
            if intent != "preempt":
                self.metrics.pauses.labels(intent).inc()
        elif intent == "cancel":
            self.finish(rec, "cancelled", rec.reason or "cancelled", exit_code=code)
        elif intent == "watchdog":
            self.finish(rec, "failed", rec.reason, exit_code=code)
        elif lost:
            self.book.transition(rec.id, state="paused", paused_at=time.time(), assignment=None, pid=None,
                             pid_start=None, stop_intent=None, user_paused=False, preemptible=False,
                             reason=lost_reason, **_ran_on(rec))
        elif code is None:
            self.finish(rec, "failed", "the process ended without an exit status (killed from outside?)")
        elif code == 0:
            self.finish(rec, "succeeded", "exited with code 0", exit_code=0)
        else:
            how = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
            self.finish(rec, "failed", how, exit_code=code)
        ev = self.settled.pop(rec.id, None)
        if ev is not None:
            ev.set()

    def finish(self, rec: JobRecord, state: str, reason: str, exit_code: int | None = None,
                **more: Any) -> None:
        """``more``: other fields written in the same transition (a refused attempt's uncounting).

        A share's kernel pod is deleted at once (the share is free now; the pod goes in the background).
        """
        if rec.kind == "build" and (pods := kernel_pods_of(self.pool.backend)) is not None and pods.runs(rec):
            pods.forget(rec.id)
            handle = self.procs.get(rec.id)
            if handle is not None and self.executor.alive(handle):
                self.spawn_stop(rec.id, handle)
        self.book.transition(rec.id, state=state, reason=reason, finished_at=time.time(), exit_code=exit_code,
                         assignment=None, pid=None, pid_start=None, stop_intent=None, env={},
                         lease_expires_at=None, **{**_ran_on(rec), **more})
        self.metrics.finished.labels(state).inc()
        ev = self.settled.pop(rec.id, None)
        if ev is not None:
            ev.set()
        if state == "rejected" and self.foreign is not None:
            self.foreign.rejected(rec, reason)  # foreign work the policy rejects is told why (it stays unplaced)

    async def await_grant(self, job_id: str) -> None:
        """A build share waiting only for preempted jobs to stop: give them ``reply_wait_s`` to do so.

        A kernel asking for its share then gets it in the submit reply in the
        common case (victims that checkpoint promptly), not one poll later.
        """
        deadline = time.monotonic() + self.config.reply_wait_s
        while time.monotonic() < deadline:
            rec = self.book.job(job_id)
            if rec is None or rec.state != "queued":
                return
            # Shares are released when a stopping job's exit is recorded (its stop_intent cleared).
            if not any(r.stop_intent is not None for r in self.book.live.values()):
                return
            await asyncio.sleep(0.02)

    async def await_settled(self, job_id: str) -> None:
        rec = self.book.job(job_id)
        if rec is None or rec.state != "running" or rec.stop_intent is None:
            return
        ev = self.settled.setdefault(job_id, asyncio.Event())
        try:
            await asyncio.wait_for(ev.wait(), self.config.reply_wait_s)
        except asyncio.TimeoutError:
            pass
