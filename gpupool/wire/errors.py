"""Errors every layer shares, each carrying the HTTP status it maps to.

The service core raises these; the HTTP API turns them into 4xx replies with
the message; the client turns 4xx replies back into them; the CLI prints the
message on one line and exits non-zero. One message, written once, reaches the
user through every path.
"""

from __future__ import annotations


class GpupoolError(Exception):
    """Base class: a message meant for the user, and an HTTP status."""

    status = 400

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def details(self) -> dict[str, object]:
        """Fields the error reply carries beside ``error``, ``status`` and ``type`` (none by default)."""
        return {}

    def take_details(self, reply: dict[str, object]) -> None:
        """Read :meth:`details` back from an error reply (the client side)."""


class InvalidRequest(GpupoolError):
    status = 400


class Unauthorized(GpupoolError):
    status = 401


class Forbidden(GpupoolError):
    status = 403


class NotFound(GpupoolError):
    status = 404


class Conflict(GpupoolError):
    """The request is well formed but the object's state forbids it (e.g. pausing a finished job)."""

    status = 409


class QuotaExceeded(GpupoolError):
    """A build workload asked for more than its project's fixed quota leaves.

    ``held_milli``: how much of the quota the project's live build work holds
    (0: nothing is held, the request alone is bigger than the quota; None:
    not known, e.g. from an older server). The Jupyter provisioner tells the
    user to shut a kernel down only when something is held.
    """

    status = 409

    def __init__(self, message: str, held_milli: int | None = None) -> None:
        super().__init__(message)
        self.held_milli = held_milli

    def details(self) -> dict[str, object]:
        return {} if self.held_milli is None else {"held_milli": self.held_milli}

    def take_details(self, reply: dict[str, object]) -> None:
        held = reply.get("held_milli")
        if isinstance(held, int) and not isinstance(held, bool) and held >= 0:
            self.held_milli = held


class Unavailable(GpupoolError):
    """The scheduler cannot be reached (client side) or is shutting down."""

    status = 503


ERRORS_BY_STATUS: dict[int, type[GpupoolError]] = {
    400: InvalidRequest,
    401: Unauthorized,
    403: Forbidden,
    404: NotFound,
    409: Conflict,
    503: Unavailable,
}
