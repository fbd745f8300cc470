"""The core's public methods, the ones the HTTP API calls: reads, projects, jobs, tokens.

:class:`JobsApi` is one of the core's parts (gpupool.service.core builds
them, and :class:`gpupool.service.core.SchedulerCore` hands its methods to
the API). Authorization lives here, not in the HTTP layer, so every caller gets it:
owners and admins act on a job, admins change projects and tokens, and only a
project's members (or an admin) submit into it. Methods take and return plain
dicts in the wire shapes of docs/design.md and raise :mod:`gpupool.wire.errors`.
"""

from __future__ import annotations

import time
from typing import Any

from gpupool.backends.base import Executor, ForeignWork, kernel_pods_of
from gpupool.policy.model import MILLI
from gpupool.service.actor import Actor
from gpupool.service.attempts import Attempts
from gpupool.service.book import JobBook, Lifecycle
from gpupool.service.build_quota import build_holders, check_build_quota
from gpupool.service.config import ServiceConfig
from gpupool.service.cycle import CycleRunner
from gpupool.service.idle import IdleWatch, merge_settings, settings_wire
from gpupool.service.jobs import held_milli, job_to_wire, project_to_wire
from gpupool.service.membership import is_member, unix_groups
from gpupool.service.metrics import Metrics
from gpupool.service.placement_config import with_settings
from gpupool.service.pool_state import PoolState
from gpupool.service.recent_use import RecentUse
from gpupool.service.standing import Standing
from gpupool.service.store import JobRecord, ProjectRecord
from gpupool.service.tokens import TokenStore
from gpupool.service.validation import validate_project, validate_spec, validate_user
from gpupool.service.views import job_filters, pool_view, read_log_chunk
from gpupool.wire.errors import Conflict, Forbidden, InvalidRequest, NotFound, Unavailable
from gpupool.wire.schemas import KERNEL_POD_LABEL

WHO_IS_ADMIN = ("an admin is whoever holds the scheduler's admin token (gpupool serve says where it is, by default "
                "<state dir>/admin_token) or, on a JupyterHub, a Hub admin; ask one, or see docs/cli.md "
                "(Administration)")
"""How to become an admin, said with every admin-only refusal: "only an admin may" alone leaves a user stuck."""


def _admin_only(actor: Actor, what: str) -> Forbidden:
    """The refusal of an admin-only action, naming the caller and how admins are made."""
    return Forbidden(f"only an admin may {what}, and {actor.user} is not one: {WHO_IS_ADMIN}")


