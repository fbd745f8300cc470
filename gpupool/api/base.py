"""The base request handler: authentication, JSON in and out, errors as JSON.

Every API handler derives from :class:`ApiHandler`, so authentication is not
something a new endpoint can forget: ``prepare`` refuses the request unless the
class says ``public = True`` (only the OpenAPI document and /healthz do).

Errors: a :class:`gpupool.wire.errors.GpupoolError` from anywhere below becomes its
``.status`` with ``{"error", "status", "type"}``; tornado's own HTTP errors (bad
method, unknown route) get the same JSON shape; anything else is a bug, logged
with its traceback, and answered 500.
"""

from __future__ import annotations

import inspect
import json
import logging
import math
from typing import Any

import tornado.web

from gpupool.api import auth
from gpupool.wire.errors import Forbidden, GpupoolError, InvalidRequest, Unauthorized
from gpupool.wire.limits import decode_json
from gpupool.wire.schemas import validate

log = logging.getLogger("gpupool.api")


async def maybe_await(value: Any) -> Any:
    """Await ``value`` if the core handed back an awaitable; lets core methods be sync or async."""
    if inspect.isawaitable(value):
        return await value
    return value


def _within(name: str, value: Any, minimum: Any, maximum: Any) -> Any:
    """``value`` of query parameter ``name``, or InvalidRequest when it is outside [minimum, maximum]."""
    if minimum is not None and value < minimum:
        raise InvalidRequest(f"query parameter {name} must be at least {minimum}, not {value}")
    if maximum is not None and value > maximum:
        raise InvalidRequest(f"query parameter {name} must be at most {maximum}, not {value}")
    return value


class ApiHandler(tornado.web.RequestHandler):
    """JSON handler bound to the scheduler core, authenticated unless ``public``."""

    public = False
    node_agents = False  # whether a node agent's token may call it (only the GPU use report: api/node_use.py)

    def initialize(self, core: Any) -> None:
        self.core = core
        self.actor: Any = None

    def set_default_headers(self) -> None:
        self.set_header("Content-Type", "application/json; charset=UTF-8")
        self.set_header("Cache-Control", "no-store")

    async def prepare(self) -> None:
        # Counted so that a stopping service can let woken long-polls answer before it closes connections.
        self.settings["inflight"] = self.settings.get("inflight", 0) + 1
        self._counted = True
        if not self.public:
            self.actor = await auth.authenticate(self.core, self.request.headers.get("Authorization"))
            if getattr(self.actor, "node_agent", False) and not self.node_agents:
                raise Forbidden("a node agent's token may only report its node's GPU use "
                                "(POST /api/v1/nodes/{node}/use)")

    def on_finish(self) -> None:
        self._uncount()

    def on_connection_close(self) -> None:
        self._uncount()

    def _uncount(self) -> None:
        if getattr(self, "_counted", False):
            self._counted = False
            self.settings["inflight"] = max(0, self.settings.get("inflight", 1) - 1)

    # ------------------------------------------------------------- input
    def json_body(self, schema: str | None, what: str, *, empty: Any = None) -> Any:
        """Parse the body as JSON (and check it against a schema component).

        ``empty`` is what an empty body means (None: an empty body is an error).
        """
        raw = self.request.body
        if not raw or not raw.strip():
            if empty is None:
                raise InvalidRequest(f"missing request body: expected a JSON {what}")
            body = empty
        else:
            body = decode_json(raw)  # NaN, lone surrogates and deep nesting are 400s here
        if schema is not None:
            validate(schema, body, what)
        return body

    def query_int(self, name: str, default: int | None, *, minimum: int | None = None,
                  maximum: int | None = None) -> int | None:
        raw = self.get_query_argument(name, None)
        if raw is None or raw == "":
            return default
        try:
            value = int(raw)
        except ValueError:
            raise InvalidRequest(f"query parameter {name} must be an integer, not {raw[:40]!r}") from None
        return _within(name, value, minimum, maximum)

    def query_float(self, name: str, default: float | None, *, minimum: float | None = None,
                    maximum: float | None = None) -> float | None:
        raw = self.get_query_argument(name, None)
        if raw is None or raw == "":
            return default
        try:
            value = float(raw)
        except ValueError:
            raise InvalidRequest(f"query parameter {name} must be a number, not {raw[:40]!r}") from None
        if not math.isfinite(value):
            raise InvalidRequest(f"query parameter {name} must be a finite number")
        return _within(name, value, minimum, maximum)

    def query_str(self, name: str) -> str | None:
        value = self.get_query_argument(name, None)
        if value is not None and "\x00" in value:
            raise InvalidRequest(f"query parameter {name} must not contain NUL characters")
        return value or None

    # ------------------------------------------------------------ output
    def write_json(self, value: Any, status: int = 200) -> None:
        self.set_status(status)
        self.finish(json.dumps(value, separators=(",", ":")))

    def write_error(self, status_code: int, **kwargs: Any) -> None:
        exc = kwargs.get("exc_info", (None, None, None))[1]
        kind = "GpupoolError"
        details: dict[str, object] = {}
        if isinstance(exc, GpupoolError):
            status_code, message, kind = exc.status, exc.message, type(exc).__name__
            details = exc.details()
        elif isinstance(exc, tornado.web.HTTPError):
            status_code = exc.status_code
            logged = exc.log_message % exc.args if exc.log_message and exc.args else exc.log_message
            message = logged or exc.reason or self._reason
            if status_code == 405:
                message = f"method {self.request.method} is not allowed on {self.request.path}"
        elif status_code >= 500:
            message = "internal error in the scheduler (a bug; details are in the service log)"
            kind = "InternalError"
        else:
            message = self._reason
        self.set_status(status_code)
        if status_code == 401:
            self.set_header("WWW-Authenticate", 'Bearer realm="gpupool"')
        self.set_header("Content-Type", "application/json; charset=UTF-8")
        self.finish(json.dumps({**details, "error": message, "status": status_code, "type": kind}))

    def log_exception(self, typ: Any, value: Any, tb: Any) -> None:
        # The user's mistakes are answered, not logged as errors; bugs keep their traceback.
        if isinstance(value, GpupoolError | tornado.web.HTTPError):
            if not isinstance(value, Unauthorized):
                log.debug("%s %s -> %s", self.request.method, self.request.path, value)
            return
        super().log_exception(typ, value, tb)


class NotFoundHandler(ApiHandler):
    """Unknown paths: a JSON 404, but only after authentication like every other handler.

    Without a valid token every path, known or not, answers 401, so the API does
    not tell strangers which endpoints exist (and no handler is exempt from auth).
    """

    async def prepare(self) -> None:
        await super().prepare()
        raise tornado.web.HTTPError(404, "no such endpoint: %s", self.request.path)
