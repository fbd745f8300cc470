"""One blocking HTTP/1.1 request, for the blocking client and so for every `gpupool` call.

Why not urllib or http.client: importing them pulls in ``email`` (header
parsing) and ``ssl``, about 20 ms of a CLI call's start, more than the call
itself takes; with 8 calls at once on 2 cores that cost is what limited
scripted submission. The scheduler's API is plain JSON over HTTP/1.1 on a
known host, so a request here is a socket, one write, and a reply read to its
``Content-Length`` (or chunk by chunk, or to the close). ``https://`` URLs
(a TLS proxy in front of the scheduler) go through :mod:`http.client`, which
needs ``ssl`` anyway.

Like the client's contract: no proxies, redirects are never followed (a 3xx
is handed back like any other status), timeouts apply to each socket
operation. Connection failures raise ``OSError`` (``TimeoutError`` included).
"""

from __future__ import annotations

import _socket

MAX_HEADER = 64 * 1024


class ProtocolError(OSError):
    """The peer's reply is not HTTP we can read (treated as the scheduler being unreachable)."""


def split_url(url: str) -> tuple[str, str, int, str]:
    """``http://host:8765/api/v1/x?y=1`` -> ``("http", "host", 8765, "/api/v1/x?y=1")``."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        raise ValueError(f"not an http:// or https:// URL: {url!r}")
    scheme = scheme.lower()
    netloc, slash, path = rest.partition("/")
    netloc = netloc.rpartition("@")[2]  # user:password@ has no meaning here
    default_port = 443 if scheme == "https" else 80
    if netloc.startswith("["):  # [::1]:8765
        host, _, after = netloc[1:].partition("]")
        port_text = after[1:] if after.startswith(":") else ""
    else:
        host, _, port_text = netloc.partition(":")
    if not host:
        raise ValueError(f"no host in URL {url!r}")
    try:
        port = int(port_text) if port_text else default_port
    except ValueError:
        raise ValueError(f"bad port in URL {url!r}") from None
    return scheme, host, port, "/" + path if slash else "/"


def request(method: str, url: str, body: bytes | None, headers: dict[str, str],
            timeout: float | None) -> tuple[int, bytes]:
    """Send one request; returns (status, body). Raises OSError when there is no HTTP reply."""
    scheme, host, port, target = split_url(url)
    if scheme == "https":
        return _https(method, host, port, target, body, headers, timeout)
    host_header = f"[{host}]" if ":" in host else host
    lines = [f"{method} {target} HTTP/1.1", f"Host: {host_header}:{port}", "Connection: close"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    if body is not None:
        lines.append(f"Content-Length: {len(body)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    # An ASCII host goes as bytes: a str would be IDNA-encoded first, importing three modules to do nothing.
    address = host.encode("ascii") if host.isascii() else host
    sock = _connect(address, port, timeout)
    try:
        sock.sendall(head + body if body else head)
        return _read_reply(sock, method)
    finally:
        sock.close()


def _connect(host: str | bytes, port: int, timeout: float | None) -> _socket.socket:
    """``socket.create_connection`` on the C module itself: ``socket.py`` costs its import of ``enum``.

    Tries each address ``getaddrinfo`` gives (IPv4 and IPv6) in turn; raises the last ``OSError``.
    """
    last: OSError | None = None
    for family, kind, proto, _name, address in _socket.getaddrinfo(host, port, 0, _socket.SOCK_STREAM):
        sock = _socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            sock.connect(address)
            return sock
        except OSError as e:
            sock.close()
            last = e
    raise last or OSError(f"no address for {host!r}")


def _read_reply(sock: _socket.socket, method: str) -> tuple[int, bytes]:
    buffer = b""
    while b"\r\n\r\n" not in buffer:
        chunk = sock.recv(65536)
        if not chunk:
            raise ProtocolError("the connection closed before a complete reply" if buffer else
                                "the connection closed without a reply")
        buffer += chunk
        if len(buffer) > MAX_HEADER and b"\r\n\r\n" not in buffer:
            raise ProtocolError("reply headers too long")
    head, _, rest = buffer.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    parts = status_line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ProtocolError(f"not an HTTP reply: {status_line[:80]!r}")
    status = int(parts[1])
    fields: dict[str, str] = {}
    for line in header_lines:
        name, _, value = line.partition(":")
        fields[name.strip().lower()] = value.strip()
    if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
        return status, b""
    if "chunked" in fields.get("transfer-encoding", "").lower():
        return status, _read_chunked(sock, rest)
    length = fields.get("content-length")
    if length is not None and length.isdigit():
        return status, _read_exactly(sock, rest, int(length))
    return status, _read_to_close(sock, rest)


def _read_exactly(sock: _socket.socket, have: bytes, length: int) -> bytes:
    parts = [have]
    size = len(have)
    while size < length:
        chunk = sock.recv(min(1 << 20, length - size))
        if not chunk:
            raise ProtocolError(f"the reply ended after {size} of {length} bytes")
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts)[:length]


def _read_to_close(sock: _socket.socket, have: bytes) -> bytes:
    parts = [have]
    while chunk := sock.recv(1 << 20):
        parts.append(chunk)
    return b"".join(parts)


def _read_chunked(sock: _socket.socket, have: bytes) -> bytes:
    """Decode ``Transfer-Encoding: chunked`` (tornado uses it for replies flushed before they finish)."""
    buffer = have
    out = []

    def fill(need: int) -> None:
        nonlocal buffer
        while len(buffer) < need:
            chunk = sock.recv(1 << 20)
            if not chunk:
                raise ProtocolError("the chunked reply ended early")
            buffer += chunk

    while True:
        while b"\r\n" not in buffer:
            fill(len(buffer) + 1)
        size_line, _, buffer = buffer.partition(b"\r\n")
        try:
            size = int(size_line.split(b";", 1)[0].strip(), 16)
        except ValueError:
            raise ProtocolError(f"bad chunk size {size_line[:20]!r}") from None
        if size == 0:
            return b"".join(out)  # trailers, if any, are of no use here
        fill(size + 2)
        out.append(buffer[:size])
        buffer = buffer[size + 2:]


def _https(method: str, host: str, port: int, target: str, body: bytes | None, headers: dict[str, str],
           timeout: float | None) -> tuple[int, bytes]:
    import http.client

    connection = http.client.HTTPSConnection(host, port, timeout=timeout)
    try:
        connection.request(method, target, body=body, headers=headers)
        reply = connection.getresponse()
        return reply.status, reply.read()
    except http.client.HTTPException as e:
        raise ProtocolError(f"bad reply: {e}") from None
    finally:
        connection.close()
