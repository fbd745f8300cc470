"""The gang jobs of PodGroups (the Workload API): their watch, queueing and attempts (see :mod:`.workload_gangs`).

Pods that claim their GPUs through DRA (each its own claim, e.g. from a
ResourceClaimTemplate) are queued from their claims, as a kubectl pod's are
(GPU count, the kinds of nodes their selectors accept); when the gang is
admitted each pod's claim gets the GPUs the policy chose for its slot before
the pod is bound (:mod:`.dra_allocation`).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpupool.backends.base import ForeignJobHost, Interrupted, JobFacts, Launch, Recovered
from gpupool.backends.kubernetes import objects as ob
from gpupool.backends.kubernetes.admitted_gang import AdmittedGang
from gpupool.backends.kubernetes.adoption import evicted_reason
from gpupool.backends.kubernetes.calls import STOP_WAIT_AFTER_GRACE_S, Calls, bind_pod
from gpupool.backends.kubernetes.dra_allocation import with_affinity
from gpupool.backends.kubernetes.dra_claims import Ask, ClaimProblem, uses_claims
from gpupool.backends.kubernetes.dra_slices import DRA_NODE_LABEL
from gpupool.backends.kubernetes.foreign import PodRef, kubectl_pod_end, read_pod
from gpupool.backends.kubernetes.foreign_jobs import KubectlPods
from gpupool.backends.kubernetes.gates import has_our_gate, other_gates, remove_gate
from gpupool.backends.kubernetes.health import Health, describe
from gpupool.backends.kubernetes.objects import Obj
from gpupool.backends.kubernetes.watcher import ListWatch
from gpupool.backends.kubernetes.workload_gangs import (
    GROUP,
    PODGROUP_LABEL,
    PODGROUP_UID_LABEL,
    PODGROUPS,
    VERSION,
    GroupRef,
    group_name,
    job_key,
    min_count,
    ref_of,
)
from gpupool.wire.errors import InvalidRequest

log = logging.getLogger("gpupool.backends.kubernetes")


def _as_member(pod: Obj) -> Obj:
    """The pod read as a kubectl pod of its gang: its group's name aside (read_pod refuses it on its own)."""
    return {**pod, "spec": {k: v for k, v in ob.spec(pod).items() if k != "schedulingGroup"}}


@dataclass
class _Run:
    handle: AdmittedGang
    ref: GroupRef
    slots: list[str]
    bound: dict[str, str] = field(default_factory=dict)  # pod uid -> node
    gpus: list[tuple[str, ...]] = field(default_factory=list)  # GPU ids per slot (written into DRA claims)
    start: Any = None


