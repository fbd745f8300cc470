"""Python clients of the scheduler's HTTP API: blocking and asyncio.

:class:`GpupoolClient` (blocking, on :mod:`http.client` through :mod:`gpupool.client.connection`, which
keeps connections alive between requests) serves the CLI, kernels and tests;
:class:`AsyncGpupoolClient` (tornado's AsyncHTTPClient) serves the Jupyter
server, whose event loop must never block. Both expose the same methods, one
per endpoint, defined once in :class:`_Endpoints`: each method builds a request
and hands it to ``_call``, which the blocking client runs at once and the async
client returns as a coroutine.

Errors: a 4xx reply raises the :mod:`gpupool.wire.errors` class for its status (or
the class the server names in ``type``) with the server's message; a refused
or timed-out connection raises :class:`~gpupool.wire.errors.Unavailable` naming
the URL; a 5xx raises :class:`ServerError`. Redirects are never followed (the
token stays with the scheduler's host): a 3xx raises a plain ``GpupoolError``
with its status, from both clients alike.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from gpupool.client.connection import Connections, split_url
from gpupool.wire import errors
from gpupool.wire.errors import GpupoolError, Unavailable

# Every `gpupool` call imports this module, the CLI's included: asyncio and tornado (the async
# client's) are imported where they are used.

DEFAULT_URL = "http://127.0.0.1:8765"
API = "/api/v1"

_ERROR_CLASSES: dict[str, type[GpupoolError]] = {
    cls.__name__: cls
    for cls in vars(errors).values()
    if isinstance(cls, type) and issubclass(cls, GpupoolError)
}


class ServerError(GpupoolError):
    """The scheduler failed with a 5xx (a bug or an overload there, not a mistake here)."""

    status = 500


def _config_file() -> str:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return os.path.join(base, "gpupool", "client.json")


def config_path() -> Path:
    """``$XDG_CONFIG_HOME/gpupool/client.json`` (``~/.config`` when XDG_CONFIG_HOME is unset)."""
    return Path(_config_file())


def on_this_machine(url: str) -> bool:
    """Whether ``url`` reaches a scheduler on this machine (a loopback host: 127.0.0.0/8, ::1, localhost).

    Then the caller's folders are the scheduler's too: the CLI offers the
    folder it runs in as a job's working directory (``submit_dir``).
    """
    rest = url.split("://", 1)[-1].split("/", 1)[0].rsplit("@", 1)[-1]
    host = rest[1:].split("]", 1)[0] if rest.startswith("[") else rest.split(":", 1)[0]
    host = host.lower()
    return host == "localhost" or host == "::1" or host.startswith("127.")


def with_submit_dir(spec: dict[str, Any], url: str) -> dict[str, Any]:
    """``spec`` with ``submit_dir`` (the current folder) when it names no workdir and the scheduler is local.

    A train job submitted from a shell then runs where the user typed the
    command, as they expect; the scheduler checks that the job's account may
    work there. Left out for another machine's scheduler, whose folders are not
    the caller's, and when the current folder is gone.
    """
    if "workdir" in spec or spec.get("kind", "train") != "train" or not on_this_machine(url):
        return spec
    try:
        return {**spec, "submit_dir": os.getcwd()}
    except OSError:
        return spec


def resolve_connection(url: str | None = None, token: str | None = None) -> tuple[str, str | None]:
    """Find the scheduler URL and token.

    In order: the arguments, ``GPUPOOL_URL``/``GPUPOOL_TOKEN`` (with ``GPUPOOL_URL``'s scheduler and no
    token, a Hub-spawned server's ``JUPYTERHUB_API_TOKEN``), the config file
    ``gpupool login`` saves, then the runtime file of a scheduler running here
    (:mod:`gpupool.client.runtime_file`: the one inside JupyterLab, or ``gpupool
    serve``), and last ``http://127.0.0.1:8765``. A runtime file's token is only
    used with its own URL, so a token never goes to a host it was not made for.
    """
    url = url or os.environ.get("GPUPOOL_URL") or None
    token = token or os.environ.get("GPUPOOL_TOKEN") or None
    if token is None and url is not None and url == os.environ.get("GPUPOOL_URL"):
        # In a server JupyterHub spawned, the Hub names the team's scheduler (GPUPOOL_URL) and the server
        # holds its user's Hub token, which that scheduler (gpupool serve --hub) takes as them.
        token = os.environ.get("JUPYTERHUB_API_TOKEN") or None
    if url is None or token is None:
        path = _config_file()
        if os.path.isfile(path):
            try:
                with open(path) as f:
                    data = json.load(f)
            except (OSError, ValueError) as e:
                raise errors.InvalidRequest(f"cannot read the client config {path}: {e}") from e
            if not isinstance(data, dict):
                raise errors.InvalidRequest(f"client config {path} must hold a JSON object with url and token")
            url = url or data.get("url") or None
            token = token or data.get("token") or None
    if url is None or token is None:
        url, token = _from_runtime_file(url, token)
    return (url or DEFAULT_URL).rstrip("/"), token


def _from_runtime_file(url: str | None, token: str | None) -> tuple[str | None, str | None]:
    """Fill what is missing from the newest live scheduler's runtime file (its token only with its URL)."""
    from gpupool.client import runtime_file

    found = runtime_file.newest()
    if found is None:
        return url, token
    found_url = str(found["url"]).rstrip("/")
    if url is not None and url.rstrip("/") != found_url:
        return url, token
    found_token = found.get("token")
    return found_url, token or (str(found_token) if found_token else None)


def error_from_reply(status: int, body: bytes | str | None, url: str) -> GpupoolError:
    """Turn an error reply into the matching exception, keeping the server's message."""
    message = ""
    kind = None
    reply: dict[str, Any] = {}
    try:
        data = json.loads(body or b"")
        if isinstance(data, dict):
            reply = data
            message = str(data.get("error") or "")
            kind = data.get("type")
    except (ValueError, TypeError):  # UnicodeDecodeError is a ValueError
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else (body or "")
        message = text.strip().splitlines()[0][:200] if text.strip() else ""
    if not message:
        message = f"the scheduler at {url} answered HTTP {status}"
    if status >= 500 and status != 503:
        server_error = ServerError(message)
        server_error.status = status
        return server_error
    cls = _ERROR_CLASSES.get(kind) if isinstance(kind, str) else None
    if cls is None or cls.status != status:
        cls = errors.ERRORS_BY_STATUS.get(status, GpupoolError)
    exc = cls(message)
    if cls is GpupoolError:
        exc.status = status
    exc.take_details(reply)
    return exc


def _query(params: Mapping[str, Any]) -> str:
    items = []
    for key, value in params.items():
        if value is None:
            continue
        if isinstance(value, list | tuple | set | frozenset):
            value = ",".join(str(v) for v in value)
        elif isinstance(value, bool):
            value = "1" if value else "0"
        items.append((key, str(value)))
    return ("?" + urllib.parse.urlencode(items)) if items else ""


class _Endpoints:
    """One method per endpoint; ``_call`` does the transport (blocking or async)."""

    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 30) -> None:
        self.url, self.token = resolve_connection(url, token)
        self.timeout = timeout

    def _call(self, method: str, path: str, *, body: Any = None, query: Mapping[str, Any] | None = None,
              raw: bool = False, timeout: float | None = None) -> Any:
        raise NotImplementedError

    def whoami(self) -> Any:
        return self._call("GET", API + "/whoami")

    def status(self) -> Any:
        return self._call("GET", API + "/status")

    def pool(self) -> Any:
        return self._call("GET", API + "/pool")

    def projects(self) -> Any:
        return self._call("GET", API + "/projects")

    def set_project(self, name: str, **fields: Any) -> Any:
        return self._call("PUT", f"{API}/projects/{_seg(name)}", body=fields)

    def delete_project(self, name: str) -> Any:
        return self._call("DELETE", f"{API}/projects/{_seg(name)}")

    def submit(self, spec: Mapping[str, Any]) -> Any:
        return self._call("POST", API + "/jobs", body=dict(spec))

    def jobs(self, **filters: Any) -> Any:
        return self._call("GET", API + "/jobs", query=filters)

    def job(self, job_id: str) -> Any:
        return self._call("GET", f"{API}/jobs/{_seg(job_id)}")

    def pause(self, job_id: str) -> Any:
        return self._call("POST", f"{API}/jobs/{_seg(job_id)}/pause")

    def resume(self, job_id: str) -> Any:
        return self._call("POST", f"{API}/jobs/{_seg(job_id)}/resume")

    def cancel(self, job_id: str) -> Any:
        return self._call("POST", f"{API}/jobs/{_seg(job_id)}/cancel")

    def renew(self, job_id: str) -> Any:
        return self._call("POST", f"{API}/jobs/{_seg(job_id)}/renew")

    def logs(self, job_id: str, offset: int = 0, limit: int | None = None, replica: int | None = None) -> Any:
        """A chunk of the job's log; ``replica``: a multi-node gang's replica K alone."""
        return self._call("GET", f"{API}/jobs/{_seg(job_id)}/logs",
                          query={"offset": offset, "limit": limit, "replica": replica})

    def events(self, since: int = 0, timeout: float = 0) -> Any:
        wait = self._timeout_for(timeout)
        return self._call("GET", API + "/events", query={"since": since, "timeout": timeout or None}, timeout=wait)

    def history(self, since: float | None = None) -> Any:
        return self._call("GET", API + "/history", query={"since": since})

    def report(self, since: float | None = None, by: str | None = None) -> Any:
        """Allocated, used and idle GPU-hours since ``since`` (Unix seconds) per project, user or job."""
        return self._call("GET", API + "/report", query={"since": since, "by": by})

    def report_series(self, since: float | None = None, step: float | None = None, by: str | None = None) -> Any:
        """Mean GPUs allocated, measured and used per bucket of ``step`` seconds since ``since``."""
        return self._call("GET", API + "/report/series", query={"since": since, "step": step, "by": by})

    def create_token(self, user: str) -> Any:
        return self._call("POST", API + "/tokens", body={"user": user})

    def metrics(self) -> Any:
        return self._call("GET", "/metrics", raw=True)

    def openapi(self) -> Any:
        return self._call("GET", API + "/openapi.json")

    def healthz(self) -> Any:
        return self._call("GET", "/healthz")

    def _timeout_for(self, wait: float) -> float | None:
        base = getattr(self, "timeout", None)
        return None if base is None else float(base) + float(wait or 0)

    def _request_parts(self, method: str, path: str, body: Any,
                       query: Mapping[str, Any] | None) -> tuple[str, bytes | None, dict[str, str]]:
        """URL, body bytes and headers of one request, the same for both transports."""
        data = None if body is None else json.dumps(body).encode()
        if method in ("POST", "PUT") and data is None:
            data = b""
        headers = {"Accept": "application/json", "User-Agent": "gpupool-client/1"}
        if self.token:
            headers["Authorization"] = f"token {self.token}"
        if body is not None:
            headers["Content-Type"] = "application/json"
        return self.url + path + _query(query or {}), data, headers

    def __repr__(self) -> str:
        return f"{type(self).__name__}(url={self.url!r})"


