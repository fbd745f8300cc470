"""A small in-memory stand-in for AsyncGpupoolClient, for handler and widget tests.

It follows the wire contract of docs/design.md closely enough for the parts the
extension uses (build shares with a quota, owner checks on actions, events),
so handler tests run without a scheduler process. Tests of kernels and
promote use the real embedded scheduler instead.
"""

from __future__ import annotations

import itertools
import time
from typing import Any

from gpupool.wire.errors import Forbidden, NotFound, QuotaExceeded, Unavailable

MILLI = 1000


class FakeScheduler:
    """Pool of ``gpus`` simulated GPUs, one project per user with a build quota."""

    def __init__(self, gpus: int = 4, build_quota: float = 1.0) -> None:
        self.gpus = [{"id": f"GPU-fake-{i}", "index": i, "model": "A100-80GB", "memory": 80 * 2**30}
                     for i in range(gpus)]
        self.projects: dict[str, dict[str, Any]] = {}
        self.default_quota = build_quota
        self.jobs: dict[str, dict[str, Any]] = {}
        self.events: list[dict[str, Any]] = []
        self.ids = itertools.count(1)
        self.down = False

    def client(self, user: str, admin: bool = False) -> FakeClient:
        self.projects.setdefault(user, {"name": user, "build_quota": self.default_quota,
                                        "train_guarantee": float(len(self.gpus)), "train_limit": None, "weight": 1})
        return FakeClient(self, user, admin)

    def _event(self, job: dict[str, Any]) -> None:
        self.events.append({"seq": len(self.events) + 1, "t": time.time(), "type": "job", "job_id": job["id"],
                            "state": job["state"], "reason": job["reason"], "user": job["user"],
                            "project": job["project"]})

    def allocated(self) -> dict[str, int]:
        used = {g["id"]: 0 for g in self.gpus}
        for job in self.jobs.values():
            if job["state"] == "running":
                for g in job["assignment"]["gpus"]:
                    used[g["id"]] += g["milli"]
        return used

    def usage(self, project: str, kind: str) -> float:
        return sum(sum(g["milli"] for g in j["assignment"]["gpus"]) for j in self.jobs.values()
                   if j["project"] == project and j["kind"] == kind and j["state"] == "running") / MILLI


