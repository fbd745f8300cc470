"""The /gpupool/api endpoints the Lab front end talks to (table in docs/design.md).

Each handler is a Jupyter ``APIHandler`` (Jupyter login, XSRF, the server's
authorizer on resource ``gpupool``) that forwards to the scheduler with *this
user's* scheduler token, so the scheduler's own ownership checks apply: a user
cannot pause or cancel another user's job through here. Errors are JSON
``{"error", "status"}``: the scheduler's 4xx message as is, 503 when the
scheduler cannot be reached.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web

from gpupool.wire.errors import GpupoolError, InvalidRequest, Unavailable
from gpupool.wire.limits import decode_json
from jupyter_gpupool import leases, starting
from jupyter_gpupool.connection import PoolConnection
from jupyter_gpupool.paths import resolve_notebook
from jupyter_gpupool.promote import PromoteRequest, promote, run_paths

AUTH_RESOURCE = "gpupool"
MAX_EVENT_WAIT = 30.0


class GpupoolHandler(APIHandler):
    """Common ground: the scheduler connection and JSON errors."""

    auth_resource = AUTH_RESOURCE

    @property
    def connection(self) -> PoolConnection:
        return self.settings["gpupool_connection"]

    async def scheduler(self) -> Any:
        """The user's scheduler client; Unavailable (503) if it cannot be reached or started."""
        try:
            return await self.connection.client()
        except GpupoolError:
            raise
        except Exception as err:
            raise Unavailable(f"cannot reach the scheduler: {err}") from err

    def json_body(self) -> Any:
        """The request body as JSON (400 with a message when it is not).

        The scheduler's own decoder: NaN, lone surrogates and nesting deep enough
        to exhaust the interpreter's recursion are refused here, not met later.
        """
        if not self.request.body:
            return {}
        return decode_json(self.request.body)

    def reply(self, data: Any, status: int = 200) -> None:
        self.set_status(status)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps(data))

    def float_arg(self, name: str, default: float | None = None) -> float | None:
        raw = self.get_argument(name, None)
        if raw in (None, ""):
            return default
        try:
            return float(raw)
        except ValueError as err:
            raise InvalidRequest(f"'{name}' must be a number, not '{raw}'") from err

    def int_arg(self, name: str, default: int | None = None) -> int | None:
        raw = self.get_argument(name, None)
        if raw in (None, ""):
            return default
        try:
            return int(raw)
        except ValueError as err:
            raise InvalidRequest(f"'{name}' must be an integer, not '{raw}'") from err

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        """``{"error", "status"}``: our errors keep their status and message."""
        message = self._reason
        exc = kwargs.get("exc_info", (None, None, None))[1]
        if isinstance(exc, GpupoolError):
            # The scheduler's address is the server's business, not the notebook user's.
            status_code, message = exc.status, self.connection.without_url(exc.message)
        elif isinstance(exc, web.HTTPError):
            message = exc.log_message or exc.reason or message
        elif exc is not None:
            status_code, message = 500, f"internal error in the gpupool extension: {exc}"
        self.set_status(status_code)
        self.set_header("Content-Type", "application/json")
        self.finish(json.dumps({"error": message, "status": status_code}))

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        """User-facing errors (bad input, scheduler down) are not server tracebacks."""
        if isinstance(value, GpupoolError):
            self.log.info("gpupool: %s %s -> %s %s", self.request.method, self.request.path, value.status, value)
            return
        super().log_exception(typ, value, tb)