class WorkloadGangs:
    """The PodGroups' watch, their gang jobs' attempts (an executor) and their queueing (a ForeignWork)."""

    def __init__(self, api: client.CoreV1Api, kubectl: KubectlPods, calls: Calls, health: Health) -> None:
        self.api = api
        self.custom = client.CustomObjectsApi(api.api_client)
        self.kubectl = kubectl
        self.calls = calls
        self._lock = threading.Lock()
        self._groups: dict[str, Obj] = {}  # PodGroup uid -> its JSON
        self.generation = 0
        self._refs: dict[str, GroupRef] = {}  # job id -> its PodGroup
        self._job_ids: dict[str, str] = {}  # PodGroup uid -> job id ("" = none)
        self._runs: dict[str, _Run] = {}
        self._finished: dict[tuple[str, int], int] = {}
        self._warned: set[tuple[str, str]] = set()
        self._seen: Hashable = None
        self.changes = 0
        self.pod_ask: Callable[[Obj], Ask | None] | None = None
        """What a member's own DRA claims ask for (raises ClaimProblem); None: claimed gangs are refused."""
        self.dra_nodes: Callable[[], bool] = lambda: False
        """Whether some node's GPUs come from ResourceSlices (pods asking nvidia.com/gpu are kept off them)."""
        self.claims_changes: Callable[[], Hashable] = lambda: None
        self.claims_synced: Callable[[], bool] = lambda: True
        self.before_bind: Callable[[PodRef, Obj | None, str, list[str]], None] | None = None
        """Writes a member's slot GPUs into its DRA claims before its binding."""
        self.watch: ListWatch | None = None
        if self._served():
            self.watch = ListWatch("podgroups", lambda **kw: self.custom.list_cluster_custom_object(
                GROUP, VERSION, PODGROUPS, **kw), self._on_reset, self._on_event, health)

    def _served(self) -> bool:
        try:
            groups = client.ApisApi(self.api.api_client).get_api_versions(_request_timeout=10).groups or []
            return any(g.name == GROUP and any(v.version == VERSION for v in g.versions or []) for g in groups)
        except Exception as e:
            log.warning("could not ask whether PodGroups are served: %s", describe(e))
            return False

    def start(self) -> None:
        if self.watch is not None:
            self.watch.start()

    def close(self) -> None:
        if self.watch is not None:
            self.watch.stop(wait_s=0.5)

    def _on_reset(self, groups: list[Obj]) -> None:
        with self._lock:
            self._groups = {ob.uid(g): g for g in groups}
            self.generation += 1

    def _on_event(self, event: str, group: Obj) -> None:
        with self._lock:
            if event == "DELETED":
                self._groups.pop(ob.uid(group), None)
            else:
                self._groups[ob.uid(group)] = group
            self.generation += 1

    # ------------------------------------------------------------ reads
    def owns_pod(self, pod: Obj) -> bool:
        """A pod naming a PodGroup is its gang's, never a kubectl pod queued on its own."""
        return self.watch is not None and bool(group_name(pod))

    def owns(self, job_id: str) -> bool:
        return job_id in self._refs

    def _members(self, ref: GroupRef, pods: dict[str, Obj] | None = None) -> list[Obj]:
        pods = self.kubectl.pods() if pods is None else pods
        return sorted((p for p in pods.values() if ob.namespace(p) == ref.namespace and group_name(p) == ref.name),
                      key=ob.name)

    def pod_jobs(self) -> dict[str, str]:
        with self._lock:
            return {uid: job_id for job_id, run in self._runs.items() for uid in run.bound}

    # ------------------------------------------------------------ executor: admission binds the whole gang
    def launch(self, launch: Launch) -> AdmittedGang:
        ref = self._refs[launch.job_id]
        slots = [r.node for r in launch.replicas] or [str(launch.assignment.get("node", ""))]
        gpus = [tuple(str(g["id"]) for g in a.get("gpus") or [])
                for a in ([r.assignment for r in launch.replicas] or [launch.assignment])]
        run = _Run(AdmittedGang(launch.job_id, launch.attempt, ref.name, start_time=int(time.time())), ref, slots,
                   gpus=gpus)
        with self._lock:
            self._runs[launch.job_id] = run
            run.start = self.calls.submit(self._bind_all, run)
        run.start.add_done_callback(lambda f: self._changed())
        return run.handle

    def _changed(self) -> None:
        self.changes += 1

    def _bind_all(self, run: _Run) -> None:
        """Bind one pending pod of the group to each slot (its gate removed first)."""
        pending = [p for p in self._members(run.ref) if not ob.node_name(p) and not ob.being_deleted(p)
                   and not other_gates(p)]
        if len(pending) < len(run.slots):
            raise RuntimeError(f"PodGroup {run.ref.text} has {len(pending)} pods to bind, not {len(run.slots)}")
        for i, (pod, node) in enumerate(zip(pending, run.slots, strict=False)):
            if self.before_bind is not None and uses_claims(pod):  # its slot's GPUs into its own claims first
                self.before_bind(PodRef(ob.namespace(pod), ob.name(pod), ob.uid(pod)), pod, node,
                                 list(run.gpus[i]) if i < len(run.gpus) else [])
            if has_our_gate(pod):
                remove_gate(self.api, ob.namespace(pod), ob.name(pod))
            bind_pod(self.api, ob.namespace(pod), ob.name(pod), node, ob.uid(pod))
            with self._lock:
                run.bound[ob.uid(pod)] = node

    def _ends(self, run: _Run) -> tuple[bool, int | None]:
        """(whether the gang ended, its exit code): a pod failed or vanished, or every pod succeeded."""
        pods = self.kubectl.pods()
        codes = []
        for uid in list(run.bound):
            pod = pods.get(uid)
            end = kubectl_pod_end(pod) if pod is not None else None
            if pod is None or (end is None and ob.being_deleted(pod)):
                return True, None
            if end is not None and end.exit_code != 0:
                return True, end.exit_code
            codes.append(end)
        return (bool(codes) and all(c is not None for c in codes)), 0

    def _start_error(self, run: _Run) -> str | None:
        f = run.start
        if f is None or not f.done() or f.exception() is None:
            return None
        return f"could not bind the pods of PodGroup {run.ref.text}: {describe(f.exception())}"

    def alive(self, handle: AdmittedGang) -> bool:
        run = self._runs.get(handle.job_id)
        if run is None or run.handle.attempt != handle.attempt:
            return False
        if run.start is not None and not run.start.done():
            return True
        return self._start_error(run) is None and not self._ends(run)[0]

    def exit_code(self, job_id: str, attempt: int) -> int | None:
        run = self._runs.get(job_id)
        if run is None or run.handle.attempt != attempt:
            return self._finished.get((job_id, attempt))
        ended, code = self._ends(run)
        return code if ended else None

    def ended_on_its_own(self, job_id: str, attempt: int) -> bool:
        return self.exit_code(job_id, attempt) is not None

    def interrupted(self, handle: AdmittedGang) -> Interrupted | None:
        run = self._runs.get(handle.job_id)
        if run is None:
            return None
        if (err := self._start_error(run)) is not None:
            self._delete_pods(run.ref, 0)  # part of the gang may be bound: never left half placed
            return Interrupted("lost", err)
        if self._ends(run) == (True, None):
            return Interrupted("lost", f"a pod of PodGroup {run.ref.text} was deleted outside gpupool")
        return None

    async def stop(self, handle: AdmittedGang, grace_s: float) -> bool:
        """Delete the group's pods (no pause: gpupool cannot recreate them) and wait until they ended."""
        run = self._runs.get(handle.job_id)
        if run is None:
            return True
        if run.start is not None:
            try:
                await asyncio.wrap_future(run.start)
            except Exception:
                pass
        await asyncio.get_running_loop().run_in_executor(None, self._delete_pods, run.ref, grace_s)
        deadline = time.monotonic() + grace_s + STOP_WAIT_AFTER_GRACE_S
        within = time.monotonic() + grace_s + 5.0
        while time.monotonic() < deadline and any(kubectl_pod_end(p) is None for p in self._members(run.ref)):
            await asyncio.sleep(0.05)
        return time.monotonic() <= within

    def _delete_pods(self, ref: GroupRef, grace_s: float, running_only: bool = False) -> None:
        for pod in self._members(ref):
            if running_only and (kubectl_pod_end(pod) is not None or ob.being_deleted(pod)):
                continue
            try:
                self.api.delete_namespaced_pod(ob.name(pod), ref.namespace,
                                               grace_period_seconds=max(0, int(round(grace_s))))
            except ApiException as e:
                if e.status != 404:
                    log.warning("could not delete pod %s/%s of PodGroup %s: %s", ref.namespace, ob.name(pod),
                                ref.text, describe(e))

    def release(self, handle: AdmittedGang) -> None:
        with self._lock:
            run = self._runs.get(handle.job_id)
            if run is not None and run.handle.attempt == handle.attempt:
                del self._runs[handle.job_id]
        if run is not None:  # a gang is all or nothing: one pod ended, those still running are deleted
            self.calls.submit(self._delete_pods, run.ref, 30.0, True)

    def recover(self, job_id: str, attempt: int) -> Recovered:
        """After a restart: running if its pods are bound, else never started."""
        self.kubectl.watch.synced.wait(20.0)
        ref = self._refs[job_id]
        bound = [p for p in self._members(ref) if ob.node_name(p)]
        if not bound:
            return Recovered("not-started")
        run = _Run(AdmittedGang(job_id, attempt, ref.name), ref, [ob.node_name(p) for p in bound],
                   {ob.uid(p): ob.node_name(p) for p in bound})
        with self._lock:
            self._runs[job_id] = run
        ended, code = self._ends(run)
        if ended:
            del self._runs[job_id]
            return Recovered("gone", exit_code=code)
        return Recovered("running", run.handle)

    # ------------------------------------------------------------ queueing (a ForeignWork, on the core's loop)
    def stands_for(self, job: JobFacts) -> str | None:
        ref = ref_of(job)
        return f"PodGroup {ref.text}" if ref is not None else None

    def track(self, job: JobFacts) -> None:
        ref = ref_of(job)
        if ref is not None:
            self._refs[job.id] = ref
            self._job_ids[ref.uid] = job.id

    def _warn(self, pods: list[Obj], reason: str, message: str) -> None:
        for p in pods:
            self.kubectl.warn_once(PodRef(ob.namespace(p), ob.name(p), ob.uid(p)), reason, message)

    def sync(self, host: ForeignJobHost) -> None:
        """Queue one gang job per PodGroup whose minCount pods exist; end waiting ones whose pods went."""
        kc = self.kubectl
        if self.watch is None or not self.watch.synced.is_set() or not kc.synced:
            return
        key = (self.generation, kc.generation, host.fingerprint(), self.claims_changes())
        if self._seen == key:
            return
        self._seen = key
        with self._lock:
            groups = list(self._groups.values())
        pods = kc.pods()
        queued = False
        for pg in groups:
            ref = GroupRef(ob.namespace(pg), ob.name(pg), ob.uid(pg))
            if not kc.namespaces.takes(ref.namespace) or ob.being_deleted(pg):
                continue
            members = [p for p in self._members(ref, pods) if not ob.being_deleted(p)]
            waiting = [p for p in members if not ob.node_name(p) and kubectl_pod_end(p) is None]
            job_id = self._job_ids.get(ref.uid)
            if job_id is None:
                job_id = self._job_ids[ref.uid] = host.job_for_key(job_key(ref.uid))
            need = min_count(pg)
            if job_id:
                if host.waiting_job(job_id) is not None and len(waiting) < need:
                    host.cancel(job_id, f"pods of PodGroup {ref.text} were deleted before gpupool bound them")
                continue
            if len(waiting) < need or any(other_gates(p) for p in waiting):
                continue  # the gang is not whole yet: nothing of it is queued, nothing bound
            if any(uses_claims(p) for p in waiting) and not self.claims_synced():
                self._seen = None  # read again once the DRA watches have listed everything
                continue
            job_id = self._queue(host, ref, waiting, need)
            queued = queued or bool(job_id)
        if queued:
            host.request_cycle()

    def _queue(self, host: ForeignJobHost, ref: GroupRef, pods: list[Obj], need: int) -> str:
        read = [read_pod(_as_member(p)) for p in pods]
        problem = next((r.problem for r in read if r.problem), "")
        gpus = [r.spec.get("gpus") for r in read]
        where: dict[str, Any] | None = None
        if not problem and any(uses_claims(p) for p in pods):
            try:
                claimed = self._claimed(pods, gpus)
            except ClaimProblem as e:
                problem = f"gpupool cannot queue this PodGroup: {e}"
            else:
                if claimed is None:
                    return ""  # a member's claim is not made yet: read again when it is
                gpus, where = claimed
        elif self.dra_nodes():
            where = {"key": DRA_NODE_LABEL, "operator": "DoesNotExist"}
        first = read[0]
        if not problem and len({(r.project, g) for r, g in zip(read, gpus, strict=True)}) != 1:
            problem = ("gpupool cannot queue this PodGroup: its pods must name the same project and ask for the "
                       "same whole nvidia.com/gpu")
        if not problem and not gpus[0]:
            problem = "gpupool cannot queue this PodGroup: its pods ask for no whole nvidia.com/gpu"
        if not problem and (why := self.kubectl.namespaces.refusal(ref.namespace, first.project)):
            problem = f"gpupool cannot queue this PodGroup: {why}"
        spec = {k: v for k, v in first.spec.items() if k not in ("gpu_fraction", "gpu_memory")}
        spec["gpus"] = gpus[0]
        if where is not None:
            spec = with_affinity(spec, where)
        spec.update(name=ref.text[:200], kind="train", command=[f"(PodGroup {ref.text})"],
                    labels={PODGROUP_LABEL: ref.text, PODGROUP_UID_LABEL: ref.uid})
        if need > 1:
            spec["replicas"] = need
        if not problem:
            try:
                job_id = host.queue(spec, first.user, f"queued from PodGroup {ref.text}", job_key(ref.uid))
            except InvalidRequest as e:
                problem = f"gpupool cannot queue this PodGroup: {e}"
        if problem:
            self._warn(pods, "GpupoolNotQueued", problem)
            return ""
        self._job_ids[ref.uid] = job_id
        self._refs[job_id] = ref
        return job_id

    def _claimed(self, pods: list[Obj], gpus: list[Any]) -> tuple[list[Any], dict[str, Any]] | None:
        """The members' GPUs and node-affinity expression from their own DRA claims; None while one is not made.

        Every member must claim (none may also ask for ``nvidia.com/gpu``),
        and all the same GPUs on the same kinds of nodes: one gang, one ask.
        """
        if self.pod_ask is None:
            raise ClaimProblem("its pods claim devices through DRA (resourceClaims), and this gpupool reads no "
                               "claims: ask for nvidia.com/gpu")
        if not all(uses_claims(p) for p in pods) or any(gpus):
            raise ClaimProblem("its pods claim devices through DRA (resourceClaims), but not all of them, or "
                               "some ask for nvidia.com/gpu too: give every pod its GPUs one way")
        asks = [self.pod_ask(p) for p in pods]
        if any(a is None for a in asks):
            return None
        shapes = {(a.gpus, a.kinds) for a in asks if a is not None}
        if len(shapes) != 1:
            raise ClaimProblem("its pods' claims ask for different GPUs (counts, or selectors accepting different "
                               "nodes); one gang asks for the same GPUs in every pod")
        ask = next(a for a in asks if a is not None)
        return [ask.gpus] * len(pods), ask.node_affinity()

    def on_new_work(self, wake: Callable[[], None]) -> None:
        """Nothing of its own: a gang's pods are kubectl pods, whose watch wakes the core (PodAdoption)."""

    def stopping(self, job: JobFacts, intent: str, reason: str) -> None:
        ref = ref_of(job)
        if ref is not None:
            word = "cancelled" if intent == "cancel" else "evicted (a PodGroup's gang is never paused)"
            self.calls.submit(self._warn, self._members(ref), "GpupoolStopped",
                              f"gpupool: {reason}; the gang is {word}: its pods are deleted")

    def rejected(self, job: JobFacts, reason: str) -> None:
        ref = ref_of(job)
        if ref is not None:
            self._warn(self._members(ref), "GpupoolRejected", f"gpupool rejected job {job.id}: {reason}")

    def cancelled(self, job: JobFacts, by: str, grace_s: float) -> None:
        ref = ref_of(job)
        if ref is not None:
            self.calls.submit(self._delete_pods, ref, grace_s)

    def evicted_reason(self, job: JobFacts) -> str:
        return f"{evicted_reason(job.reason)}; gpupool does not recreate a PodGroup's pods"

    def lost_reason(self, job: JobFacts, reason: str) -> str:
        return reason

    def pause_refusal(self, job: JobFacts) -> str:
        ref = ref_of(job)
        return (f"job {job.id} stands for PodGroup {ref.text if ref else '?'}, whose pods gpupool did not create "
                "and could not recreate after a pause; cancel the job (it deletes the pods) or delete the pods")
