"""The blocking client's HTTP: :mod:`http.client`, with idle connections kept for the next request.

Why keep connections: ``gpupool submit --from jobs.jsonl`` sends thousands of
requests from one process; a fresh TCP connection for each (and, behind a TLS
proxy, a fresh handshake) would cost more than the request itself. The
scheduler (tornado) speaks HTTP/1.1 keep-alive, so a finished exchange hands
its connection back to :class:`Connections` and the next request reuses it.

Why a list of idle connections and not one: :class:`gpupool.client.GpupoolClient`
may be shared between threads. A request takes a connection off the list (or
opens one) and gives it back only after its reply was read whole, so no two
requests ever share a connection; ``list.pop`` and ``list.append`` need no lock.

The client's contract holds here: no proxies (http.client uses none), redirects
never followed (a 3xx is handed back like any other status), the timeout
applies to each socket operation, and a failure to connect or read raises
``OSError`` (``TimeoutError`` included); a reply that is not HTTP raises
:class:`ProtocolError`, an ``OSError`` too.
"""

from __future__ import annotations

import http.client

MAX_IDLE = 4
"""Idle connections kept per client: one per thread that used it at once, within reason."""

# A reused connection the server closed while it sat idle fails in one of these ways before any reply byte
# arrived: the request never reached the server's handler, so it is sent once more on a fresh connection.
_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError, ConnectionAbortedError)


class ProtocolError(OSError):
    """The peer's reply is not HTTP we can read (treated as the scheduler being unreachable)."""


def split_url(url: str) -> tuple[str, str, int, str]:
    """``http://host:8765/api/v1/x?y=1`` -> ``("http", "host", 8765, "/api/v1/x?y=1")``; ValueError if not http(s)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        raise ValueError(f"not an http:// or https:// URL: {url!r}")
    scheme = scheme.lower()
    netloc, slash, path = rest.partition("/")
    netloc = netloc.rpartition("@")[2]  # user:password@ has no meaning here
    if netloc.startswith("["):  # [::1]:8765
        host, _, after = netloc[1:].partition("]")
        port_text = after[1:] if after.startswith(":") else ""
    else:
        host, _, port_text = netloc.partition(":")
    if not host:
        raise ValueError(f"no host in URL {url!r}")
    try:
        port = int(port_text) if port_text else (443 if scheme == "https" else 80)
    except ValueError:
        raise ValueError(f"bad port in URL {url!r}") from None
    return scheme, host, port, "/" + path if slash else "/"


class Connections:
    """Keep-alive connections to one scheduler (``base_url``: scheme, host and port; a path is ignored)."""

    def __init__(self, base_url: str) -> None:
        self.scheme, self.host, self.port, _ = split_url(base_url)
        self._idle: list[http.client.HTTPConnection] = []

    def _open(self, timeout: float | None) -> http.client.HTTPConnection:
        kind = http.client.HTTPSConnection if self.scheme == "https" else http.client.HTTPConnection
        return kind(self.host, self.port, timeout=timeout)

    def request(self, method: str, target: str, body: bytes | None, headers: dict[str, str],
                timeout: float | None) -> tuple[int, bytes]:
        """Send one request (``target``: path and query); returns (status, body).

        Raises ``OSError`` when there is no HTTP reply; the connection is then closed, never reused.
        """
        try:
            connection, reused = self._idle.pop(), True
        except IndexError:
            connection, reused = self._open(timeout), False
        try:
            try:
                return self._exchange(connection, method, target, body, headers, timeout)
            except _STALE:
                if not reused:
                    raise
                connection.close()
                connection = self._open(timeout)
                return self._exchange(connection, method, target, body, headers, timeout)
        except http.client.HTTPException as e:
            connection.close()
            raise ProtocolError(f"bad reply: {e}") from None
        except BaseException:
            connection.close()
            raise

    def _exchange(self, connection: http.client.HTTPConnection, method: str, target: str, body: bytes | None,
                  headers: dict[str, str], timeout: float | None) -> tuple[int, bytes]:
        connection.timeout = timeout  # used when it (re)connects
        if connection.sock is not None:
            connection.sock.settimeout(timeout)
        connection.request(method, target, body=body, headers=headers)
        reply = connection.getresponse()
        data = reply.read()
        if reply.will_close or len(self._idle) >= MAX_IDLE:
            connection.close()
        else:
            self._idle.append(connection)
        return reply.status, data

    def close(self) -> None:
        """Close the idle connections (one in use is closed by its request when it ends)."""
        while self._idle:
            try:
                self._idle.pop().close()
            except IndexError:  # another thread took the last one
                return

    def __del__(self) -> None:
        # A client dropped without close(): its sockets are closed here, quietly, rather than one by one
        # by the garbage collector with a ResourceWarning each.
        self.close()
