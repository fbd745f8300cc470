"""Multi-node gangs on Kubernetes: one pod per replica under one handle, found by name through a headless Service.

A gang's attempt (a ``Launch`` with ``replicas``) becomes one pod per replica,
``gpupool-<job>-<attempt>-r<K>``, each bound to its replica's node
(:class:`gpupool.backends.kubernetes.executor.PodExecutor` watches them all). Every pod is
created before any is bound: a pod the API server refuses (a ResourceQuota)
deletes the ones created, so no replica runs unless all of them can. Each
pod gets ``hostname`` = its name and ``subdomain`` = a headless Service
gpupool keeps per gang job (``gpupool-<job>``, selecting the job's pods,
publishing them before they are ready), so rank 0 is
``<pod>.<service>.<namespace>.svc`` in cluster DNS: that is ``MASTER_ADDR``.
Every pod has its own IP, so ``MASTER_PORT`` is one fixed port (29500,
torch's own default).

The gang is one attempt to the core: it is alive while any replica pod
may run; one replica ending non-zero on its own (or refused, or vanished)
stops the others (deleted with the grace: the checkpoint signal, then
SIGKILL) and decides the outcome; a stop deletes every pod; the logs are
archived per replica (``replica-K.log``) and into the job's log with ``[K] ``
prefixes. The Service is made at each attempt's start and deleted after its
end unless the job already runs again; the sweep after a restart deletes any
left by a crash.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import re
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kubernetes.client.rest import ApiException

from gpupool.backends.base import Interrupted, Launch, Recovered
from gpupool.backends.kubernetes import objects as ob
from gpupool.backends.kubernetes.calls import raw_json
from gpupool.backends.kubernetes.health import describe
from gpupool.backends.kubernetes.names import (
    ATTEMPT_LABEL,
    JOB_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    MANAGED_SELECTOR,
    pod_name,
)
from gpupool.backends.kubernetes.pod_starts import PodAttempt, start_error, start_refused
from gpupool.backends.kubernetes.pods import PodEnd, PodHandle, PodSettings, label_value, pod_manifest
from gpupool.backends.rendezvous import rendezvous_env

if TYPE_CHECKING:
    from gpupool.backends.kubernetes.executor import PodExecutor

log = logging.getLogger("gpupool.backends.kubernetes")

REPLICA_LABEL = "gpupool.io/replica"
REPLICAS_ANNOTATION = "gpupool.io/replicas"
MASTER_PORT = 29500
_NOT_DNS = re.compile(r"[^a-z0-9-]")


def replica_pod_name(job_id: str, attempt: int, rank: int) -> str:
    """Replica ``rank``'s pod of one attempt (also its DNS hostname): deterministic, found again after a restart."""
    return f"{pod_name(job_id, attempt)}-r{rank}"


def gang_service_name(job_id: str) -> str:
    """The job's headless Service (a DNS-1035 label): the subdomain of its replicas' pods."""
    return _NOT_DNS.sub("-", f"gpupool-{job_id.lower()}")[:63].rstrip("-")


def master_addr(job_id: str, attempt: int, namespace: str) -> str:
    """Rank 0's DNS name, as every replica reaches it."""
    return f"{replica_pod_name(job_id, attempt, 0)}.{gang_service_name(job_id)}.{namespace}.svc"


def replica_manifests(launch: Launch, settings: PodSettings) -> list[tuple[int, str, str, dict[str, Any]]]:
    """``(rank, node, pod name, manifest)`` of each replica: a job pod of its own GPUs, plus the gang's names."""
    n = len(launch.replicas)
    addr = master_addr(launch.job_id, launch.attempt, settings.namespace)
    out = []
    for r in sorted(launch.replicas, key=lambda r: r.rank):
        one = dataclasses.replace(launch, gpu_env={**r.gpu_env, **rendezvous_env(r.rank, n, addr, MASTER_PORT)},
                                  assignment=r.assignment, replicas=())
        manifest = pod_manifest(one, settings)
        name = replica_pod_name(launch.job_id, launch.attempt, r.rank)
        manifest["metadata"]["name"] = name
        manifest["metadata"]["labels"][REPLICA_LABEL] = str(r.rank)
        manifest["metadata"]["annotations"][REPLICAS_ANNOTATION] = str(n)
        manifest["metadata"]["annotations"]["gpupool.io/node"] = r.node
        manifest["spec"]["hostname"] = name
        manifest["spec"]["subdomain"] = gang_service_name(launch.job_id)
        out.append((r.rank, r.node, name, manifest))
    return out