def _seg(value: str) -> str:
    return urllib.parse.quote(str(value), safe="")


def _decode(data: bytes, raw: bool) -> Any:
    if raw:
        return data.decode("utf-8", "replace")
    if not data:
        return None
    return json.loads(data)


class GpupoolClient(_Endpoints):
    """Blocking client on :mod:`http.client`; safe to share between threads.

    It keeps its connections to the scheduler open between requests
    (:mod:`gpupool.client.connection`): a script or ``gpupool submit --from``
    that makes thousands of calls pays for one connection, not one each.
    ``close()`` (or ``with GpupoolClient(...) as client:``) closes them; a
    client dropped without it closes them when it is collected.

    No proxies, no redirects followed (the token stays with the scheduler's host):
    any status from 300 up raises.
    """

    _connections: Connections | None = None

    def _call(self, method: str, path: str, *, body: Any = None, query: Mapping[str, Any] | None = None,
              raw: bool = False, timeout: float | None = None) -> Any:
        url, data, headers = self._request_parts(method, path, body, query)
        try:
            target = split_url(url)[3]
            if self._connections is None:
                self._connections = Connections(self.url)
            status, payload = self._connections.request(method, target, data, headers, timeout or self.timeout)
        except ValueError as e:  # a URL that is not http(s)://host[:port]
            raise errors.InvalidRequest(f"bad scheduler URL {self.url!r}: {e}") from None
        except OSError as e:
            reason = "timed out" if isinstance(e, TimeoutError) else (e.strerror or e)
            raise Unavailable(f"cannot reach the scheduler at {self.url}: {reason}") from None
        if status >= 300:
            raise error_from_reply(status, payload, self.url)
        return _decode(payload, raw)

    def close(self) -> None:
        """Close the connections kept open; the next call opens a new one."""
        if self._connections is not None:
            self._connections.close()

    def __enter__(self) -> GpupoolClient:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


