"""A real ``jupyter server`` process with the gpupool extension, as a user or a Hub starts one.

In-process server fixtures cannot show what happens when the server process
itself starts, is signalled or dies; these tests need the real process. Every
file it writes (config, data, runtime, the notebook root and its log) stays
under the test's temporary folder, and its stdin is not a terminal, as for a
server a Hub started under systemd.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

TOKEN = "gpupool-server-process-test"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def api(port: int, path: str, method: str = "GET", body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """(status, JSON body) of one Jupyter API call; HTTP errors are answers too."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode() if body is not None else None,
        method=method, headers={"Authorization": f"token {TOKEN}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as reply:
            return reply.status, json.loads(reply.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


@dataclass
class ServerProcess:
    """The running server: its process (a session of its own), port, log file and runtime folder."""

    proc: subprocess.Popen[bytes]
    port: int
    log: Path
    runtime: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL to the server and everything it started (its kernels), if still there."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM, then SIGKILL after ``timeout``: what a test's clean-up does whatever happened before."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()


def start_server(tmp_path: Path, gpupool: dict[str, Any], ready: str | None = None) -> ServerProcess:
    """``python -m jupyter_server`` with only our extension, configured by ``gpupool`` (c.GPUPool).

    Ready when its API answers and, if ``ready`` is given, that text is in its
    log. Fails the test, with the log, if it exits or is not ready in 90 s.
    """
    port = free_port()
    root, config = tmp_path / "root", tmp_path / "config"
    root.mkdir()
    config.mkdir()
    (config / "jupyter_server_config.json").write_text(json.dumps({
        "ServerApp": {
            "ip": "127.0.0.1", "port": port, "port_retries": 0, "open_browser": False,
            "root_dir": str(root), "allow_root": True,
            # only our extension: these tests are about the server's own start and stop, and this keeps it short
            "jpserver_extensions": {"jupyter_gpupool": True, "jupyterlab": False, "jupyter_lsp": False,
                                    "notebook_shim": False, "jupyter_server_terminals": False},
        },
        "IdentityProvider": {"token": TOKEN},
        "GPUPool": gpupool,
    }))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_URL", "GPUPOOL_TOKEN", "JUPYTERHUB_"))}
    env.update({"JUPYTER_CONFIG_DIR": str(config), "JUPYTER_DATA_DIR": str(tmp_path / "data"),
                "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "JUPYTER_PLATFORM_DIRS": "1"})
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "jupyter_server"], cwd=root, env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    server = ServerProcess(proc, port, log, tmp_path / "runtime")
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"jupyter server exited at start:\n{server.text()}")
        try:
            if api(port, "/api/status")[0] == 200 and (ready is None or ready in server.text()):
                return server
        except OSError:
            pass
        time.sleep(0.3)
    server.kill()
    pytest.fail(f"jupyter server did not start:\n{server.text()}")
