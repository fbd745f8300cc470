"""List, then watch from the list's resourceVersion, in a thread of its own.

The informer pattern by hand, small: an expired watch (HTTP 410 Gone) means
"re-list"; any other failure (API server unreachable, 5xx) is retried with
exponential backoff (0.2 s to 30 s) and reported to :class:`Health`, so the
service keeps running and says what is wrong instead of crashing.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from kubernetes import watch
from kubernetes.client.rest import ApiException

from scheduler.kube.health import Health

log = logging.getLogger("scheduler.kube")


class ListWatch:
    """Keeps a callback-fed view of one kind of object current: ``on_reset(items)`` after each list, then events."""

    def __init__(self, name: str, list_fn: Callable[..., Any], on_reset: Callable[[list[Any]], None],
                 on_event: Callable[[str, Any], None], health: Health, *, watch_timeout_s: int = 20,
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
        self._watch: watch.Watch | None = None
        self._thread = threading.Thread(target=self._run, name=f"gpupool-watch-{name}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self, wait_s: float = 2.0) -> None:
        """End the thread (a watch in flight ends at its next event or its timeout; the thread is a daemon)."""
        self._stopping.set()
        w = self._watch
        if w is not None:
            w.stop()
        self._thread.join(wait_s)

    def _run(self) -> None:
        delay = self._min_backoff
        while not self._stopping.is_set():
            try:
                listed = self._list_fn(**self._selectors)
                rv = listed.metadata.resource_version
                self._on_reset(list(listed.items))
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
        w = watch.Watch()
        self._watch = w
        for ev in w.stream(self._list_fn, resource_version=rv, timeout_seconds=self._timeout,
                           _request_timeout=self._timeout + 10, **self._selectors):
            if self._stopping.is_set():
                break
            obj = ev["object"]
            rv = getattr(obj.metadata, "resource_version", None) or rv
            self._on_event(ev["type"], obj)
        self._health.ok(self.name)
        return rv

    def _failed(self, e: BaseException) -> None:
        if self._stopping.is_set():
            return
        self._health.failed(self.name, e)
        log.warning("%s list/watch failed (%s); retrying with backoff", self.name, e)
