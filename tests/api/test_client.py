"""The Python clients: connection settings, every method's route, and error mapping."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from gpupool.client import (
    AsyncGpupoolClient,
    GpupoolClient,
    ServerError,
    error_from_reply,
    resolve_connection,
)
from gpupool.wire import errors

from .fake_core import ADMIN_TOKEN, FakeCore
from .servers import AppServer


@pytest.fixture(scope="module")
def server():
    srv = AppServer(FakeCore())
    yield srv
    srv.close()


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for key in ("GPUPOOL_URL", "GPUPOOL_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    monkeypatch.setenv("GPUPOOL_RUNTIME_DIR", str(tmp_path / "runtime"))  # no scheduler of the real user
    return tmp_path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_connection_from_arguments_env_then_config(clean_env, monkeypatch):
    assert resolve_connection() == ("http://127.0.0.1:8765", None)
    config = clean_env / "xdg" / "gpupool" / "client.json"
    config.parent.mkdir(parents=True)
    config.write_text(json.dumps({"url": "http://cfg:1/", "token": "cfg-token"}))
    assert resolve_connection() == ("http://cfg:1", "cfg-token")
    monkeypatch.setenv("GPUPOOL_URL", "http://env:2")
    assert resolve_connection() == ("http://env:2", "cfg-token")
    monkeypatch.setenv("GPUPOOL_TOKEN", "env-token")
    assert resolve_connection("http://arg:3", "arg-token") == ("http://arg:3", "arg-token")
    assert resolve_connection() == ("http://env:2", "env-token")


def test_config_under_home_when_xdg_unset(clean_env, monkeypatch):
    monkeypatch.delenv("XDG_CONFIG_HOME")
    config = clean_env / "home" / ".config" / "gpupool" / "client.json"
    config.parent.mkdir(parents=True)
    config.write_text(json.dumps({"url": "http://home:4", "token": "t"}))
    assert resolve_connection() == ("http://home:4", "t")


def test_broken_config_file_is_a_clear_error(clean_env):
    config = clean_env / "xdg" / "gpupool" / "client.json"
    config.parent.mkdir(parents=True)
    config.write_text("{not json")
    with pytest.raises(errors.InvalidRequest, match="client config"):
        resolve_connection()


def test_sync_client_methods_against_api(server):
    admin = GpupoolClient(server.url, ADMIN_TOKEN)
    alice = GpupoolClient(server.url, "alice-token")
    assert alice.whoami() == {"user": "alice", "admin": False}
    assert alice.status()["simulated"] is True
    assert alice.pool()["nodes"][0]["gpus"][0]["model"] == "A100-80GB"
    assert admin.set_project("nlp", train_guarantee=2, train_limit=None)["train_guarantee"] == 2
    assert {p["name"] for p in alice.projects()} >= {"vision", "nlp"}
    job = alice.submit({"project": "vision", "command": ["echo", "hi"]})
    assert job["user"] == "alice" and job["state"] == "queued"
    assert alice.job(job["id"])["id"] == job["id"]
    assert job["id"] in [j["id"] for j in alice.jobs(project="vision", state=["queued", "running"], limit=5)]
    assert alice.logs(job["id"]) == {"data": "hello\n", "offset": 6, "eof": True}
    assert alice.logs(job["id"], offset=2, limit=2)["data"] == "ll"
    events = alice.events(since=0)
    assert any(e["job_id"] == job["id"] for e in events["events"]) and events["last"] >= 1
    assert alice.history() == {"samples": []}
    assert "gpupool_fake_submitted_total" in alice.metrics()
    assert alice.cancel(job["id"])["state"] == "cancelled"
    assert admin.create_token("dave")["user"] == "dave"
    assert admin.delete_project("nlp") is None
    assert alice.openapi()["openapi"].startswith("3.")


def test_sync_client_maps_4xx_to_error_classes(server):
    alice = GpupoolClient(server.url, "alice-token")
    bob = GpupoolClient(server.url, "bob-token")
    job = alice.submit({"project": "vision", "command": ["true"]})
    with pytest.raises(errors.NotFound, match="no job 'j-999999'"):
        alice.job("j-999999")
    with pytest.raises(errors.Forbidden, match="belongs to alice"):
        bob.cancel(job["id"])
    with pytest.raises(errors.Conflict, match="is not running"):
        alice.pause(job["id"])
    with pytest.raises(errors.QuotaExceeded, match="over its build quota"):
        alice.submit({"project": "vision", "kind": "build", "gpu_fraction": 0.95})
    with pytest.raises(errors.InvalidRequest, match="unknown project 'nope'"):
        alice.submit({"project": "nope", "command": ["true"]})
    with pytest.raises(errors.InvalidRequest, match="gpu_fraction"):
        alice.submit({"project": "vision", "command": ["true"], "gpu_fraction": 1.5})
    with pytest.raises(errors.Unauthorized, match="invalid token"):
        GpupoolClient(server.url, "nope").status()
    with pytest.raises(errors.Unauthorized, match="missing token"):
        GpupoolClient(server.url, None).status()


def test_sync_client_unreachable_names_the_url(clean_env):
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(errors.Unavailable, match=f"cannot reach the scheduler at {url}"):
        GpupoolClient(url, "t", timeout=5).status()


async def test_async_client_same_methods_and_errors(server):
    alice = AsyncGpupoolClient(server.url, "alice-token")
    assert (await alice.whoami())["user"] == "alice"
    job = await alice.submit({"project": "vision", "command": ["true"]})
    assert (await alice.job(job["id"]))["id"] == job["id"]
    with pytest.raises(errors.NotFound):
        await alice.job("j-999999")
    with pytest.raises(errors.Forbidden):
        await AsyncGpupoolClient(server.url, "bob-token").cancel(job["id"])
    assert "gpupool_fake" in await alice.metrics()
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(errors.Unavailable, match=url):
        await AsyncGpupoolClient(url, "t", timeout=5).status()


def test_error_from_reply_shapes():
    assert isinstance(error_from_reply(404, b'{"error": "gone", "status": 404}', "u"), errors.NotFound)
    e = error_from_reply(418, b'{"error": "teapot", "status": 418}', "u")
    assert type(e) is errors.GpupoolError and e.status == 418 and e.message == "teapot"
    assert isinstance(error_from_reply(500, b"<html>oops</html>", "u"), ServerError)
    assert isinstance(error_from_reply(503, b"", "u"), errors.Unavailable)
    # A server naming a class that does not fit the status does not fool the client.
    assert type(error_from_reply(400, b'{"error": "x", "status": 400, "type": "Forbidden"}', "u")) is \
        errors.InvalidRequest
    assert "answered HTTP 400" in error_from_reply(400, b"", "http://s").message


class ClosingServer:
    """Accepts connections and closes them without a reply (a scheduler dying mid-request)."""

    def __init__(self) -> None:
        import threading

        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.recv(65536)
            conn.close()

    def close(self) -> None:
        self.sock.close()


async def test_connection_dropped_mid_request_is_unavailable_for_both_clients():
    server = ClosingServer()
    try:
        with pytest.raises(errors.Unavailable, match=server.url):
            GpupoolClient(server.url, "t", timeout=5).status()
        with pytest.raises(errors.Unavailable, match=server.url):
            await AsyncGpupoolClient(server.url, "t", timeout=5).status()
    finally:
        server.close()


async def test_async_long_polls_do_not_block_other_requests(server):
    """Twenty waiting long-polls (more than tornado's shared client allows) and a plain call still answers."""
    alice = AsyncGpupoolClient(server.url, "alice-token")
    last = (await alice.events(since=0))["last"]
    polls = [asyncio.ensure_future(alice.events(since=last + 1000, timeout=3)) for _ in range(20)]
    await asyncio.sleep(0.2)
    assert (await asyncio.wait_for(alice.whoami(), 2))["user"] == "alice"
    assert not any(p.done() for p in polls)  # still waiting: the whoami did not queue behind them
    for p in polls:
        p.cancel()
    await asyncio.gather(*polls, return_exceptions=True)


async def test_redirects_are_not_followed_so_the_token_stays_home():
    """Neither client follows a 302 to another host, so that host never sees the token."""
    import http.server
    import threading

    seen: list[str | None] = []

    class Elsewhere(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append(self.headers.get("Authorization"))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: object) -> None:
            pass

    other = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Elsewhere)

    class Redirecting(Elsewhere):
        def do_GET(self) -> None:
            self.send_response(302)
            self.send_header("Location", f"http://127.0.0.1:{other.server_address[1]}{self.path}")
            self.send_header("Content-Length", "0")
            self.end_headers()

    home = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirecting)
    for srv in (other, home):
        threading.Thread(target=srv.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{home.server_address[1]}"
    try:
        with pytest.raises(errors.GpupoolError):
            GpupoolClient(url, "secret", timeout=5).status()
        with pytest.raises(errors.GpupoolError):  # not followed: an error, as for the blocking client
            await AsyncGpupoolClient(url, "secret", timeout=5).status()
        assert seen == []
    finally:
        for srv in (other, home):
            srv.shutdown()
            srv.server_close()


@pytest.mark.parametrize("code", [301, 302, 303, 307, 308])
async def test_both_clients_refuse_an_unexpected_redirect_alike(code):
    """A 3xx is no success for either client: the same error class and message, and it is not followed."""
    import tornado.web
    from tornado.httpserver import HTTPServer
    from tornado.netutil import bind_sockets

    followed: list[str] = []

    class Moved(tornado.web.RequestHandler):
        def get(self) -> None:
            self.redirect("/elsewhere", status=code)

        def post(self) -> None:
            self.redirect("/elsewhere", status=code)

    class Elsewhere(tornado.web.RequestHandler):
        def get(self) -> None:
            followed.append(self.request.method)
            self.write({"user": "someone else"})

        post = get

    sockets = bind_sockets(0, "127.0.0.1")
    server = HTTPServer(tornado.web.Application([(r"/elsewhere", Elsewhere), (r"/.*", Moved)]))
    server.add_sockets(sockets)
    url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
    try:
        with pytest.raises(errors.GpupoolError) as sync_error:
            await asyncio.to_thread(GpupoolClient(url, "t", timeout=5).whoami)
        with pytest.raises(errors.GpupoolError) as async_error:
            await AsyncGpupoolClient(url, "t", timeout=5).whoami()
        with pytest.raises(errors.GpupoolError) as async_post_error:
            await AsyncGpupoolClient(url, "t", timeout=5).cancel("j-000001")
    finally:
        server.stop()
        await server.close_all_connections()
    assert type(async_error.value) is type(sync_error.value) is type(async_post_error.value)
    assert async_error.value.status == sync_error.value.status == code
    assert async_error.value.message == sync_error.value.message == f"the scheduler at {url} answered HTTP {code}"
    assert followed == []


@pytest.mark.parametrize("framing", ["chunked", "close", "length"])
def test_sync_client_reads_every_reply_framing(framing):
    """The blocking client's own HTTP/1.1 reader: chunked replies (tornado flushes), replies ended by the close,
    and Content-Length, each in small pieces, as a proxy in front of the scheduler might send them."""
    import threading
    import time

    body = json.dumps({"user": "alice", "admin": False, "pad": "x" * 5000}).encode()
    if framing == "chunked":
        pieces = [b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nContent-Type: application/json\r\n\r\n"]
        for i in range(0, len(body), 1000):
            part = body[i:i + 1000]
            pieces.append(f"{len(part):x};ext=1\r\n".encode() + part + b"\r\n")
        pieces.append(b"0\r\nX-Trailer: y\r\n\r\n")
    elif framing == "close":
        pieces = [b"HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n", body[:10], body[10:]]
    else:
        pieces = [b"HTTP/1.1 200 OK\r\n", f"Content-Length: {len(body)}\r\n\r\n".encode(), body[:7], body[7:]]
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    requests: list[bytes] = []

    def serve() -> None:
        conn, _ = listener.accept()
        with conn:
            requests.append(conn.recv(65536))
            for piece in pieces:
                conn.sendall(piece)
                time.sleep(0.01)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        me = GpupoolClient(f"http://127.0.0.1:{listener.getsockname()[1]}", "tok", timeout=5).whoami()
    finally:
        thread.join(5)
        listener.close()
    assert me["user"] == "alice" and len(me["pad"]) == 5000
    head = requests[0].decode()
    assert head.startswith("GET /api/v1/whoami HTTP/1.1\r\n") and "Authorization: token tok\r\n" in head


def test_sync_client_refuses_a_bad_url(clean_env):
    with pytest.raises(errors.InvalidRequest, match="bad scheduler URL"):
        GpupoolClient("ftp://example.org", "t").status()


def test_sync_client_keeps_its_connection_and_reopens_one_the_server_closed():
    """Requests go over one kept connection; one the server closed while idle is replaced, the request not lost."""
    import threading

    body = b'{"user": "alice", "admin": false}'
    reply = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    served: list[int] = []  # requests answered on each accepted connection

    def serve() -> None:
        for keep in (3, 1):  # the first connection answers three requests, then the server closes it
            conn, _ = listener.accept()
            with conn:
                served.append(0)
                for _ in range(keep):
                    if not conn.recv(65536):
                        break
                    conn.sendall(reply)
                    served[-1] += 1

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        with GpupoolClient(f"http://127.0.0.1:{listener.getsockname()[1]}", "tok", timeout=5) as client:
            assert [client.whoami()["user"] for _ in range(3)] == ["alice"] * 3
            import time

            time.sleep(0.1)  # the server has closed the kept connection by now
            assert client.whoami()["user"] == "alice"
    finally:
        thread.join(5)
        listener.close()
    assert served == [3, 1]


def test_sync_client_is_shared_between_threads(server):
    """Each request has a connection of its own while it runs: threads sharing a client never mix replies."""
    from concurrent.futures import ThreadPoolExecutor

    alice = GpupoolClient(server.url, "alice-token")
    admin = GpupoolClient(server.url, ADMIN_TOKEN)
    with ThreadPoolExecutor(8) as pool:
        users = list(pool.map(lambda i: (alice if i % 2 else admin).whoami()["user"], range(64)))
    assert users == ["admin" if i % 2 == 0 else "alice" for i in range(64)]
    alice.close()
    assert alice.whoami()["user"] == "alice"  # a closed client opens a new connection
