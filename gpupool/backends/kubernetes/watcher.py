"""List, then watch from the list's resourceVersion, in a thread of its own; objects as plain JSON.

The informer pattern by hand, small: an expired watch (HTTP 410 Gone) means
"re-list"; any other failure (API server unreachable, 5xx) is retried with
exponential backoff (0.2 s to 30 s) and reported to :class:`Health`, so the
service keeps running and says what is wrong instead of crashing.

Both the list and the watch are read raw (``_preload_content=False``): each
watch event is one JSON line, decoded once with ``json.loads`` and handed on
as dicts (read them with :mod:`gpupool.backends.kubernetes.objects`). The official
client's ``Watch`` decodes every event, encodes it again and builds
``V1Pod`` models from it; at a few hundred pods a second that was a quarter
of the scheduler's CPU.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes.client.rest import ApiException

from gpupool.backends.kubernetes.calls import raw_json
from gpupool.backends.kubernetes.health import Health
from gpupool.backends.kubernetes.objects import Obj, resource_version

log = logging.getLogger("gpupool.backends.kubernetes")

_CHUNK = 64 * 1024


class ListWatch:
    """Keeps a callback-fed view of one kind of object current: ``on_reset(items)`` after each list, then events.

    ``list_fn`` is the client's list call (``list_namespaced_pod``, ``list_node``, ...);
    the items and the events' objects are the API server's JSON as dicts.
    """

    def __init__(self, name: str, list_fn: Callable[..., Any], on_reset: Callable[[list[Obj]], None],
                 on_event: Callable[[str, Obj], None], health: Health, *, watch_timeout_s: int = 20,
                 min_backoff_s: float = 0.2, max_backoff_s: float = 30.0, **selectors: Any) -> None:
        self.name = name
        self._list_fn = list_fn
        self._on_reset = on_reset
        self._on_event = on_event
        self._health = health
        self._selectors = selectors
        self._timeout = watch_timeout_s
        self._min_backoff = min_backoff_s
        self._max_backoff = max_backoff_s
        self._stopping = threading.Event()
        self.synced = threading.Event()
        """Set once the first list has been applied: before that, absence means nothing."""
        self.relists = 0
        self._resp: Any = None  # the watch reply being read (stop() cuts its socket)
        self._thread = threading.Thread(target=self._run, name=f"gpupool-watch-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, wait_s: float = 2.0) -> None:
        """End the thread: the watch in flight is cut (its socket shut down), else it ends at its timeout."""
        self._stopping.set()
        resp = self._resp
        sock = getattr(getattr(resp, "connection", None), "sock", None) if resp is not None else None
        if sock is not None:
            try:  # unblocks the thread's read at once; the reply is closed by the thread itself
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._thread.join(wait_s)

    def _run(self) -> None:
        delay = self._min_backoff
        while not self._stopping.is_set():
            try:
                listed = raw_json(self._list_fn(**self._selectors, _preload_content=False))
                rv = str((listed.get("metadata") or {}).get("resourceVersion") or "")
                self._on_reset(list(listed.get("items") or []))
                self.synced.set()
                self._health.ok(self.name)
                delay = self._min_backoff
                while not self._stopping.is_set():
                    rv = self._watch_from(rv)
            except ApiException as e:
                if e.status == 410:  # the watch expired: what we missed is only in a fresh list
                    self.relists += 1
                    log.info("%s watch expired (410); re-listing", self.name)
                    continue
                self._failed(e)
            except Exception as e:  # unreachable, timeouts, bad replies: back off, keep trying
                self._failed(e)
            if self._stopping.wait(delay):
                return
            delay = min(delay * 2, self._max_backoff)

    def _watch_from(self, rv: str) -> str:
        """One watch request from ``rv`` (it ends after ``watch_timeout_s``); the resourceVersion reached."""
        resp = self._list_fn(**self._selectors, watch=True, resource_version=rv, timeout_seconds=self._timeout,
                             _request_timeout=self._timeout + 10, _preload_content=False)
        self._resp = resp
        try:
            if not 200 <= int(resp.status) <= 299:
                raise ApiException(status=int(resp.status), reason=resp.reason)
            for line in _lines(resp):
                if self._stopping.is_set():
                    break
                event = json.loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":  # a Status: 410 when rv is too old (re-list), else a failure
                    raise ApiException(status=int(obj.get("code") or 500),
                                       reason=f"{obj.get('reason')}: {obj.get('message')}")
                rv = resource_version(obj) or rv
                if kind == "BOOKMARK":
                    continue
                self._on_event(kind, obj)
        finally:
            self._resp = None
            resp.close()
            resp.release_conn()
        self._health.ok(self.name)
        return rv

    def _failed(self, e: BaseException) -> None:
        if self._stopping.is_set():
            return
        self._health.failed(self.name, e)
        log.warning("%s list/watch failed (%s); retrying with backoff", self.name, e)


def _lines(resp: Any) -> Iterator[bytes]:
    """The reply's non-empty lines as they arrive (one watch event each), without their newline."""
    rest = b""
    for chunk in resp.stream(_CHUNK, decode_content=True):
        if b"\n" not in chunk:
            rest += chunk
            continue
        parts = (rest + chunk).split(b"\n")
        rest = parts.pop()
        for line in parts:
            if line.strip():
                yield line
    if rest.strip():
        yield rest
