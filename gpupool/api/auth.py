"""Token authentication for the HTTP API.

The API accepts ``Authorization: token <TOKEN>`` (Jupyter's style) and
``Authorization: Bearer <TOKEN>``. Which tokens are valid, and who they belong
to, is the core's business (:meth:`SchedulerCore.authenticate`, and the
JupyterHub check ``core.hub`` when the service accepts Hub tokens); this
module only reads the header, asks them, and turns "no" into a clear 401.
"""

from __future__ import annotations

from typing import Any

from gpupool.wire.errors import Unauthorized

SCHEMES = ("token", "bearer")


def parse_authorization(header: str | None) -> str:
    """Return the token in an Authorization header, or raise Unauthorized saying what is wrong."""
    if not header or not header.strip():
        raise Unauthorized("missing token: send the header 'Authorization: token <TOKEN>'")
    parts = header.strip().split(None, 1)
    if len(parts) != 2 or parts[0].lower() not in SCHEMES or not parts[1].strip():
        raise Unauthorized("malformed Authorization header: expected 'token <TOKEN>' or 'Bearer <TOKEN>'")
    return parts[1].strip()


async def authenticate(core: Any, header: str | None) -> Any:
    """Return the Actor for the request's token, or raise Unauthorized.

    gpupool's own tokens first (a lookup in the store); a token it does not
    know goes to the JupyterHub check when the service has one (``core.hub``,
    see gpupool.service.hub), which may wait on the Hub: hence async.
    """
    token = parse_authorization(header)
    actor = core.authenticate(token)
    hub = getattr(core, "hub", None)
    if actor is None and hub is not None:
        actor = await hub.actor(token)
    if actor is None:
        raise Unauthorized("invalid token")
    return actor