def service_manifest(job_id: str, namespace: str) -> dict[str, Any]:
    """The headless Service that gives the job's pods their DNS names (no cluster IP, no proxying)."""
    return {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": gang_service_name(job_id), "namespace": namespace,
                     "labels": {JOB_LABEL: label_value(job_id), MANAGED_BY_LABEL: MANAGED_BY}},
        "spec": {"clusterIP": "None", "publishNotReadyAddresses": True,
                 "selector": {JOB_LABEL: label_value(job_id), MANAGED_BY_LABEL: MANAGED_BY},
                 "ports": [{"name": "rendezvous", "port": MASTER_PORT, "targetPort": MASTER_PORT}]},
    }


def _raw(resp: Any) -> None:
    """Read a raw reply to its end (the connection goes back to the pool); the client cannot parse a
    Service deletion's reply (the deleted Service, where it expects a Status)."""
    try:
        resp.read()
    finally:
        resp.release_conn()


_BROKEN = {"refused": "refused", "gone": "lost", "unstartable": "unable to start",
           "disrupted": "deleted or evicted from outside"}
"""How a broken replica's pod is told of in the log."""


@dataclass
class GangHandle:
    """A gang's attempt as the core holds it: its replicas' pod handles, in rank order."""

    job_id: str
    attempt: int
    name: str
    node: str
    replicas: list[PodHandle]
    pid: int | None = None
    start_time: int = 0
    ends: dict[int, PodEnd] = field(default_factory=dict)  # rank -> how its pod ended
    order: list[int] = field(default_factory=list)  # ranks in the order their ends were seen
    failure: tuple[int, int | None] | None = None  # the replica whose own failure ends the gang
    broken: tuple[int, str] | None = None  # a replica refused ("refused"), vanished ("gone"), "disrupted"...
    stopping: bool = False


