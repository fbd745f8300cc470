"""The fence: no write of the Kubernetes backend leaves this process unless it leads (:mod:`.leader`).

Why at the API client, not at each call site: the backend writes from many
places (a job's pod created, bound and deleted; a kubectl pod's ConfigMap,
binding and eviction; a gang's Service; events), and more will come. Every
one of them goes through its ``ApiClient``'s ``rest_client.request`` (the
client's generated methods and :func:`.calls.post_json` alike), so a check
there covers them all, including those written later. Reads (GET, HEAD)
pass: a standby may look, and watches keep running.

A refused write raises :class:`NotLeader`, a ``ConnectionError``: to the
callers it is the API server not answering (retried with backoff, never
recorded as a refusal or a failure of the job), which is what it is for this
instance. It lasts only until the process stops (``gpupool serve`` exits on
a lost lease), and the store is not told anything wrong meanwhile.
"""

from __future__ import annotations

from typing import Any, Protocol

WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})


class WriteGate(Protocol):
    """What the fence asks (:class:`.leader.Leadership`)."""

    def may_write(self) -> bool: ...

    def refusal(self) -> str: ...


class NotLeader(ConnectionError):
    """A write refused inside this process: it does not lead (any more)."""


class FencedRest:
    """The client's REST client, writes refused unless ``gate.may_write()``; all else passed through."""

    def __init__(self, inner: Any, gate: WriteGate) -> None:
        self._inner = inner
        self._gate = gate
        self.refused = 0
        """Writes refused so far (tests and ``GET /status`` read it)."""

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        if method.upper() in WRITES and not self._gate.may_write():
            self.refused += 1
            raise NotLeader(f"{method.upper()} {url.split('?', 1)[0]} not sent: {self._gate.refusal()}")
        return self._inner.request(method, url, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def fence(api_client: Any, gate: WriteGate) -> FencedRest:
    """Put the fence in ``api_client`` (every API object made on it shares it); the fence, for its count."""
    fenced = FencedRest(api_client.rest_client, gate)
    api_client.rest_client = fenced
    return fenced
