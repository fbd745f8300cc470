"""The blocking API calls, off the asyncio loop: a few worker threads, transient failures retried with backoff.

The official client is synchronous; the core's loop must never wait on the
network. Starts, stops and cleanups go to these threads; their results come
back as futures (awaited with ``asyncio.wrap_future`` where the core waits).
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import quote

from kubernetes.client.rest import ApiException

from gpupool.backends.kubernetes.health import Health

T = TypeVar("T")

START_GIVE_UP_S = 30.0  # an API server away longer than this at a start: the job goes back to the queue
STOP_WAIT_AFTER_GRACE_S = 60.0  # how long a stop task keeps watching past the grace (the monitor settles later)

WORKERS = 12
"""Threads (and so connections) for API calls: creates and binds of pods, deletes, log reads."""


def transient(e: BaseException) -> bool:
    """Worth retrying: the server did not answer, or answered 429/5xx. A 4xx is an answer."""
    if isinstance(e, ApiException):
        return e.status in (0, None, 429) or (isinstance(e.status, int) and e.status >= 500)
    return isinstance(e, (OSError, TimeoutError)) or type(e).__module__.startswith("urllib3")


class Refused(RuntimeError):
    """The API server answered a create with a refusal (admission: a ResourceQuota, PodSecurity, a webhook).

    Its text is the server's own: the Status body's message and reason. A
    refusal is an answer, not an outage: retrying at once meets the same rule.
    """


WEBHOOK_FAILED = "failed calling webhook"
"""In a 500's message: an admission webhook with ``failurePolicy: Fail`` did not answer, so the API server
refused the create (Kubernetes' ``ErrCallingWebhook``); the API server itself answered."""


def refusal(e: BaseException) -> str | None:
    """The API server's words when ``e`` is a refusal of a create, else None.

    A 4xx answer other than 409 (the name is taken: an earlier pod of the
    same name still being deleted) and 429 (throttling, retried): its Status
    body's ``message`` and ``reason`` ("pods \"x\" is forbidden: exceeded
    quota: ... (Forbidden)"), or the bare HTTP status when there is no body.
    Also a 500 saying an admission webhook could not be called: the policy
    engine is away, not the API server, and it refuses every pod it covers
    until it is back; retried at once like an outage, the job would show
    "running" with its GPUs held and no pod.
    """
    if not isinstance(e, ApiException) or not isinstance(e.status, int):
        return None
    try:
        body = json.loads(e.body) if e.body else {}
    except (TypeError, ValueError):
        body = {}
    message = str(body.get("message") or "").strip() if isinstance(body, dict) else ""
    reason = str(body.get("reason") or e.reason or "").strip() if isinstance(body, dict) else str(e.reason or "")
    webhook_failed = e.status == 500 and WEBHOOK_FAILED in message
    if not webhook_failed and (not 400 <= e.status <= 499 or e.status in (409, 429)):
        return None
    if not message:
        return f"HTTP {e.status} {reason}".strip()
    return f"{message} ({reason})" if reason else message


class StartBackoff:
    """Starts that failed in a row make the next one wait: 0.2 s, doubling to 30 s.

    A start the cluster refused is requeued and tried again at the next cycle;
    without a wait, a setup that always refuses (a node that refuses binds,
    missing RBAC) would churn the API server with creates and deletes. Shared
    by the executors' worker threads, hence the lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streak = 0  # starts failed in a row

    def run(self, start: Callable[[], object], counts: Callable[[BaseException], bool] = lambda e: True) -> None:
        """Wait as the streak says, then ``start()``: a failure that ``counts`` lengthens the streak, a success
        ends it (a failure that does not count leaves it as it was)."""
        with self._lock:
            streak = self._streak
        if streak:
            time.sleep(min(0.1 * 2 ** streak, 30.0))
        try:
            start()
        except BaseException as e:
            if counts(e):
                with self._lock:
                    self._streak += 1
            raise
        with self._lock:
            self._streak = 0


def raw_status(resp: Any) -> int:
    """The HTTP status of a raw reply (``_preload_content=False``), read to its end.

    Its connection goes back to the pool only once the body is read: an
    unread reply strands it, and the next call opens a new TLS connection
    (that handshake cost more than the calls themselves at a few hundred
    binds a second).
    """
    try:
        resp.read()
        return int(resp.status)
    finally:
        resp.release_conn()


def raw_json(resp: Any) -> dict[str, Any]:
    """A raw reply's JSON body as plain dicts (cheaper than the client's model objects); the connection back."""
    try:
        body: dict[str, Any] = json.loads(resp.read())
        return body
    finally:
        resp.release_conn()


def post_json(api: Any, path: str, body: dict[str, Any], timeout_s: float | None = None) -> Any:
    """POST ``body`` (plain JSON) to ``path`` of the API server; the reply raw, for :func:`raw_json`/:func:`raw_status`.

    The same connection pool, TLS and credentials (a service account's token
    refreshed as the client does) as the client's own methods, without their
    per-call work: the generated methods check every argument with pydantic
    and re-serialise the body, a quarter of each create+bind's CPU at several
    hundred pods a second. A non-2xx answer raises the client's own
    ``ApiException`` (status, reason, body), as those methods do.
    """
    ac = api.api_client
    headers = {**ac.default_headers, "Accept": "application/json", "Content-Type": "application/json"}
    if ac.cookie:
        headers["Cookie"] = ac.cookie
    ac.update_params_for_auth(headers, [], ["BearerToken"], path, "POST", body)
    resp = ac.rest_client.request("POST", ac.configuration.host + path, headers=headers, body=body,
                                  _request_timeout=timeout_s)
    if not 200 <= resp.status <= 299:
        try:
            resp.read()
        finally:
            resp.response.release_conn()
        raise ApiException.from_response(http_resp=resp, body=None, data=None)
    return resp.response


def pods_path(namespace: str, name: str | None = None, sub: str | None = None) -> str:
    """``/api/v1/namespaces/<ns>/pods[/<name>[/<sub>]]``, each part escaped."""
    path = f"/api/v1/namespaces/{quote(namespace, safe='')}/pods"
    if name is not None:
        path += f"/{quote(name, safe='')}"
    if sub is not None:
        path += f"/{sub}"
    return path


def bind_pod(api: Any, namespace: str, name: str, node: str, uid: str | None = None,
             annotations: dict[str, str] | None = None) -> int:
    """Bind a pod to ``node`` through ``pods/binding``; the HTTP status (non-2xx raises ``ApiException``).

    Plain JSON with its reply read to the end (:func:`raw_status`), so the
    connection goes back to the pool; ``uid`` makes the API server refuse a
    recreated pod of the same name; ``annotations`` are copied onto the pod by
    the API server as it binds it (a kubectl pod's GPU environment).
    """
    meta: dict[str, Any] = {"name": name}
    if uid:
        meta["uid"] = uid
    if annotations:
        meta["annotations"] = annotations
    body = {"apiVersion": "v1", "kind": "Binding", "metadata": meta,
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    return raw_status(post_json(api, pods_path(namespace, name, "binding"), body))


class Calls:
    """Worker threads for API calls, reporting to ``health``."""

    def __init__(self, health: Health, workers: int = WORKERS) -> None:
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