class JobsApi:
    """What callers of the core may ask: reads, projects, jobs and tokens, each checked for who asks.

    ``foreign``: the backend's :class:`gpupool.backends.base.ForeignWork`
    when it has that capability (a job standing for a kubectl pod cannot be
    paused, and cancelling it before it runs removes the pod), else None.
    """

    def __init__(self, config: ServiceConfig, book: JobBook, pool: PoolState, attempts: Attempts,
                 cycles: CycleRunner, standing: Standing, tokens: TokenStore, metrics: Metrics, life: Lifecycle,
                 executor: Executor[Any], foreign: ForeignWork | None = None) -> None:
        self.config = config
        self.book = book
        self.pool = pool
        self.attempts = attempts
        self.cycles = cycles
        self.standing = standing
        self.tokens = tokens
        self.metrics = metrics
        self.life = life
        self.executor = executor
        self.foreign = foreign
        self.idle: IdleWatch | None = None
        """Which running jobs are idle by use (the core sets it); None: every job's idle_since is null."""
        self.recent: RecentUse | None = None
        """Each running job's use over the last minute (the core sets it); None: jobs show none."""

    def check_open(self) -> None:
        if self.life.closing:
            raise Unavailable("the scheduler is shutting down")

    # ================================================================ reads
    def _job_or_404(self, job_id: Any) -> JobRecord:
        if not isinstance(job_id, str):
            raise NotFound(f"no job {job_id!r}")
        rec = self.book.job(job_id)
        if rec is None:
            raise NotFound(f"no job {job_id!r}")
        return rec

    def _owned(self, actor: Actor, job_id: str, action: str) -> JobRecord:
        rec = self._job_or_404(job_id)
        if not (actor.admin or actor.user == rec.user):
            raise Forbidden(f"only {rec.user} (the owner) or an admin may {action} job {rec.id}")
        return rec

    def _wire(self, actor: Actor, rec: JobRecord) -> dict[str, Any]:
        out = job_to_wire(rec, show_env=actor.admin or actor.user == rec.user)
        out["recent_use"] = self.recent.of(rec) if self.recent is not None else None
        out.update(self.idle.job_fields(rec) if self.idle is not None else {"idle_since": None, "idle_action": None})
        return out

    def get_job(self, actor: Actor, job_id: str) -> dict[str, Any]:
        rec = self._job_or_404(job_id)
        out = self._wire(actor, rec)
        pods = kernel_pods_of(self.pool.backend) if rec.kind == "build" and rec.state == "running" else None
        if pods is not None and (actor.admin or actor.user == rec.user) and (pod := pods.describe(rec.id)):
            out["kernel_pod"] = pod  # where its kernel listens: the owner's Jupyter server connects there
        return out

    def list_jobs(self, actor: Actor, filters: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """Jobs newest first; filters: project, user, state ("a,b" or a list), kind, limit."""
        q = job_filters(filters, self.config.max_list)
        recs = self.book.store.jobs(q["states"], project=q["project"], user=q["user"], kind=q["kind"],
                                limit=q["limit"], newest_first=True)
        return [self._wire(actor, r) for r in recs]

    def read_log(self, actor: Actor, job_id: str, offset: int = 0, limit: int | None = None,
                 replica: int | None = None) -> dict[str, Any]:
        """A chunk of the job's log from byte ``offset``; ``eof`` once the job is final and all is read.

        ``replica``: a multi-node gang's replica K alone (0 <= K < replicas);
        without it a gang's log is every replica's lines, each prefixed
        ``[K] ``. A one-replica job's only replica, 0, is its whole log.
        """
        rec = self._owned(actor, job_id, "read the log of")
        path = self.executor.log_path(rec.id)
        if replica is not None:
            n = max(1, rec.replicas)
            if isinstance(replica, bool) or not isinstance(replica, int) or not 0 <= replica < n:
                raise InvalidRequest(f"replica must be a whole number from 0 to {n - 1}: job {rec.id} has "
                                     f"{n} replica{'s' if n > 1 else ''}, not {str(replica)[:40]!r}")
            if n > 1:
                path = self.executor.replica_log_path(rec.id, replica)
        data, nxt, size = read_log_chunk(path, offset, limit)
        # A build job has no process, so no log will ever come: eof at once. A final job's log is at its
        # end once the executor has copied in its last output (a pod's comes after the pod ended).
        eof = nxt >= size and (rec.kind == "build" or (not rec.live and self.executor.log_settled(rec.id)))
        return {"data": data, "offset": nxt, "eof": eof}

    def _project_usage(self) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]]:
        """Per project: milli-GPU held by kind, and its waiting jobs counted by state (queued, paused).

        Paused jobs are counted apart from queued ones, as ``status`` counts them: a paused job waits for
        its owner (or for room after a reclaim), not in the queue's order.
        """
        usage: dict[str, dict[str, int]] = {}
        waiting: dict[str, dict[str, int]] = {}
        for rec in self.book.live_jobs():
            if rec.state == "running":
                u = usage.setdefault(rec.project, {})
                u[rec.kind] = u.get(rec.kind, 0) + held_milli(rec)
            else:
                w = waiting.setdefault(rec.project, {})
                w[rec.state] = w.get(rec.state, 0) + 1
        return usage, waiting

    def list_projects(self, actor: Actor | None = None) -> list[dict[str, Any]]:
        """Every project with its usage; with ``actor``, ``member`` says whether they may submit into it."""
        usage, waiting = self._project_usage()
        recent = self.standing.recent_gpu_hours()
        standing = self.standing.fair_share_standing()
        out = []
        for p in self.book.projects().values():
            u = dict(usage.get(p.name, {}))
            u["train_over_quota"] = max(0, u.get("train", 0) - p.train_guarantee_milli)
            mine_waiting = waiting.get(p.name, {})
            wire = project_to_wire(p, u, mine_waiting.get("queued", 0), mine_waiting.get("paused", 0))
            mine = recent.get(p.name, {})
            wire["recent_gpu_hours"] = {k: round(mine.get(k, 0.0), 6) for k in ("build", "train")}
            wire["fair_share"] = standing[p.name]
            wire["idle"] = settings_wire(p.idle)
            if actor is not None:
                wire["member"] = self._may_use(actor, p)
            out.append(wire)
        return out

    @staticmethod
    def _may_use(actor: Actor, project: ProjectRecord) -> bool:
        return actor.admin or is_member(project.members, actor.user, actor.groups)

    def pool_view(self) -> dict[str, Any]:
        """The Pool, with other schedulers' work as allocations ("(other scheduler)", user ``ns/name``)."""
        if not self.pool.simulated and time.time() - self.pool.sample_t > 2:
            self.pool.refresh_sample()
        view = pool_view(self.pool.nodes, self.pool.gpus, self.book.live_jobs(("running",)), self.pool.sample,
                         self.pool.limits().memory, self.pool.simulated)  # read once, not /proc/meminfo per call
        holdings = self.pool.outside_holdings()
        if not holdings:
            return view
        by_gpu: dict[str, list[str]] = {}
        for holder, gpu_ids in holdings:
            for gid in gpu_ids:
                by_gpu.setdefault(gid, []).append(holder)
        for node in view["nodes"]:
            for g in node["gpus"]:
                for text in by_gpu.get(g["id"], []):
                    g["allocations"].append({"job_id": "-", "project": "(other scheduler)", "user": text,
                                             "kind": "other", "fraction": 1, "pod": text})
                    g["allocated"] = round(g["allocated"] + 1, 3)
        return view

    def status(self, actor: Actor | None = None) -> dict[str, Any]:
        counts = {"pending": 0, "running": 0, "paused": 0}
        for rec in self.book.live_jobs():
            counts["pending" if rec.state == "queued" else rec.state] += 1
        return {"simulated": self.pool.simulated, "pool": self.pool_view(), "projects": self.list_projects(actor),
                "queue": counts, "usage_half_life_s": self.config.usage_half_life_s,
                "idle_running": self.idle.flagged() if self.idle is not None else 0,
                "backend": self.pool.health(), "kernel_pods": kernel_pods_of(self.pool.backend) is not None}

    def history(self, since: float | None = None) -> dict[str, Any]:
        if since is not None and (isinstance(since, bool) or not isinstance(since, (int, float))):
            raise InvalidRequest("since must be a time in Unix seconds")
        return {"samples": self.book.store.history_since(None if since is None else float(since))}

    # ================================================================ projects
    def set_project(self, actor: Actor, name: str, fields: dict[str, Any]) -> dict[str, Any]:
        """Create or change a project (admin only); quotas in GPUs."""
        self.check_open()
        if not actor.admin:
            raise _admin_only(actor, "change projects")
        changes = validate_project(name, fields, None if self.pool.limits().elastic else len(self.pool.gpus))
        cur = self.book.store.project(name) or ProjectRecord(name=name, created_at=time.time())
        for k, v in changes.items():
            setattr(cur, k, v)
        if isinstance(fields, dict) and "idle" in fields:
            cur.idle = merge_settings(cur.idle, fields["idle"])
        self.book.projects_changed()
        self.book.store.upsert_project(cur)
        self.book.emit("project", project=name, reason=f"project {name} set by {actor.user}")
        self.cycles.run()
        return next(p for p in self.list_projects() if p["name"] == name)

    def delete_project(self, actor: Actor, name: str) -> None:
        self.check_open()
        if not actor.admin:
            raise _admin_only(actor, "delete projects")
        if not isinstance(name, str) or self.book.store.project(name) is None:
            raise NotFound(f"no project {name!r}")
        live = self.book.store.count_live_jobs(name)
        if live:
            raise Conflict(f"project {name!r} still has {live} live job{'' if live == 1 else 's'} (queued, running "
                           f"or paused); cancel them first")
        self.book.projects_changed()
        self.book.store.delete_project(name)
        self.book.emit("project", project=name, reason=f"project {name} deleted by {actor.user}")

    # ================================================================ jobs
    def _estimate_milli(self, request: dict[str, Any]) -> int:
        if request.get("gpus"):
            return int(request["gpus"]) * MILLI
        if request.get("gpu_fraction"):
            return int(round(request["gpu_fraction"] * MILLI))
        if request.get("gpu_memory"):
            mems = [g.memory for g in self.pool.gpus.values() if not request.get("gpu_model") or g.model == request["gpu_model"]]
            biggest = max(mems, default=1)
            return min(MILLI, -(-int(request["gpu_memory"]) * MILLI // biggest))
        return 0

    def _check_build_quota(self, project: ProjectRecord, request: dict[str, Any]) -> None:
        holders = build_holders(self.book.live_jobs(("queued", "running"), kind="build", project=project.name),
                                held_milli, self._estimate_milli)
        check_build_quota(project, self._estimate_milli(request), holders)

    async def submit(self, actor: Actor, spec: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Validate, store as queued, decide; ``(job, created)`` (created False for a client_key match).

        A build job is decided in the call (the reply says running, or why it waits);
        a train job is returned queued and decided by the cycle that runs next.
        """
        self.check_open()
        projects = self.book.projects()
        names = set(projects)
        js = validate_spec(spec, names, self.pool.limits())
        kernel_pod = self._kernel_pod_request(spec, js)
        if js.image is not None and self.config.backend != "kubernetes":
            raise InvalidRequest("image needs the kubernetes backend (gpupool serve --backend kubernetes); "
                                 "this scheduler runs jobs as local processes")
        if js.client_key is not None:
            existing = self.book.store.live_job_by_key(actor.user, js.client_key)
            if existing is not None:
                return self._wire(actor, existing), False
        project = projects[js.project]
        if not self._may_use(actor, project):
            raise Forbidden(f"{actor.user} is not a member of project {project.name!r}; "
                            "an admin can add you (gpupool projects set NAME --members ...)")
        js.placement = with_settings(js.placement, self.config.kube_pool_placement,  # the admin's rules too
                                     self.config.kube_project_placement, js.kind, js.project)
        request = js.request()
        if js.kind == "build":
            self._check_build_quota(project, request)
        else:
            # refused now, not at start: the account it would run as, the folder it would run in
            js.workdir = self.pool.backend.admit(actor.user, js.workdir, js.submit_dir)
        now = time.time()
        job_id = self.book.insert_new_job(lambda job_id, num: JobRecord(
            id=job_id, num=num, name=js.name, project=js.project, user=actor.user, kind=js.kind, state="queued",
            request=request, priority=js.priority, submitted_at=now, reason="queued",
            workdir=js.workdir or (str(self.executor.default_workdir(job_id)) if js.kind == "train" else ""),
            command=js.command, job_env=js.env, labels=js.labels, client_key=js.client_key, image=js.image,
            replicas=js.replicas,
            lease_expires_at=now + self.config.lease_s if js.kind == "build" else None,
        )).id
        if kernel_pod is not None:  # (before any await: the cycle that grants it launches the pod)
            kernel_pods_of(self.pool.backend).expect(job_id, actor.user, kernel_pod)  # type: ignore[union-attr]
        self.metrics.submitted.labels(js.kind).inc()
        # A kernel waits on its build share: decide now. A train submit returns at once
        # (queued) and the next loop iteration's cycle decides every train job submitted
        # meanwhile, so a burst runs the policy once, not once per job.
        self.cycles.request(urgent=js.kind == "build")
        if js.kind == "build":
            await self.attempts.await_grant(job_id)
        fresh = self.book.job(job_id)
        assert fresh is not None
        return self._wire(actor, fresh), True

    def _kernel_pod_request(self, spec: dict[str, Any], js: Any) -> dict[str, Any] | None:
        """The spec's ``kernel_pod`` once checked (None when it has none); marks the share with KERNEL_POD_LABEL.

        Only a build share may have one, and only on a backend that runs kernels in pods; the label is the
        service's alone (a spec's own is dropped), so it says truly after a restart which shares have a pod.
        """
        js.labels.pop(KERNEL_POD_LABEL, None)
        request = spec.get("kernel_pod")
        if request is None:
            return None
        if js.kind != "build":
            raise InvalidRequest("kernel_pod is for build jobs (a kernel's GPU share) only")
        pods = kernel_pods_of(self.pool.backend)
        if pods is None:
            raise InvalidRequest("kernel_pod needs the kubernetes backend (gpupool serve --backend kubernetes); "
                                 "this scheduler runs kernels where the Jupyter server runs")
        pods.check(request)
        js.labels[KERNEL_POD_LABEL] = "true"
        return dict(request)

    async def pause(self, actor: Actor, job_id: str) -> dict[str, Any]:
        """Pause (sticky: not resumed until the user resumes): SIGTERM, grace, SIGKILL; keeps the workdir.

        A live job standing for foreign work (a kubectl pod) cannot be paused:
        gpupool could not recreate the pod after it (409).
        """
        rec = self._owned(actor, job_id, "pause")
        if self.foreign is not None and rec.live and self.foreign.stands_for(rec) is not None:
            raise Conflict(self.foreign.pause_refusal(rec))
        self.check_open()
        if not rec.live:
            raise Conflict(f"job {rec.id} is {rec.state}; only live jobs can be paused")
        if rec.kind == "build":
            raise Conflict(f"job {rec.id} is a build share; cancel it to release the GPU")
        reason = f"paused by {actor.user}"
        if rec.state in ("queued", "paused"):
            self.book.transition(rec.id, state="paused", user_paused=True, reason=reason,
                             paused_at=rec.paused_at or time.time())
        elif rec.stop_intent in ("preempt", "shutdown"):
            self.book.update(rec.id, stop_intent="pause", reason=reason)
        elif rec.stop_intent is None:
            self.metrics.pauses.labels("user").inc()
            self.attempts.begin_stop(rec, "pause", reason)
        await self.attempts.await_settled(rec.id)
        return self.get_job(actor, rec.id)

    async def resume(self, actor: Actor, job_id: str) -> dict[str, Any]:
        """Put a paused job back in the queue (it restarts in its workdir with GPUPOOL_RESUME=1).

        A job that is not paused (nor being paused) is a 409 that says what it is doing: answering with
        the job as if resumed told a user who resumed a running job nothing, and did nothing.
        """
        self.check_open()
        rec = self._owned(actor, job_id, "resume")
        if not rec.live:
            raise Conflict(f"job {rec.id} is {rec.state}; only paused jobs can be resumed")
        if rec.state == "running" and rec.stop_intent != "pause":
            raise Conflict(f"job {rec.id} is already running; only paused jobs can be resumed")
        if rec.state == "queued":
            raise Conflict(f"job {rec.id} is already queued (it runs when GPUs free up); only paused jobs can "
                           "be resumed")
        if rec.state == "paused":
            self.book.transition(rec.id, user_paused=False, reason=f"resumed by {actor.user}; waiting for GPUs")
            self.cycles.run()
        elif rec.state == "running" and rec.stop_intent == "pause":
            self.book.update(rec.id, stop_intent="preempt")  # still stopping; requeued, not sticky
        return self.get_job(actor, rec.id)

    async def cancel(self, actor: Actor, job_id: str) -> dict[str, Any]:
        """Stop for good; a build job releases its share at once.

        Foreign work's job that was not running (or a build share) also removes that work (deletes its pod).
        """
        rec = self._owned(actor, job_id, "cancel")
        before, kind = rec.state, rec.kind
        self.check_open()
        if not rec.live:
            raise Conflict(f"job {rec.id} is already {rec.state}")
        reason = f"cancelled by {actor.user}"
        idle_since = self.idle.job_fields(rec)["idle_since"] if self.idle is not None else None
        if idle_since:  # e.g. a kernel its Jupyter server culled: every view says why the share came back
            reason += f" while idle since {idle_since}"
        if rec.state != "running" or rec.kind == "build":
            self.attempts.finish(rec, "cancelled", reason)
            self.cycles.request()  # what it frees is handed out by the next cycle (mass cancels share it)
        elif rec.stop_intent is None:
            self.attempts.begin_stop(rec, "cancel", reason)
        else:
            self.book.update(rec.id, stop_intent="cancel", reason=reason)
        await self.attempts.await_settled(rec.id)
        out = self.get_job(actor, rec.id)
        if self.foreign is not None and (before in ("queued", "paused") or kind == "build"):
            self.foreign.cancelled(rec, actor.user, self.config.pause_grace_s)
        return out

    def renew(self, actor: Actor, job_id: str) -> dict[str, Any]:
        """Extend a build job's lease by ``lease_s`` from now."""
        self.check_open()
        rec = self._owned(actor, job_id, "renew")
        if rec.kind != "build":
            raise Conflict(f"job {rec.id} is a train job; only build jobs hold leases")
        if not rec.live:
            raise Conflict(f"job {rec.id} is {rec.state}; its lease cannot be renewed")
        self.book.update(rec.id, lease_expires_at=time.time() + self.config.lease_s)
        return self.get_job(actor, rec.id)

    # ================================================================ tokens
    def create_token(self, actor: Actor, user: str) -> dict[str, Any]:
        if not actor.admin:
            raise _admin_only(actor, "create tokens")
        user = validate_user(user)
        if user == self.config.admin_user:
            # Ownership is by user name: a plain token named like the admin would own the admin's jobs.
            raise InvalidRequest(f"{user!r} is the admin's name; choose another user name")
        return {"user": user, "token": self.tokens.create(user)}

    def authenticate(self, token: str | None) -> Actor | None:
        found = self.tokens.lookup(token)
        if found is None:
            return None
        return Actor(found[0], found[1], unix_groups(found[0]))
