"""A real ``jupyter server`` process with the extension stops on one SIGTERM, refused GPU kernels or not.

In-process server fixtures cannot show this: the hang was in the server's own
stop sequence (``ServerApp._stop`` -> ``cleanup_kernels``), so the test runs
the server as a user does and signals it once.
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
from pathlib import Path
from typing import Any

import pytest
from jupyter_client import BlockingKernelClient

pytestmark = pytest.mark.timeout(180)

TOKEN = "gpupool-stop-test"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def request(port: int, path: str, method: str = "GET", body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """(status, JSON body) of one API call; HTTP errors are answers too."""
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=data, method=method,
        headers={"Authorization": f"token {TOKEN}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as reply:
            return reply.status, json.loads(reply.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def start_server(tmp_path: Path, port: int) -> tuple[subprocess.Popen[bytes], Path]:
    """``python -m jupyter_server`` with the extension on simulated GPUs, everything under tmp_path."""
    root, config = tmp_path / "root", tmp_path / "config"
    root.mkdir()
    config.mkdir()
    (config / "jupyter_server_config.json").write_text(json.dumps({
        "ServerApp": {
            "ip": "127.0.0.1", "port": port, "port_retries": 0, "open_browser": False,
            "root_dir": str(root), "allow_root": True,
            # only our extension: the test is about the server's own stop, and this keeps start-up short
            "jpserver_extensions": {"jupyter_gpupool": True, "jupyterlab": False, "jupyter_lsp": False,
                                    "notebook_shim": False, "jupyter_server_terminals": False},
        },
        "IdentityProvider": {"token": TOKEN},
        "GPUPool": {"simulate": "4xA100-80GB", "build_quota": 1.0, "lease_seconds": 60.0,
                    "scheduler_config": {"tick_s": 0.3}},
    }))
    env = {**os.environ, "JUPYTER_CONFIG_DIR": str(config), "JUPYTER_DATA_DIR": str(tmp_path / "data"),
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "JUPYTER_PLATFORM_DIRS": "1"}
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "jupyter_server"], cwd=root, env=env, stdout=out,
                                stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"jupyter server exited at start:\n{log.read_text()}")
        try:
            if request(port, "/api/status")[0] == 200:
                return proc, log
        except OSError:
            pass
        time.sleep(0.3)
    proc.kill()
    pytest.fail(f"jupyter server did not start:\n{log.read_text()}")


def test_server_with_a_refused_gpu_kernel_stops_on_one_sigterm(tmp_path: Path) -> None:
    port = free_port()
    proc, log = start_server(tmp_path, port)
    try:
        status, kernel = request(port, "/api/kernels", "POST", {"name": "gpupool-python3-0.25"})
        assert status == 201, kernel
        # as in Lab: the GPU kernel is up and answering when the user asks for more
        client = BlockingKernelClient(connection_file=str(tmp_path / "runtime" / f"kernel-{kernel['id']}.json"))
        client.load_connection_file()
        client.start_channels()
        try:
            client.wait_for_ready(timeout=60)
        finally:
            client.stop_channels()
        status, refused = request(port, "/api/kernels", "POST", {"name": "gpupool-python3-1"})
        assert status == 409 and "build quota" in refused["message"]
        status, kernels = request(port, "/api/kernels")
        assert [k["id"] for k in kernels] == [kernel["id"]]

        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)  # a kernel shutdown takes a second or two; a hang never ends
        except subprocess.TimeoutExpired:
            pytest.fail(f"the server did not stop on SIGTERM:\n{log.read_text()}")
        text = log.read_text()
        assert "Kernel does not exist" not in text, text
        assert "Shutting down 1 kernel" in text
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # the server and the kernels it started
            proc.wait()
