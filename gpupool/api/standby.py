"""The HTTP API of a standby: an instance waiting for the leader's Lease (docs/kubernetes.md, "One leader").

Why a separate app: a standby has no core. It must not open the store (the
leader owns it, on a volume both may mount), so it cannot answer any
request, and cannot check user tokens, which live in that store. What it can do:

- ``GET /healthz`` (public) answers 503 ``{"ok": false, "role": "standby"}``,
  so a readiness probe keeps the Service's traffic on the leader;
- ``GET /api/v1/openapi.json`` (public) as always;
- every other path is authenticated first: no token or a malformed header
  is a 401 as on the leader. The admin token (the one token it can check
  without the store) gets a 503 naming the leader. Any other token gets a
  503 that says only what ``/healthz`` says to anyone (this is a standby),
  without the leader's name: it cannot tell that token from a wrong one.
"""

from __future__ import annotations

import hmac
import logging
import time
from collections.abc import Callable
from typing import Any

import tornado.web

from gpupool.api.base import ApiHandler
from gpupool.api.handlers import OpenApiHandler
from gpupool.wire.errors import Unavailable

log = logging.getLogger("gpupool.api.standby")


class StandbyInfo:
    """What the standby's handlers read: the admin token (None: none known) and the leader's identity, now."""

    def __init__(self, admin_token: str | None, leader: Callable[[], str | None], lease: str) -> None:
        self.admin_token = admin_token
        self.leader = leader
        self.lease = lease

    def is_admin(self, token: str) -> bool:
        return bool(self.admin_token) and hmac.compare_digest(
            token.encode("utf-8", "surrogatepass"), str(self.admin_token).encode("utf-8", "surrogatepass"))


class StandbyHealthHandler(ApiHandler):
    """Not ready: a readiness probe on /healthz keeps requests away from a standby."""

    public = True

    def get(self) -> None:
        self.write_json({"ok": False, "role": "standby", "time": time.time()}, status=503)


class StandbyHandler(ApiHandler):
    """Every other path: 401 without a valid-looking token, else 503 (naming the leader to the admin)."""

    async def prepare(self) -> None:
        await super().prepare()  # public is False: the base asks auth.authenticate(self.core, ...)
        raise AssertionError("unreachable: the standby's authenticate always raises")


class _StandbyCore:
    """Stands in for the core in :func:`gpupool.api.auth.authenticate`: every answer is a 503 or a 401."""

    hub = None

    def __init__(self, info: StandbyInfo) -> None:
        self.info = info

    def authenticate(self, token: str) -> Any:
        if self.info.is_admin(token):
            raise Unavailable(f"this instance is a standby; the leader is {self.info.leader() or 'unknown'} "
                              f"(lease {self.info.lease}); send requests to the leader (the Service does)")
        raise Unavailable("this instance is a standby: it takes requests only once it leads (and cannot check "
                          "this token before then); send requests to the leader (the Service does)")


def _quiet(handler: tornado.web.RequestHandler) -> None:
    log.debug("standby: %d %s %s", handler.get_status(), handler.request.method, handler.request.path)


def make_standby_app(info: StandbyInfo, **settings: Any) -> tornado.web.Application:
    """The standby's Application: public /healthz (503) and OpenAPI document, everything else 401 or 503."""
    core = _StandbyCore(info)
    settings.setdefault("log_function", _quiet)  # a probe's 503 every few seconds is no error
    settings.setdefault("default_handler_class", StandbyHandler)
    settings.setdefault("default_handler_args", {"core": core})
    return tornado.web.Application([
        tornado.web.url(r"/healthz", StandbyHealthHandler, {"core": core}),
        tornado.web.url(r"/api/v1/openapi.json", OpenApiHandler, {"core": core}),
    ], **settings)

