"""Test helpers: run an API server in a background thread, or `gpupool serve` as a process.

A thread with its own event loop lets blocking code (the sync client, the CLI's
main(), schemathesis's requests) talk to a real tornado server on loopback.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from gpupool.api.app import make_app

ROOT = Path(__file__).resolve().parents[2]


class LoopThread:
    """An asyncio loop in a daemon thread; ``run(coro)`` executes a coroutine there and returns its result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 60) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def call(self, fn: Callable[[], Any], timeout: float = 60) -> Any:
        async def wrapper() -> Any:
            return fn()

        return self.run(wrapper(), timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()


class AppServer:
    """make_app(core) on a free loopback port, served from a LoopThread."""

    def __init__(self, core: Any) -> None:
        self.core = core
        self.loops = LoopThread()

        async def start() -> tuple[HTTPServer, Any, int]:
            app = make_app(core)
            sockets = bind_sockets(0, "127.0.0.1")
            server = HTTPServer(app, max_body_size=4 * 2**20)
            server.add_sockets(sockets)
            return server, app, sockets[0].getsockname()[1]

        self.server, self.app, port = self.loops.run(start())
        self.url = f"http://127.0.0.1:{port}"

    def close(self) -> None:
        async def stop() -> None:
            self.server.stop()
            self.app.settings["shutdown_event"].set()
            await asyncio.wait_for(self.server.close_all_connections(), 5)

        self.loops.run(stop())
        self.loops.close()


class EmbeddedThread:
    """An EmbeddedScheduler (real core + API) served from a LoopThread."""

    def __init__(self, state_dir: Path, **kwargs: Any) -> None:
        from gpupool.app.embedded import EmbeddedScheduler

        self.loops = LoopThread()
        self.scheduler = EmbeddedScheduler(state_dir, **kwargs)
        self.loops.run(self.scheduler.start())
        self.url = self.scheduler.url
        self.admin_token = self.scheduler.admin_token
        self.core = self.scheduler.core

    def close(self) -> None:
        try:
            self.loops.run(self.scheduler.stop())
        finally:
            self.loops.close()


def http(method: str, url: str, token: str | None = None, body: Any = None, raw_body: bytes | None = None,
         headers: dict[str, str] | None = None, timeout: float = 30) -> tuple[int, Any]:
    """One raw HTTP request; returns (status, parsed JSON or text). Never raises on HTTP errors."""
    data = raw_body if raw_body is not None else (None if body is None else json.dumps(body).encode())
    if method in ("POST", "PUT") and data is None:
        data = b""
    all_headers = dict(headers or {})
    if token is not None:
        all_headers["Authorization"] = f"token {token}"
    request = urllib.request.Request(url, data=data, method=method, headers=all_headers)
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    try:
        with opener.open(request, timeout=timeout) as reply:
            status, payload, ctype = reply.status, reply.read(), reply.headers.get("Content-Type", "")
    except urllib.error.HTTPError as e:
        status, payload, ctype = e.code, e.read(), e.headers.get("Content-Type", "")
    if "json" in ctype and payload:
        return status, json.loads(payload)
    return status, payload.decode("utf-8", "replace")


def wait_until(predicate: Callable[[], Any], timeout: float = 30, interval: float = 0.05, what: str = "") -> Any:
    """Poll ``predicate`` until it returns something truthy; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(interval)


def cli_env(url: str, token: str | None, home: Path) -> dict[str, str]:
    """Environment for a CLI subprocess: this checkout first on PYTHONPATH, no user config."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_") or k == "GPUPOOL_RUN_JOBS_AS"}
    env.update({"GPUPOOL_URL": url, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config"),
                "PYTHONPATH": str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")})
    if token:
        env["GPUPOOL_TOKEN"] = token
    return env


def gpupool(args: list[str], env: dict[str, str], timeout: float = 60,
            input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run the CLI as a real process (``python -m gpupool``)."""
    return subprocess.run([sys.executable, "-m", "gpupool", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, input=input_text)


class ServeProcess:
    """`gpupool serve` as a child process on a free port, with a settings file and a known admin token."""

    def __init__(self, state_dir: Path, home: Path, simulate: str = "4xA100-80GB",
                 settings: dict[str, Any] | None = None, admin_token: str = "admin-secret",
                 extra_env: dict[str, str] | None = None) -> None:
        self.state_dir = state_dir
        self.home = home
        self.admin_token = admin_token
        self.config = state_dir.parent / f"{state_dir.name}-settings.json"
        self.config.write_text(json.dumps(settings or {}))
        self.simulate = simulate
        self.extra_env = dict(extra_env or {})
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.banner: list[str] = []

    def start(self, port: int = 0) -> ServeProcess:
        env = cli_env("", None, self.home)
        env["GPUPOOL_ADMIN_TOKEN"] = self.admin_token
        env.update(self.extra_env)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpupool", "serve", "--state-dir", str(self.state_dir), "--port", str(port),
             "--simulate", self.simulate, "--config", str(self.config), "--log-level", "WARNING"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        )
        deadline = time.monotonic() + 60
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                err = self.proc.stderr.read() if self.proc.stderr else ""
                raise AssertionError(f"gpupool serve exited early ({self.proc.wait()}): {err[-2000:]}")
            self.banner.append(line.rstrip("\n"))
            if "listening on " in line:
                self.url = line.split("listening on ", 1)[1].split()[0]
            if line.startswith("admin token:"):
                break
        assert self.url, f"no URL in the banner: {self.banner}"
        threading.Thread(target=self._drain, daemon=True).start()
        return self

    def _drain(self) -> None:
        proc = self.proc
        if proc is not None and proc.stdout is not None:
            for _ in proc.stdout:
                pass

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def env(self, token: str | None = None) -> dict[str, str]:
        return cli_env(self.url, token if token is not None else self.admin_token, self.home)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(30)

    def stop(self) -> int | None:
        """SIGTERM and wait; returns the exit status (None if it was already gone)."""
        if self.proc is None or self.proc.poll() is not None:
            return None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(10)
