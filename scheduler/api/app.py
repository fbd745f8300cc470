"""make_app(core): the tornado Application serving the scheduler's HTTP API.

The route table here is the single list of endpoints; the OpenAPI document
(:mod:`scheduler.api.openapi`) describes the same set and a test keeps the two
equal. Every handler derives from :class:`scheduler.api.base.ApiHandler`, which
authenticates before anything else runs.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import tornado.web

from scheduler.api import handlers as h
from scheduler.api.base import NotFoundHandler
from scheduler.api.events import EventsHandler

log = logging.getLogger("scheduler.api")

# Path segments: ids and names are anything but a slash; the core validates them.
SEGMENT = r"(?P<{}>[^/]+)"
JOB = SEGMENT.format("job_id")

ROUTES: list[tuple[str, type[tornado.web.RequestHandler]]] = [
    (r"/healthz", h.HealthHandler),
    (r"/metrics", h.MetricsHandler),
    (r"/api/v1/openapi.json", h.OpenApiHandler),
    (r"/api/v1/whoami", h.WhoAmIHandler),
    (r"/api/v1/status", h.StatusHandler),
    (r"/api/v1/pool", h.PoolHandler),
    (r"/api/v1/projects", h.ProjectsHandler),
    (r"/api/v1/projects/" + SEGMENT.format("name"), h.ProjectHandler),
    (r"/api/v1/jobs", h.JobsHandler),
    (r"/api/v1/jobs/" + JOB, h.JobHandler),
    (r"/api/v1/jobs/" + JOB + r"/(?P<action>pause|resume|cancel|renew)", h.JobActionHandler),
    (r"/api/v1/jobs/" + JOB + r"/logs", h.JobLogsHandler),
    (r"/api/v1/events", EventsHandler),
    (r"/api/v1/history", h.HistoryHandler),
    (r"/api/v1/tokens", h.TokensHandler),
]


def _log_request(handler: tornado.web.RequestHandler) -> None:
    """Access log: 5xx as errors, the rest at debug (a busy pool polls a lot)."""
    status = handler.get_status()
    level = logging.ERROR if status >= 500 else logging.DEBUG
    if log.isEnabledFor(level):
        log.log(level, "%d %s %s %.1fms", status, handler.request.method, handler.request.path,
                1000.0 * handler.request.request_time())


def make_app(core: Any, **settings: Any) -> tornado.web.Application:
    """Build the Application for ``core``.

    ``settings`` go to tornado. ``shutdown_event`` (an :class:`asyncio.Event`, made
    here if not given) ends long-polls and SSE streams when set, so a stopping
    service does not wait on idle clients.
    """
    settings.setdefault("shutdown_event", asyncio.Event())
    settings.setdefault("log_function", _log_request)
    settings.setdefault("default_handler_class", NotFoundHandler)
    settings.setdefault("default_handler_args", {"core": core})
    return tornado.web.Application(
        [tornado.web.url(pattern, handler, {"core": core}) for pattern, handler in ROUTES],
        **settings,
    )
