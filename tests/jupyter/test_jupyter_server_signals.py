"""A real server stopped as JupyterHub stops it gives its kernels' GPU shares back at once.

JupyterHub stops a user's server (Stop My Server, the idle culler, deleting the
user) with SIGINT, then SIGTERM, then SIGKILL. Each test here runs what a Hub
runs: a shared ``gpupool serve``, and a ``jupyter server`` process with the
extension pointed at it by URL and user token, its stdin not a terminal (as
under systemd), holding one GPU kernel. The server is signalled, and the
scheduler, which outlives it, is asked whether the share is still held.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scheduler.client import GpupoolClient
from tests.api.servers import ServeProcess, wait_until

pytestmark = pytest.mark.timeout(240)

TOKEN = "gpupool-signal-test"
RELEASE_S = 5.0  # issue 22: shares released within 5 s of the server stopping by SIGINT or SIGTERM
LEASE_S = 6.0  # the scheduler's lease in the kill -9 case (long enough to hold while the kernel starts)


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _api(port: int, path: str, method: str = "GET", body: dict[str, Any] | None = None) -> tuple[int, Any]:
    """(status, JSON body) of one Jupyter API call."""
    import urllib.error
    import urllib.request

    req = urllib.request.Request(
        f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode() if body is not None else None,
        method=method, headers={"Authorization": f"token {TOKEN}", "Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as reply:
            return reply.status, json.loads(reply.read() or b"null")
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read() or b"null")


def _scheduler(tmp_path: Path, lease_s: float) -> Iterator[tuple[ServeProcess, GpupoolClient, str]]:
    """A shared scheduler (a process of its own), a team project, and a user token for carol."""
    serve = ServeProcess(tmp_path / "sched-state", tmp_path / "sched-home", simulate="2xA100-80GB",
                         settings={"tick_s": 0.3, "lease_s": lease_s, "min_runtime_s": 0}).start()
    try:
        admin = GpupoolClient(serve.url, serve.admin_token)
        admin.set_project("vision", build_quota=1.0, train_guarantee=2)
        yield serve, admin, str(admin.create_token("carol")["token"])
    finally:
        serve.stop()


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[tuple[ServeProcess, GpupoolClient, str]]:
    """The shared scheduler with the default lease of this suite's Hub (long: only a release frees the share)."""
    yield from _scheduler(tmp_path, lease_s=120.0)


@pytest.fixture
def shared_short_lease(tmp_path: Path) -> Iterator[tuple[ServeProcess, GpupoolClient, str]]:
    """The shared scheduler with a lease of LEASE_S."""
    yield from _scheduler(tmp_path, lease_s=LEASE_S)


def start_server(tmp_path: Path, url: str, token: str) -> tuple[subprocess.Popen[bytes], int, Path]:
    """``python -m jupyter_server`` with the extension on the shared scheduler; everything under tmp_path."""
    port = _free_port()
    root, config = tmp_path / "root", tmp_path / "config"
    root.mkdir()
    config.mkdir()
    (config / "jupyter_server_config.json").write_text(json.dumps({
        "ServerApp": {
            "ip": "127.0.0.1", "port": port, "port_retries": 0, "open_browser": False,
            "root_dir": str(root), "allow_root": True,
            "jpserver_extensions": {"jupyter_gpupool": True, "jupyterlab": False, "jupyter_lsp": False,
                                    "notebook_shim": False, "jupyter_server_terminals": False},
        },
        "IdentityProvider": {"token": TOKEN},
        "GPUPool": {"scheduler_url": url, "scheduler_token": token, "project": "vision"},
    }))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_URL", "GPUPOOL_TOKEN", "JUPYTERHUB_"))}
    env.update({"JUPYTER_CONFIG_DIR": str(config), "JUPYTER_DATA_DIR": str(tmp_path / "data"),
                "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime"), "JUPYTER_PLATFORM_DIRS": "1"})
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        # stdin not a terminal, as for a server a Hub started under systemd: Jupyter Server then leaves
        # SIGINT to Python (KeyboardInterrupt), which skipped every shutdown hook
        proc = subprocess.Popen([sys.executable, "-m", "jupyter_server"], cwd=root, env=env, stdout=out,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"jupyter server exited at start:\n{log.read_text()}")
        try:
            if _api(port, "/api/status")[0] == 200:
                return proc, port, log
        except OSError:
            pass
        time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGKILL)
    pytest.fail(f"jupyter server did not start:\n{log.read_text()}")


def running_shares(admin: GpupoolClient) -> list[dict[str, Any]]:
    """carol's GPU-share (build) jobs the scheduler still holds."""
    return [j for j in admin.jobs(user="carol", project="vision")
            if j.get("kind") == "build" and j["state"] in ("queued", "running")]


def start_gpu_kernel(port: int, admin: GpupoolClient, log: Path) -> dict[str, Any]:
    """A quarter-GPU kernel, and its share as the scheduler sees it (running)."""
    status, kernel = _api(port, "/api/kernels", "POST", {"name": "gpupool-python3-0.25"})
    assert status == 201, (kernel, log.read_text())
    (share,) = wait_until(lambda: [j for j in running_shares(admin) if j["state"] == "running"],
                          timeout=30, what="the kernel's share running")
    return dict(share)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stopped_server_gives_its_shares_back_at_once(
    tmp_path: Path, shared: tuple[ServeProcess, GpupoolClient, str], sig: signal.Signals
) -> None:
    serve, admin, token = shared
    proc, port, log = start_server(tmp_path, serve.url, token)
    try:
        share = start_gpu_kernel(port, admin, log)
        proc.send_signal(sig)
        signalled = time.monotonic()
        try:
            wait_until(lambda: not running_shares(admin), timeout=RELEASE_S, interval=0.1,
                       what=f"the share released after {sig.name}")
        except AssertionError:
            pytest.fail(f"share {share['id']} still held {RELEASE_S:g} s after {sig.name} "
                        f"(server {'running' if proc.poll() is None else 'exited'}):\n{log.read_text()[-4000:]}")
        released_after = time.monotonic() - signalled
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the server did not stop on {sig.name}:\n{log.read_text()}")
        ended = admin.job(share["id"])
        assert ended["state"] == "cancelled" and "lease" not in (ended.get("reason") or ""), ended
        text = log.read_text()
        assert "Shutting down 1 kernel" in text, text  # the server's own clean stop ran, kernels included
        print(f"{sig.name}: share released {released_after:.2f} s after the signal")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_a_killed_server_loses_its_shares_when_the_lease_runs_out(
    tmp_path: Path, shared_short_lease: tuple[ServeProcess, GpupoolClient, str]
) -> None:
    serve, admin, token = shared_short_lease
    proc, port, log = start_server(tmp_path, serve.url, token)
    try:
        share = start_gpu_kernel(port, admin, log)
        os.killpg(proc.pid, signal.SIGKILL)  # the server and its kernel: nothing of it can say goodbye
        proc.wait()
        wait_until(lambda: not running_shares(admin), timeout=LEASE_S + RELEASE_S, interval=0.2,
                   what="the share released by its lease")
        ended = admin.job(share["id"])
        assert ended["state"] == "cancelled" and "lease expired" in ended["reason"], ended
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
