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
    """A build workload asked for more than its project's fixed quota leaves."""

    status = 409


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