class FakeClient:
    """The client surface of gpupool.client.AsyncGpupoolClient, in memory."""

    def __init__(self, sched: FakeScheduler, user: str, admin: bool) -> None:
        self.s, self.user, self.admin = sched, user, admin
        self.url, self.token = "http://fake", f"token-{user}"

    def _up(self) -> None:
        if self.s.down:
            raise Unavailable(f"cannot reach the scheduler at {self.url}: connection refused")

    async def whoami(self) -> dict[str, Any]:
        self._up()
        return {"user": self.user, "admin": self.admin}

    async def pool(self) -> dict[str, Any]:
        self._up()
        used = self.s.allocated()
        gpus = []
        for g in self.s.gpus:
            allocs = [{"job_id": j["id"], "project": j["project"], "user": j["user"], "kind": j["kind"],
                       "fraction": x["milli"] / MILLI}
                      for j in self.s.jobs.values() if j["state"] == "running"
                      for x in j["assignment"]["gpus"] if x["id"] == g["id"]]
            gpus.append({**g, "topology_group": "", "allocated": used[g["id"]] / MILLI, "allocations": allocs})
        return {"simulated": True, "nodes": [{"name": "local", "pools": ["build", "train"], "cpu": 2,
                                              "memory": 2**34, "gpus": gpus}]}

    async def projects(self) -> list[dict[str, Any]]:
        self._up()
        out = []
        for p in self.s.projects.values():
            train = self.s.usage(p["name"], "train")
            out.append({**p, "usage": {"build": self.s.usage(p["name"], "build"), "train": train,
                                       "train_over_quota": max(train - p["train_guarantee"], 0)},
                        "pending": sum(1 for j in self.s.jobs.values()
                                       if j["project"] == p["name"] and j["state"] == "queued")})
        return out

    async def status(self) -> dict[str, Any]:
        jobs = self.s.jobs.values()
        return {"simulated": True, "pool": await self.pool(), "projects": await self.projects(),
                "queue": {"pending": sum(j["state"] == "queued" for j in jobs),
                          "running": sum(j["state"] == "running" for j in jobs),
                          "paused": sum(j["state"] == "paused" for j in jobs)}}

    async def set_project(self, name: str, **fields: Any) -> dict[str, Any]:
        self._up()
        if not self.admin:
            raise Forbidden("only the admin can change projects")
        project = self.s.projects.setdefault(name, {"name": name, "build_quota": 0, "train_guarantee": 0,
                                                    "train_limit": None, "weight": 1})
        project.update(fields)
        return (await self.projects())[list(self.s.projects).index(name)]

    def _place(self, milli: int) -> list[dict[str, Any]] | None:
        used = self.s.allocated()
        if milli >= MILLI:
            free = [g for g in self.s.gpus if used[g["id"]] == 0][: milli // MILLI]
            if len(free) < milli // MILLI:
                return None
            return [{"id": g["id"], "index": g["index"], "model": g["model"], "milli": MILLI,
                     "memory_limit": g["memory"]} for g in free]
        for g in self.s.gpus:
            if used[g["id"]] + milli <= MILLI:
                return [{"id": g["id"], "index": g["index"], "model": g["model"], "milli": milli,
                         "memory_limit": g["memory"] * milli // MILLI}]
        return None

    async def submit(self, spec: dict[str, Any]) -> dict[str, Any]:
        self._up()
        key = spec.get("client_key")
        for job in self.s.jobs.values():
            if key and job["client_key"] == key and job["user"] == self.user and job["state"] in ("queued", "running"):
                return job
        milli = int(round(float(spec.get("gpu_fraction") or spec.get("gpus") or 0) * MILLI))
        kind = spec.get("kind", "train")
        project = self.s.projects[spec["project"]]
        if kind == "build" and self.s.usage(project["name"], "build") * MILLI + milli > project["build_quota"] * MILLI:
            raise QuotaExceeded(f"project {project['name']} is over its build quota of {project['build_quota']} GPU")
        job_id = f"j-{next(self.s.ids):06d}"
        placed = self._place(milli) if milli else []
        job = {"id": job_id, "name": spec.get("name", job_id), "project": project["name"], "user": self.user,
               "kind": kind, "state": "running" if placed is not None else "queued",
               "request": {"gpus": spec.get("gpus", 0), "gpu_fraction": spec.get("gpu_fraction")},
               "priority": spec.get("priority", 0), "submitted_at": time.time(), "started_at": None,
               "finished_at": None, "attempts": 1, "preemptible": False, "reason": "",
               "assignment": {"node": "local", "gpus": placed or []}, "exit_code": None,
               "workdir": spec.get("workdir"), "command": spec.get("command"), "labels": spec.get("labels", {}),
               "lease_expires_at": time.time() + 120 if kind == "build" else None, "client_key": key}
        if kind == "build" and placed:
            job["env"] = {"CUDA_VISIBLE_DEVICES": ",".join(g["id"] for g in placed), "GPUPOOL_JOB_ID": job_id,
                          "GPUPOOL_GPU_FRACTION": f"{milli / MILLI:g}", "GPUPOOL_SIMULATED": "1"}
        self.s.jobs[job_id] = job
        self.s._event(job)
        return job

    async def jobs(self, **filters: Any) -> list[dict[str, Any]]:
        self._up()
        states = set(filters["state"].split(",")) if filters.get("state") else None
        out = [j for j in self.s.jobs.values()
               if (not states or j["state"] in states)
               and all(j.get(k) == filters[k] for k in ("user", "project", "kind") if filters.get(k))]
        return list(reversed(out))

    async def job(self, job_id: str) -> dict[str, Any]:
        self._up()
        if job_id not in self.s.jobs:
            raise NotFound(f"no job {job_id}")
        return self.s.jobs[job_id]

    async def _own(self, job_id: str) -> dict[str, Any]:
        job = await self.job(job_id)
        if job["user"] != self.user and not self.admin:
            raise Forbidden(f"job {job_id} belongs to {job['user']}")
        return job

    async def _set(self, job_id: str, state: str) -> dict[str, Any]:
        job = await self._own(job_id)
        job["state"] = state
        self.s._event(job)
        return job

    async def pause(self, job_id: str) -> dict[str, Any]:
        return await self._set(job_id, "paused")

    async def resume(self, job_id: str) -> dict[str, Any]:
        return await self._set(job_id, "queued")

    async def cancel(self, job_id: str) -> dict[str, Any]:
        return await self._set(job_id, "cancelled")

    async def renew(self, job_id: str) -> dict[str, Any]:
        job = await self._own(job_id)
        job["lease_expires_at"] = time.time() + 120
        return job

    async def logs(self, job_id: str, offset: int = 0, limit: int | None = None) -> dict[str, Any]:
        await self._own(job_id)
        return {"data": "", "offset": offset, "eof": True}

    async def events(self, since: int = 0, timeout: float = 0) -> dict[str, Any]:
        self._up()
        new = [e for e in self.s.events if e["seq"] > since]
        return {"events": new, "last": self.s.events[-1]["seq"] if self.s.events else since}

    async def history(self, since: float | None = None) -> dict[str, Any]:
        self._up()
        return {"samples": []}

    async def create_token(self, user: str) -> dict[str, Any]:
        return {"user": user, "token": f"token-{user}"}
