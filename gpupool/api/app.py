"""make_app(core): the tornado Application serving the scheduler's HTTP API.

The route table here is the single list of endpoints; the OpenAPI document
(:mod:`gpupool.api.openapi`) describes the same set and a test keeps the two
equal. Every handler derives from :class:`gpupool.api.base.ApiHandler`, which
authenticates before anything else runs.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import Any

import prometheus_client
import tornado.web

from gpupool.api import handlers as h
from gpupool.api.base import NotFoundHandler
from gpupool.api.events import EventsHandler
from gpupool.api.node_use import NodeUseHandler

log = logging.getLogger("gpupool.api")

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
    (r"/api/v1/report", h.ReportHandler),
    (r"/api/v1/report/series", h.ReportSeriesHandler),
    (r"/api/v1/tokens", h.TokensHandler),
    (r"/api/v1/nodes/" + SEGMENT.format("node") + r"/use", NodeUseHandler),
]


class ApiMetrics:
    """Request counts and latencies per endpoint, in the core's registry (so /metrics shows them)."""

    def __init__(self, registry: prometheus_client.CollectorRegistry) -> None:
        self.requests = prometheus_client.Counter(
            "gpupool_api_requests", "HTTP API requests by endpoint, method and status",
            ["endpoint", "method", "status"], registry=registry)
        self.seconds = prometheus_client.Histogram(
            "gpupool_api_request_seconds", "HTTP API request handling time by endpoint",
            ["endpoint"], registry=registry,
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10, 60))


# One set of collectors per registry: make_app may be called twice for one core (tests, restarts).
_METRICS: weakref.WeakKeyDictionary[Any, ApiMetrics] = weakref.WeakKeyDictionary()


def _api_metrics(core: Any) -> ApiMetrics | None:
    registry = getattr(core, "registry", None)
    if registry is None:
        return None
    if registry not in _METRICS:
        _METRICS[registry] = ApiMetrics(registry)
    return _METRICS[registry]


def _request_logger(metrics: ApiMetrics | None) -> Any:
    def log_request(handler: tornado.web.RequestHandler) -> None:
        """Access log (5xx as errors, the rest at debug: a busy pool polls a lot) and request metrics."""
        status = handler.get_status()
        elapsed = handler.request.request_time()
        level = logging.ERROR if status >= 500 else logging.DEBUG
        if log.isEnabledFor(level):
            log.log(level, "%d %s %s %.1fms", status, handler.request.method, handler.request.path, 1000.0 * elapsed)
        if metrics is not None:
            endpoint = type(handler).__name__.removesuffix("Handler")
            metrics.requests.labels(endpoint, handler.request.method, str(status)).inc()
            if endpoint != "Events":  # long-polls and streams would drown the latency histogram
                metrics.seconds.labels(endpoint).observe(elapsed)

    return log_request


def make_app(core: Any, **settings: Any) -> tornado.web.Application:
    """Build the Application for ``core``.

    ``settings`` go to tornado. ``shutdown_event`` (an :class:`asyncio.Event`, made
    here if not given) ends long-polls and SSE streams when set, so a stopping
    service does not wait on idle clients.
    """
    settings.setdefault("shutdown_event", asyncio.Event())
    settings.setdefault("log_function", _request_logger(_api_metrics(core)))
    settings.setdefault("default_handler_class", NotFoundHandler)
    settings.setdefault("default_handler_args", {"core": core})
    return tornado.web.Application(
        [tornado.web.url(pattern, handler, {"core": core}) for pattern, handler in ROUTES],
        **settings,
    )