MAX_ASYNC_CONNECTIONS = 100

def _async_http() -> Any:
    """This loop's HTTP client for the scheduler, apart from tornado's shared one.

    Long-polls (``events(timeout=...)``) hold a connection for their whole wait;
    on tornado's shared client (10 connections) a few of them would queue every
    other request of the Jupyter server behind them.
    """
    import asyncio

    from tornado.httpclient import AsyncHTTPClient

    loop = asyncio.get_running_loop()
    # Kept on the loop itself: it lives and dies with the loop (a dict keyed by loop would keep both alive).
    client = getattr(loop, "_gpupool_http_client", None) or _OTHER_LOOPS.get(id(loop))
    if client is None:
        client = AsyncHTTPClient(force_instance=True, max_clients=MAX_ASYNC_CONNECTIONS)
        try:
            loop._gpupool_http_client = client  # type: ignore[attr-defined]
        except (AttributeError, TypeError):  # a loop class without attributes (e.g. compiled ones)
            _OTHER_LOOPS[id(loop)] = client
    return client


_OTHER_LOOPS: dict[int, Any] = {}


class AsyncGpupoolClient(_Endpoints):
    """Asyncio client on tornado's AsyncHTTPClient; every method is a coroutine."""

    async def _call(self, method: str, path: str, *, body: Any = None,
                    query: Mapping[str, Any] | None = None, raw: bool = False,
                    timeout: float | None = None) -> Any:
        import asyncio

        from tornado.httpclient import HTTPClientError, HTTPRequest

        url, data, headers = self._request_parts(method, path, body, query)
        request = HTTPRequest(
            url, method=method, body=data, headers=headers, request_timeout=timeout or self.timeout,
            connect_timeout=min(self.timeout, 20), follow_redirects=False,
            allow_nonstandard_methods=True,
        )
        try:
            reply = await _async_http().fetch(request, raise_error=False)
        except HTTPClientError as e:  # 599: timeout, or the connection closed before a reply
            if e.response is not None and e.code < 599:
                raise error_from_reply(e.code, e.response.body, self.url) from None
            raise Unavailable(f"cannot reach the scheduler at {self.url}: {e}") from None
        except (OSError, asyncio.TimeoutError) as e:
            raise Unavailable(f"cannot reach the scheduler at {self.url}: {e}") from None
        if reply.code == 599 or (reply.error is not None and reply.code >= 599):
            raise Unavailable(f"cannot reach the scheduler at {self.url}: {reply.error}")
        # Redirects are not followed (the token must not travel), so a 3xx is an unexpected answer,
        # an error exactly as the blocking client raises it, not an empty success.
        if reply.code >= 300:
            raise error_from_reply(reply.code, reply.body, self.url)
        return _decode(reply.body or b"", raw)