class StatusHandler(GpupoolHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        client = await self.scheduler()
        status = await client.status()
        conn = self.connection
        status.update(
            {
                "me": conn.user,
                "project": conn.project,
                "admin": conn.admin,
                "reachable": True,
                "embedded": conn.is_embedded,
                "simulated": bool(status.get("simulated")),
            }
        )
        self.reply(status)


def gpu_memory_by_job(pool: dict[str, Any]) -> dict[str, int]:
    """Measured GPU memory per job id (NVML only; jobs sharing a GPU are not split)."""
    used: dict[str, int] = {}
    for node in pool.get("nodes", []):
        for gpu in node.get("gpus", []):
            if gpu.get("memory_used") is None:
                continue
            for alloc in gpu.get("allocations", []):
                used[alloc["job_id"]] = used.get(alloc["job_id"], 0) + int(gpu["memory_used"])
    return used


class KernelsHandler(GpupoolHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        client = await self.scheduler()
        shares = [s for s in leases.held().values() if s.kernel_id in self.kernel_manager]
        jobs = await asyncio.gather(*(client.job(s.job_id) for s in shares), return_exceptions=True)
        memory = gpu_memory_by_job(await client.pool()) if shares else {}
        out = []
        for share, job in zip(shares, jobs, strict=True):
            if isinstance(job, BaseException):
                continue
            item: dict[str, Any] = {"kernel_id": share.kernel_id, "path": share.path, "job": job}
            if job["id"] in memory:
                item["gpu_memory_used"] = memory[job["id"]]
            out.append(item)
        # kernels still starting (Lab does not know their id yet, only their notebook): what they wait for
        out.extend({"kernel_id": s.kernel_id, "path": s.path, "job": s.job, "starting": s.wire()}
                   for s in starting.waiting() if s.kernel_id not in {i["kernel_id"] for i in out})
        self.reply(out)


class JobsHandler(GpupoolHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        client = await self.scheduler()
        filters: dict[str, Any] = {}
        if self.get_argument("mine", "") in ("1", "true", "yes"):
            filters["user"] = self.connection.user
        for name in ("project", "state", "kind", "user"):
            value = self.get_argument(name, "")
            if value:
                filters[name] = value
        limit = self.int_arg("limit")
        if limit is not None:
            filters["limit"] = limit
        jobs = await client.jobs(**filters)
        self.reply([{**job, **run_paths(job)} for job in jobs])


class JobHandler(GpupoolHandler):
    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        client = await self.scheduler()
        job = await client.job(job_id)
        self.reply({**job, **run_paths(job)})


class JobLogsHandler(GpupoolHandler):
    @web.authenticated
    @authorized
    async def get(self, job_id: str) -> None:
        client = await self.scheduler()
        offset = self.int_arg("offset", 0) or 0
        replica = self.int_arg("replica")
        # A gang's replica K alone (the scheduler answers 400 outside 0..N-1); without it, every replica's lines.
        extra = {} if replica is None else {"replica": replica}
        self.reply(await client.logs(job_id, offset=offset, limit=self.int_arg("limit"), **extra))


class JobActionHandler(GpupoolHandler):
    @web.authenticated
    @authorized
    async def post(self, job_id: str, action: str) -> None:
        client = await self.scheduler()
        job = await getattr(client, action)(job_id)
        self.reply({**job, **run_paths(job)})


class ParametersHandler(GpupoolHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        import papermill

        full = resolve_notebook(self.settings["server_root_dir"], self.get_argument("path", ""))
        try:
            found = await asyncio.get_running_loop().run_in_executor(None, papermill.inspect_notebook, full)
        except Exception as err:
            raise InvalidRequest(f"cannot read the notebook's parameters: {err}") from err
        params = [
            {
                "name": p["name"],
                "inferred_type_name": p.get("inferred_type_name"),
                "default": p.get("default"),
                "help": p.get("help", ""),
            }
            for p in found.values()
        ]
        self.reply({"parameters": params})


class PromoteHandler(GpupoolHandler):
    @web.authenticated
    @authorized
    async def post(self) -> None:
        request = PromoteRequest.from_body(self.json_body())
        client = await self.scheduler()
        root = self.settings["server_root_dir"]
        job = await promote(client, root, request, self.connection.project)
        self.reply(job, status=201)


class EventsHandler(GpupoolHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        client = await self.scheduler()
        since = self.int_arg("since", 0) or 0
        timeout = min(max(self.float_arg("timeout", 0.0) or 0.0, 0.0), MAX_EVENT_WAIT)
        self.reply(await client.events(since=since, timeout=timeout))


class HistoryHandler(GpupoolHandler):
    @web.authenticated
    @authorized
    async def get(self) -> None:
        client = await self.scheduler()
        self.reply(await client.history(since=self.float_arg("since")))


class UseSeriesHandler(GpupoolHandler):
    """Allocated vs used GPUs over time (the panel's chart): the scheduler's series, for what this user may see."""

    @web.authenticated
    @authorized
    async def get(self) -> None:
        client = await self.scheduler()
        by = self.get_argument("by", "") or None
        self.reply(await client.report_series(since=self.float_arg("since"), step=self.float_arg("step"), by=by))


class ProjectHandler(GpupoolHandler):
    @web.authenticated
    @authorized
    async def put(self, name: str) -> None:
        body = self.json_body()
        if not isinstance(body, dict):
            raise InvalidRequest("the request body must be a JSON object of project fields")
        client = await self.scheduler()  # connects first: a failure is the same 503 as everywhere
        client = await self.connection.admin_client() or client
        self.reply(await client.set_project(name, **body))


ROUTES: list[tuple[str, type[GpupoolHandler]]] = [
    ("status", StatusHandler),
    ("kernels", KernelsHandler),
    ("jobs", JobsHandler),
    ("jobs/(?P<job_id>[^/]+)", JobHandler),
    ("jobs/(?P<job_id>[^/]+)/logs", JobLogsHandler),
    ("jobs/(?P<job_id>[^/]+)/(?P<action>pause|resume|cancel)", JobActionHandler),
    ("parameters", ParametersHandler),
    ("promote", PromoteHandler),
    ("events", EventsHandler),
    ("history", HistoryHandler),
    ("use", UseSeriesHandler),
    ("projects/(?P<name>[^/]+)", ProjectHandler),
]


def handlers(base_url: str = "/") -> list[tuple[str, type[GpupoolHandler]]]:
    """Tornado routes for all endpoints under ``<base_url>gpupool/api/``."""
    return [(url_path_join(base_url, "gpupool", "api", path), cls) for path, cls in ROUTES]
