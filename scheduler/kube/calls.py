"""The blocking API calls, off the asyncio loop: a few worker threads, transient failures retried with backoff.

The official client is synchronous; the core's loop must never wait on the
network. Starts, stops and cleanups go to these threads; their results come
back as futures (awaited with ``asyncio.wrap_future`` where the core waits).
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable
from typing import Any, TypeVar

from kubernetes.client.rest import ApiException

from scheduler.kube.health import Health

T = TypeVar("T")


def transient(e: BaseException) -> bool:
    """Worth retrying: the server did not answer, or answered 429/5xx. A 4xx is an answer."""
    if isinstance(e, ApiException):
        return e.status in (0, None, 429) or (isinstance(e.status, int) and e.status >= 500)
    return isinstance(e, (OSError, TimeoutError)) or type(e).__module__.startswith("urllib3")


class Calls:
    """Worker threads for API calls, reporting to ``health``."""

    def __init__(self, health: Health, workers: int = 4) -> None:
        self.health = health
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="gpupool-kube")
        self._closed = False

    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> concurrent.futures.Future[T]:
        return self._pool.submit(fn, *args, **kwargs)

    def retrying(self, source: str, fn: Callable[[], T], give_up_after_s: float) -> T:
        """``fn()`` until it answers, backing off 0.2 s -> 10 s while the server is unreachable."""
        deadline = time.monotonic() + give_up_after_s
        delay = 0.2
        while True:
            try:
                out = fn()
            except Exception as e:
                if not transient(e) or time.monotonic() + delay > deadline or self._closed:
                    if transient(e):
                        self.health.failed(source, e)
                    raise
                self.health.failed(source, e)
                time.sleep(delay)
                delay = min(delay * 2, 10.0)
                continue
            self.health.ok(source)
            return out

    def close(self) -> None:
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
