"""POST /api/sessions answers a GPU-share refusal with its own status (409 over quota), not 500.

JupyterLab opens a notebook through POST /api/sessions. jupyter_server's
``SessionRootHandler.post`` turns every exception from starting the session's
kernel into ``HTTPError(500, str(e))`` (only a missing kernelspec and a
duplicate kernel id get other codes), so the provisioner's
:class:`~jupyter_gpupool.provisioner.GpuShareUnavailable` (409 with the quota
message, which POST /api/kernels passes through as is) reached the user as a
server error.

Why an overriding handler, and why this one:

* Raising a different exception from the provisioner cannot help: the session
  handler catches them all. Disguising the refusal as ``DuplicateKernelError``
  (which it maps to 409) would misname the cause and would also turn our 503
  ("no scheduler") into a 409.
* A custom session manager cannot help either, for the same reason.
* So the extension registers :class:`GpuSessionRootHandler` for the same route.
  Tornado tries handlers added by ``add_handlers`` (extensions) before the
  server's own, so this subclass serves POST /api/sessions. It runs Jupyter's
  own ``post`` unchanged and only replaces the 500 when that 500 was caused by
  a ``GpuShareUnavailable``: the refusal is re-raised with its status and
  message. Every other outcome (400s, 501 for a missing kernelspec, other
  500s) is Jupyter's, untouched, so a newer jupyter_server keeps its
  behaviour; and if jupyter_server one day passes HTTP errors through itself,
  the override simply never triggers. ``tests/jupyter`` checks the 409.
"""

from __future__ import annotations

from typing import Any

from jupyter_server.auth.decorator import authorized
from jupyter_server.services.sessions.handlers import SessionRootHandler
from tornado import web

from jupyter_gpupool.provisioner import GpuShareUnavailable

SESSIONS_PATH = r"/api/sessions"  # the route of SessionRootHandler, relative to the server's base_url


def share_refusal_behind(error: BaseException) -> GpuShareUnavailable | None:
    """The GpuShareUnavailable that caused ``error`` (through ``raise ... from`` or implicit chaining), if any."""
    seen: set[int] = set()
    cause: BaseException | None = error.__cause__ or error.__context__
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, GpuShareUnavailable):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None


class GpuSessionRootHandler(SessionRootHandler):  # type: ignore[misc]
    """Jupyter's sessions root handler, except that a GPU-share refusal keeps its status and message."""

    @web.authenticated
    @authorized
    async def post(self, *args: Any, **kwargs: Any) -> None:
        """Create a session as Jupyter does; re-raise a GPU-share refusal instead of Jupyter's 500."""
        try:
            await super().post(*args, **kwargs)
        except web.HTTPError as err:
            refusal = share_refusal_behind(err) if err.status_code == 500 else None
            if refusal is None:
                raise
            raise refusal from None


def session_handlers() -> list[tuple[str, type[SessionRootHandler]]]:
    """The extension's override of Jupyter's sessions root route (base_url is prefixed by the ExtensionApp)."""
    return [(SESSIONS_PATH, GpuSessionRootHandler)]
