"""Resource handlers of /api/v1: thin translations between HTTP and the core.

Each handler checks the shape of its input (so the core sees well-formed
values), calls one core method with the authenticated actor, and writes the
result. Authorization decisions (owner or admin) are the core's, so the
embedded scheduler and this API enforce the same rules.
"""

from __future__ import annotations

import json
import time

import prometheus_client

from gpupool.api.base import ApiHandler, maybe_await
from gpupool.api.openapi import build_document
from gpupool.wire.errors import InvalidRequest
from gpupool.wire.limits import MAX_REPLICAS
from gpupool.wire.replies import JOB_KINDS, JOB_STATES
from gpupool.wire.schemas import MAX_LIST, MAX_LOG_CHUNK


class HealthHandler(ApiHandler):
    """Liveness for load balancers and `gpupool serve` callers: no token, no secrets."""

    public = True

    def get(self) -> None:
        self.write_json({"ok": True, "time": time.time()})


class OpenApiHandler(ApiHandler):
    """The OpenAPI 3 document describing this API (public, so tools can discover it)."""

    public = True

    def get(self) -> None:
        doc = self.settings.get("openapi_cache")
        if doc is None:
            doc = json.dumps(build_document(), separators=(",", ":"))
            self.settings["openapi_cache"] = doc
        self.finish(doc)


class MetricsHandler(ApiHandler):
    """Prometheus text exposition of the core's registry (needs a token, like everything else)."""

    def get(self) -> None:
        self.set_header("Content-Type", prometheus_client.CONTENT_TYPE_LATEST)
        self.finish(prometheus_client.generate_latest(self.core.registry))


class WhoAmIHandler(ApiHandler):
    def get(self) -> None:
        who = {"user": self.actor.user, "admin": bool(self.actor.admin)}
        if getattr(self.actor, "project", None):
            who["project"] = self.actor.project  # a JupyterHub user's default project (their first group's)
        self.write_json(who)


class StatusHandler(ApiHandler):
    async def get(self) -> None:
        self.write_json(await maybe_await(self.core.status(self.actor)))


class PoolHandler(ApiHandler):
    async def get(self) -> None:
        self.write_json(await maybe_await(self.core.pool()))


class ProjectsHandler(ApiHandler):
    async def get(self) -> None:
        self.write_json(await maybe_await(self.core.list_projects(self.actor)))


class ProjectHandler(ApiHandler):
    async def put(self, name: str) -> None:
        fields = self.json_body(None, "project", empty={})  # the service checks it against the wire model
        self.write_json(await maybe_await(self.core.set_project(self.actor, name, fields)))

    async def delete(self, name: str) -> None:
        await maybe_await(self.core.delete_project(self.actor, name))
        self.set_status(204)
        self.clear_header("Content-Type")
        self.finish()


class JobsHandler(ApiHandler):
    async def get(self) -> None:
        filters: dict[str, object] = {}
        for key in ("project", "user"):
            value = self.query_str(key)
            if value is not None:
                filters[key] = value
        kind = self.query_str("kind")
        if kind is not None:
            if kind not in JOB_KINDS:
                raise InvalidRequest(f"unknown job kind {kind!r}: expected one of {', '.join(JOB_KINDS)}")
            filters["kind"] = kind
        states = self.query_str("state")
        if states is not None:
            wanted = [s.strip() for s in states.split(",") if s.strip()]
            unknown = [s for s in wanted if s not in JOB_STATES]
            if unknown:
                raise InvalidRequest(
                    f"unknown job state {unknown[0]!r}: expected some of {', '.join(JOB_STATES)}"
                )
            if wanted:
                filters["state"] = wanted
        limit = self.query_int("limit", None, minimum=1, maximum=MAX_LIST)
        if limit is not None:
            filters["limit"] = limit
        self.write_json(await maybe_await(self.core.list_jobs(self.actor, filters)))

    async def post(self) -> None:
        spec = self.json_body(None, "job spec")  # the service checks it against the wire model
        job, created = await maybe_await(self.core.submit(self.actor, spec))
        self.write_json(job, 201 if created else 200)


class JobHandler(ApiHandler):
    async def get(self, job_id: str) -> None:
        self.write_json(await maybe_await(self.core.get_job(self.actor, job_id)))


class JobActionHandler(ApiHandler):
    """POST /jobs/{id}/(pause|resume|cancel|renew): the core checks owner-or-admin and the job's state."""

    ACTIONS = ("pause", "resume", "cancel", "renew")

    async def post(self, job_id: str, action: str) -> None:
        if action not in self.ACTIONS:  # the route only matches these; kept as a guard
            raise InvalidRequest(f"unknown action {action!r}")
        self.write_json(await maybe_await(getattr(self.core, action)(self.actor, job_id)))


class JobLogsHandler(ApiHandler):
    async def get(self, job_id: str) -> None:
        offset = self.query_int("offset", 0, minimum=0, maximum=2**62)
        limit = self.query_int("limit", None, minimum=1, maximum=MAX_LOG_CHUNK)
        replica = self.query_int("replica", None, minimum=0, maximum=MAX_REPLICAS - 1)
        # Only when asked: a core without gangs (or an older one) keeps its four-argument read_log.
        more = {} if replica is None else {"replica": replica}
        self.write_json(await maybe_await(self.core.read_log(self.actor, job_id, offset, limit, **more)))


class HistoryHandler(ApiHandler):
    async def get(self) -> None:
        since = self.query_float("since", None)
        self.write_json(await maybe_await(self.core.history(since)))


class ReportHandler(ApiHandler):
    """Allocated vs used GPU-hours; the core decides what this user may see."""

    async def get(self) -> None:
        since = self.query_float("since", None)
        self.write_json(await maybe_await(self.core.report(self.actor, since, self.query_str("by"))))


class ReportSeriesHandler(ApiHandler):
    """Allocated vs used GPUs over time (the Lab panel's chart); the core decides what this user may see."""

    async def get(self) -> None:
        since, step = self.query_float("since", None), self.query_float("step", None)
        self.write_json(await maybe_await(self.core.report_series(self.actor, since, step, self.query_str("by"))))


class TokensHandler(ApiHandler):
    async def post(self) -> None:
        body = self.json_body("TokenRequest", "token request")
        self.write_json(await maybe_await(self.core.create_token(self.actor, body["user"])), 201)