class GangPods:
    """The gang half of the pod executor: it keeps each replica as one of the executor's own pods."""

    def __init__(self, px: PodExecutor) -> None:
        self.px = px
        self._lock = threading.Lock()
        self._gangs: dict[tuple[str, int], GangHandle] = {}  # attempts the core holds
        self._finished: dict[tuple[str, int], GangHandle] = {}  # ended attempts found by recovery
        self._svc_lock = threading.Lock()  # a Service's create and delete never cross (see _drop_service)

    def find(self, job_id: str, attempt: int) -> GangHandle | None:
        """The gang of this attempt, held or found ended by recovery; None for a one-pod attempt."""
        with self._lock:
            return self._gangs.get((job_id, attempt)) or self._finished.get((job_id, attempt))

    # ------------------------------------------------------------ start
    def launch(self, launch: Launch) -> GangHandle:
        """The Service (if missing), then every replica's pod, each created and bound on a worker thread."""
        made = replica_manifests(launch, self.px.settings)
        g = GangHandle(launch.job_id, launch.attempt, pod_name(launch.job_id, launch.attempt), made[0][1], [])
        with self._lock:
            self._gangs[(g.job_id, g.attempt)] = g
        self.px.calls.submit(self._ensure_service, launch.job_id)
        g.replicas.extend(self.px.launch_gang(launch.job_id, launch.attempt,
                                              [(name, node, manifest) for _rank, node, name, manifest in made]))
        return g

    def _ensure_service(self, job_id: str) -> None:
        ns = self.px.settings.namespace
        with self._svc_lock:
            try:
                self.px.calls.retrying("start", lambda: self.px.api.create_namespaced_service(
                    ns, ob.client_body(service_manifest(job_id, ns))), 30.0)
            except ApiException as e:
                if e.status != 409:  # 409: it is there from an earlier attempt
                    log.warning("job %s: could not create its headless Service %s (replicas will not find rank 0 "
                                "by name): %s", job_id, gang_service_name(job_id), describe(e))
            except Exception as e:
                log.warning("job %s: could not create its headless Service: %s", job_id, describe(e))

    def _drop_service(self, job_id: str) -> None:
        """Delete the job's Service unless an attempt of the job runs again (checked under the same lock)."""
        with self._svc_lock:
            with self._lock:
                if any(j == job_id for j, _ in self._gangs):
                    return
            try:
                _raw(self.px.api.delete_namespaced_service(gang_service_name(job_id), self.px.settings.namespace,
                                                           _preload_content=False))
            except ApiException as e:
                if e.status != 404:
                    log.warning("could not delete Service %s: %s", gang_service_name(job_id), describe(e))
            except Exception as e:
                log.warning("could not delete Service %s: %s", gang_service_name(job_id), describe(e))

    # ------------------------------------------------------------ watch
    def _state(self, h: PodHandle) -> tuple[str, PodEnd | None]:
        """One replica: "starting", "running", "ended" (with its end), "refused" (bind refused), "gone", or
        "unstartable" (its container cannot start: an image that cannot be pulled)."""
        px = self.px
        with px._lock:
            a = px._attempts.get(h.name)
            if a is None:
                return "gone", None
            if a.start is not None and not a.start.done():
                return "starting", None
            if start_error(a) is not None:
                return "refused", None
            if a.end is not None:
                return "ended", a.end
            if a.gone:
                return "gone", None
            return ("unstartable", None) if px.unstartable(a) is not None else ("running", None)

    def alive(self, g: GangHandle) -> bool:
        """Whether any replica may still run; the first replica to fail, be refused or vanish stops the others."""
        states = [self._state(h) for h in g.replicas]
        trigger = False
        if not (g.stopping or g.failure is not None or g.broken is not None):
            # A replica deleted or evicted from outside comes first: the others' failures that follow (their
            # peer gone) are its doing, and the gang resumes whole rather than fail (or succeed) partly run.
            rank = next((r for r, h in enumerate(g.replicas) if self._disrupted(g, h)), None)
            if rank is not None:
                g.broken = (rank, "disrupted")
                trigger = True
        for rank, (st, end) in enumerate(states):
            if st == "ended" and end is not None and rank not in g.ends:
                g.ends[rank] = end
                g.order.append(rank)
            if g.stopping or g.failure is not None or g.broken is not None:
                continue
            if st == "ended" and end is not None and end.exit_code != 0 and end.on_its_own:
                g.failure = (rank, end.exit_code)
                trigger = True
            elif st in ("refused", "gone", "unstartable"):
                g.broken = (rank, st)
                trigger = True
        if trigger:
            g.stopping = True
            grace = 0 if g.broken is not None and g.broken[1] == "refused" else self.px.settings_grace()
            why = f"replica {g.failure[0]} exited with code {g.failure[1]}" if g.failure else \
                f"replica {g.broken[0]}'s pod was {_BROKEN[g.broken[1]]}"  # type: ignore[index]
            log.info("job %s attempt %d: %s; stopping the other replicas", g.job_id, g.attempt, why)
            for h, (st, _end) in zip(g.replicas, states, strict=True):
                if st in ("starting", "running"):
                    with self.px._lock:
                        a = self.px._attempts.get(h.name)
                    if a is not None:
                        self.px.calls.submit(self._delete_after_start, a, grace)
        return any(st in ("starting", "running") for st, _ in states)

    def _disrupted(self, g: GangHandle, h: PodHandle) -> bool:
        """Whether the replica's pod shows a disruption (deleted, evicted) that its container's own end did not
        come before; gpupool's own deletions come after ``g.stopping`` is set, so they are not looked for, and a
        refused start deletes the pods it made (no replica started: that is "refused", not this).

        After a restart every end is seen at once: a replica's own failure that finished no later than the
        second the disruption began came first (gpupool then deleted the others: its own stop, unrecorded),
        and decides the gang's outcome as it would have.
        """
        with self.px._lock:
            a = self.px._attempts.get(h.name)
            if a is None or not a.disrupted or (a.end is not None and a.end.on_its_own):
                return False
            if a.start is not None and not (a.start.done() and start_error(a) is None):
                return False
            since = a.disrupted_since
            if since is None:
                return True
            for other in g.replicas:
                o = self.px._attempts.get(other.name)
                e = o.end if o is not None else None
                if (e is not None and e.on_its_own and e.exit_code != 0 and e.finished_at is not None
                        and e.finished_at.replace(microsecond=0) <= since.replace(microsecond=0)):
                    return False
            return True

    def _delete_after_start(self, a: Any, grace: int) -> None:
        if a.start is not None:
            try:
                a.start.result()  # a delete before the create lands would be undone by the create
            except Exception:
                return
        self._delete_pod(a.handle.name, a.uid, grace)

    def _delete_pod(self, name: str, uid: str | None, grace: int) -> None:
        """Delete this pod object only (uid precondition): a refused gang is tried again under the same names,
        and a late delete of the earlier try must never take the next try's pod."""
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": grace}
        if uid:
            body["preconditions"] = {"uid": uid}
        try:
            self.px.calls.retrying("stop", lambda: self.px.api.delete_namespaced_pod(
                name, self.px.settings.namespace, grace_period_seconds=grace, body=ob.client_body(body)), 60.0)
        except ApiException as e:
            if e.status not in (404, 409):  # gone already, or a newer pod of that name (not ours to delete)
                log.warning("could not delete pod %s: %s", name, describe(e))
        except Exception as e:
            log.warning("could not delete pod %s: %s", name, describe(e))

    def exit_code(self, g: GangHandle) -> int | None:
        """The first failure's status; else, once every replica ended, the first non-zero one or 0."""
        if g.failure is not None:
            return g.failure[1]
        if len(g.ends) < len(g.replicas):
            return None
        return next((g.ends[r].exit_code for r in g.order if g.ends[r].exit_code != 0), 0)

    def ended_on_its_own(self, g: GangHandle) -> bool:
        if g.failure is not None:
            return True
        return len(g.ends) == len(g.replicas) and all(e.on_its_own for e in g.ends.values())

    def interrupted(self, g: GangHandle) -> Interrupted | None:
        if g.failure is not None:
            return None
        if g.broken is not None:
            rank, how = g.broken
            h = g.replicas[rank]
            if how == "refused":
                with self.px._lock:
                    a = self.px._attempts.get(h.name)
                    err = start_error(a) if a is not None else None
                    refused = a is not None and start_refused(a)
                if refused and err:  # the gang's pods are created together: the message names the refused one
                    return Interrupted("refused", err)
                if err and err.startswith("replica "):  # the gang's start says which replica it failed at
                    return Interrupted("not-started", f"{err}; requeued")
                return Interrupted("not-started", f"replica {rank}: {err or 'its start was refused'}; requeued")
            if how == "disrupted":
                with self.px._lock:
                    a = self.px._attempts.get(h.name)
                    what = a.disrupted if a is not None else "was deleted or evicted"
                return Interrupted("disrupted", f"replica {rank}'s pod {h.name} {what}; the whole gang is "
                                                "requeued to resume")
            if how == "unstartable":
                with self.px._lock:
                    a = self.px._attempts.get(h.name)
                    stuck = self.px.unstartable(a) if a is not None else None
                return Interrupted("unstartable", f"replica {rank}: {stuck or 'its pod could not start'}")
            return Interrupted("lost", f"replica {rank}'s pod {h.name} vanished without an exit status "
                                       f"(node {h.node} lost, or the pod was deleted); requeued")
        if len(g.ends) < len(g.replicas):
            return Interrupted("lost", f"the pods of {g.name} vanished without an exit status; requeued")
        return None

    # ------------------------------------------------------------ stop and after
    async def stop(self, g: GangHandle, grace_s: float) -> bool:
        """Every replica's pod deleted with the grace, at once; True if all ended within it."""
        g.stopping = True
        done = await asyncio.gather(*(self.px.stop(h, grace_s) for h in g.replicas))
        return all(done)

    def release(self, g: GangHandle) -> None:
        """Archive every replica's log (its own file, and the job's with ``[K] ``), delete its pods."""
        with self._lock:
            self._gangs.pop((g.job_id, g.attempt), None)
        started: dict[int, str | None] = {}  # rank -> its pod's uid
        for rank, h in enumerate(g.replicas):
            with self.px._lock:
                a = self.px._attempts.get(h.name)
                if a is None or a.handle is not h:
                    continue  # not ours (any more)
                del self.px._attempts[h.name]
                if start_error(a) is None:
                    started[rank] = a.uid
        self.px.calls.submit(self._archive, g, started)

    def _archive(self, g: GangHandle, started: dict[int, str | None]) -> None:
        ns = self.px.settings.namespace
        for rank, h in enumerate(g.replicas):
            if rank not in started:
                continue
            try:
                text = self.px.api.read_namespaced_pod_log(h.name, ns, container="job")
            except Exception as e:
                text = f"(the log of pod {h.name} could not be read: {describe(e)})\n"
            if text and not text.endswith("\n"):
                text += "\n"
            header = f"--- gpupool: attempt {g.attempt} of {g.job_id} (pod {h.name}) ---\n"
            own = self.px.replica_log_path(g.job_id, rank)
            own.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
            with open(own, "a") as f:
                f.write(header + text)
            with open(self.px.log_path(g.job_id), "a") as f:
                f.write(header + "".join(f"[{rank}] {line}\n" for line in text.splitlines()))
            self._delete_pod(h.name, started[rank], 0)
        self._drop_service(g.job_id)  # kept if the job already runs again (a resume)

    # ------------------------------------------------------------ recovery
    def recover(self, job_id: str, attempt: int) -> Recovered | None:
        """The attempt's replica pods after a restart (the watch has listed), or None if it is no gang."""
        px = self.px
        with px._lock:
            pods = [p for p in px._pods.values()
                    if ob.labels(p).get(JOB_LABEL) == label_value(job_id)
                    and ob.labels(p).get(ATTEMPT_LABEL) == str(attempt)
                    and REPLICA_LABEL in ob.labels(p)]
        if not pods:
            return None
        try:
            n = int(ob.annotations_of(pods[0]).get(REPLICAS_ANNOTATION, ""))
        except ValueError:
            n = 1 + max(int(ob.labels(p)[REPLICA_LABEL]) for p in pods)

        g = GangHandle(job_id, attempt, pod_name(job_id, attempt), "", [])
        with px._lock:
            for rank in range(n):
                name = replica_pod_name(job_id, attempt, rank)
                h = PodHandle(job_id, attempt, name)
                a = PodAttempt(h, adopted=True)
                pod = px._pods.get(name)
                if pod is not None and ob.node_name(pod):
                    a.uid = ob.uid(pod)
                    h.node = ob.node_name(pod)
                    px._observe(a, pod)
                else:
                    a.gone = True  # deleted while we were away, or never bound: nothing of it runs
                    px._changed()
                    if pod is not None:
                        px.calls.submit(px._delete_quietly, name, 0)
                px._attempts[name] = a
                g.replicas.append(h)
            g.node = g.replicas[0].node
        with self._lock:
            self._gangs[(job_id, attempt)] = g
        if self.alive(g) or (g.broken is not None and g.broken[1] == "disrupted"):
            return Recovered("running", g)  # (disrupted: the core settles it, knowing whether it asked for it)
        code = self.exit_code(g)
        self.release_after_recovery(g)
        return Recovered("gone", exit_code=code)

    def release_after_recovery(self, g: GangHandle) -> None:
        """A gang found ended: its result stays answerable (exit code, ended on its own) while its logs are kept."""
        self.release(g)
        with self._lock:
            self._finished[(g.job_id, g.attempt)] = g

    def sweep_services(self, live: set[tuple[str, int]]) -> None:
        """After recovery: delete our Services whose job has no running attempt (left by a crash)."""
        ns = self.px.settings.namespace
        try:
            services = raw_json(self.px.api.list_namespaced_service(ns, label_selector=MANAGED_SELECTOR,
                                                                    _preload_content=False)).get("items") or []
        except Exception as e:
            log.warning("could not list our Services: %s", describe(e))
            return
        running = {label_value(j) for j, _ in live}
        with self._lock:
            running |= {label_value(j) for j, _ in self._gangs}
        for s in services:
            job, name = ob.labels(s).get(JOB_LABEL), ob.name(s)
            if job and job not in running:
                log.info("deleting Service %s: no running attempt of job %s", name, job)
                with self._svc_lock:
                    try:
                        _raw(self.px.api.delete_namespaced_service(name, ns, _preload_content=False))
                    except Exception as e:
                        log.warning("could not delete Service %s: %s", name, describe(e))
