"""A small in-memory stand-in for SchedulerCore, for API-layer tests only.

It follows the documented surface (docs/design.md, gpupool/service/core.py)
closely enough to test what the HTTP layer owns: authentication, JSON and
error mapping, the event stream and the client. Scheduling behaviour is tested
against the real core in the integration tests.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import prometheus_client

from gpupool.service.core import Actor
from gpupool.wire.errors import Conflict, Forbidden, InvalidRequest, NotFound, QuotaExceeded
from gpupool.wire.schemas import validate

ADMIN_TOKEN = "admin-token"
TOKENS = {ADMIN_TOKEN: Actor("admin", True), "alice-token": Actor("alice"), "bob-token": Actor("bob")}


class FakeCore:
    simulated = True

    def __init__(self) -> None:
        self.registry = prometheus_client.CollectorRegistry()
        self.submitted = prometheus_client.Counter("gpupool_fake_submitted", "jobs", registry=self.registry)
        self.tokens = dict(TOKENS)
        self.projects: dict[str, dict[str, Any]] = {"vision": self._project("vision")}
        self.jobs: dict[str, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self._cond: asyncio.Condition | None = None

    @staticmethod
    def _project(name: str, **fields: Any) -> dict[str, Any]:
        base = {"name": name, "build_quota": 1.0, "train_guarantee": 1.0, "train_limit": None, "weight": 1.0,
                "usage": {"build": 0, "train": 0, "train_over_quota": 0}, "pending": 0}
        base.update(fields)
        return base

    # ---------------------------------------------------------------- auth
    def authenticate(self, token: str) -> Actor | None:
        return self.tokens.get(token)

    def create_token(self, actor: Actor, user: str) -> dict[str, Any]:
        if not actor.admin:
            raise Forbidden("only the admin may create tokens")
        token = f"{user}-token-{len(self.tokens)}"
        self.tokens[token] = Actor(user)
        return {"user": user, "token": token}

    # ---------------------------------------------------------------- reads
    def pool(self) -> dict[str, Any]:
        gpus = [{"id": f"GPU-sim-{i}", "index": i, "model": "A100-80GB", "memory": 80 * 2**30,
                 "topology_group": "nvlink0", "allocated": 0.0, "allocations": []} for i in range(2)]
        return {"simulated": True, "nodes": [{"name": "local", "pools": ["build", "train"], "cpu": 8,
                                              "memory": 2**36, "gpus": gpus}]}

    def status(self, actor: Actor | None = None) -> dict[str, Any]:
        return {"simulated": True, "pool": self.pool(), "projects": self.list_projects(),
                "queue": {"pending": 0, "running": 0, "paused": 0}}

    def list_projects(self, actor: Actor | None = None) -> list[dict[str, Any]]:
        return list(self.projects.values())

    def history(self, since: float | None) -> dict[str, Any]:
        return {"samples": []}

    def report(self, actor: Actor, since: float | None = None, by: str | None = None) -> dict[str, Any]:
        from gpupool.service.report import check_query

        now = time.time()
        start, by = check_query(since, by, now)
        return {"since": start, "until": now, "by": by, "rows": []}

    def report_series(self, actor: Actor, since: float | None = None, step: float | None = None,
                      by: str | None = None) -> dict[str, Any]:
        now = time.time()
        return {"since": now - 3600 if since is None else since, "until": now, "step": 10, "by": by or "project",
                "series": []}

    # ---------------------------------------------------------------- writes
    def set_project(self, actor: Actor, name: str, fields: dict[str, Any]) -> dict[str, Any]:
        if not actor.admin:
            raise Forbidden("only the admin may set project quotas")
        validate("ProjectFields", fields, "project")
        project = self.projects.setdefault(name, self._project(name))
        project.update(fields)
        return project

    def delete_project(self, actor: Actor, name: str) -> None:
        if not actor.admin:
            raise Forbidden("only the admin may delete projects")
        if name not in self.projects:
            raise NotFound(f"no project {name!r}")
        del self.projects[name]

    async def submit(self, actor: Actor, spec: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        validate("JobSpec", spec, "job spec")  # as the real core does first: the wire model's shape
        if spec["project"] not in self.projects:
            raise InvalidRequest(f"unknown project {spec['project']!r}")
        if spec.get("kind") == "build" and spec.get("gpu_fraction", 0) > 0.9:
            raise QuotaExceeded(f"project {spec['project']} is over its build quota")
        job_id = f"j-{len(self.jobs) + 1:06d}"
        job = {"id": job_id, "name": spec.get("name") or "job", "project": spec["project"], "user": actor.user,
               "kind": spec.get("kind", "train"), "state": "queued", "request": {}, "priority": 0,
               "submitted_at": time.time(), "reason": "waiting"}
        self.jobs[job_id] = job
        self.submitted.inc()
        await self._emit({"type": "job", "job_id": job_id, "state": "queued", "user": actor.user,
                          "project": spec["project"]})
        return job, True

    def list_jobs(self, actor: Actor, filters: dict[str, Any]) -> list[dict[str, Any]]:
        return [j for j in reversed(self.jobs.values())
                if all(j.get(k) == v for k, v in filters.items() if k in ("project", "user", "kind"))]

    def get_job(self, actor: Actor, job_id: str) -> dict[str, Any]:
        if job_id not in self.jobs:
            raise NotFound(f"no job {job_id!r}")
        return self.jobs[job_id]

    def _owned(self, actor: Actor, job_id: str) -> dict[str, Any]:
        job = self.get_job(actor, job_id)
        if not actor.admin and job["user"] != actor.user:
            raise Forbidden(f"job {job_id} belongs to {job['user']}")
        return job

    async def cancel(self, actor: Actor, job_id: str) -> dict[str, Any]:
        job = self._owned(actor, job_id)
        if job["state"] in ("succeeded", "failed", "cancelled", "rejected"):
            raise Conflict(f"job {job_id} is already {job['state']}")
        job["state"] = "cancelled"
        await self._emit({"type": "job", "job_id": job_id, "state": "cancelled"})
        return job

    async def pause(self, actor: Actor, job_id: str) -> dict[str, Any]:
        self._owned(actor, job_id)
        raise Conflict(f"job {job_id} is not running")

    async def resume(self, actor: Actor, job_id: str) -> dict[str, Any]:
        self._owned(actor, job_id)
        raise Conflict(f"job {job_id} is not paused")

    def renew(self, actor: Actor, job_id: str) -> dict[str, Any]:
        self._owned(actor, job_id)
        raise Conflict(f"job {job_id} is not a build job")

    def read_log(self, actor: Actor, job_id: str, offset: int, limit: int | None) -> dict[str, Any]:
        self._owned(actor, job_id)
        data = "hello\n"[offset:][: limit or None]
        return {"data": data, "offset": offset + len(data), "eof": True}

    # ---------------------------------------------------------------- events
    @property
    def last_event_seq(self) -> int:
        return self.events[-1]["seq"] if self.events else 0

    async def _emit(self, event: dict[str, Any]) -> None:
        event = {"seq": self.last_event_seq + 1, "t": time.time(), **event}
        self.events.append(event)
        if self._cond is None:
            self._cond = asyncio.Condition()
        async with self._cond:
            self._cond.notify_all()

    def events_since(self, seq: int) -> list[dict[str, Any]]:
        return [e for e in self.events if e["seq"] > seq]

    async def wait_events(self, seq: int, timeout: float) -> list[dict[str, Any]]:
        if self._cond is None:
            self._cond = asyncio.Condition()
        try:
            async with self._cond:
                await asyncio.wait_for(self._cond.wait_for(lambda: self.last_event_seq > seq), timeout)
        except asyncio.TimeoutError:
            return []
        return self.events_since(seq)
