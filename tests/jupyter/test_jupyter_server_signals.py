"""A real server stopped as JupyterHub stops it gives its kernels' GPU shares back at once.

JupyterHub stops a user's server (Stop My Server, the idle culler, deleting the
user) with SIGINT, then SIGTERM, then SIGKILL. Each test here runs what a Hub
runs: a shared ``gpupool serve``, and a ``jupyter server`` process with the
extension pointed at it by URL and user token, its stdin not a terminal (as
under systemd), holding one GPU kernel. The server is signalled, and the
scheduler, which outlives it, is asked whether the share is still held.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupool.client import GpupoolClient
from tests.api.servers import ServeProcess, wait_until
from tests.jupyter.server_process import ServerProcess, api
from tests.jupyter.server_process import start_server as start_server_process

pytestmark = pytest.mark.timeout(240)

RELEASE_S = 5.0  # issue 22: shares released within 5 s of the server stopping by SIGINT or SIGTERM
LEASE_S = 6.0  # the scheduler's lease in the kill -9 case (long enough to hold while the kernel starts)


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


def start_server(tmp_path: Path, url: str, token: str) -> ServerProcess:
    """The user's server, its extension on the shared scheduler by URL and user token (as a Hub's is)."""
    return start_server_process(tmp_path, {"scheduler_url": url, "scheduler_token": token, "project": "vision"})


def running_shares(admin: GpupoolClient) -> list[dict[str, Any]]:
    """carol's GPU-share (build) jobs the scheduler still holds."""
    return [j for j in admin.jobs(user="carol", project="vision")
            if j.get("kind") == "build" and j["state"] in ("queued", "running")]


def start_gpu_kernel(server: ServerProcess, admin: GpupoolClient) -> dict[str, Any]:
    """A quarter-GPU kernel, and its share as the scheduler sees it (running)."""
    status, kernel = api(server.port, "/api/kernels", "POST", {"name": "gpupool-python3-0.25"})
    assert status == 201, (kernel, server.text())
    (share,) = wait_until(lambda: [j for j in running_shares(admin) if j["state"] == "running"],
                          timeout=30, what="the kernel's share running")
    return dict(share)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_stopped_server_gives_its_shares_back_at_once(
    tmp_path: Path, shared: tuple[ServeProcess, GpupoolClient, str], sig: signal.Signals
) -> None:
    serve, admin, token = shared
    server = start_server(tmp_path, serve.url, token)
    proc, log = server.proc, server.log
    try:
        share = start_gpu_kernel(server, admin)
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
        server.kill()


def test_a_killed_server_loses_its_shares_when_the_lease_runs_out(
    tmp_path: Path, shared_short_lease: tuple[ServeProcess, GpupoolClient, str]
) -> None:
    serve, admin, token = shared_short_lease
    server = start_server(tmp_path, serve.url, token)
    try:
        share = start_gpu_kernel(server, admin)
        server.kill()  # the server and its kernel: nothing of it can say goodbye
        wait_until(lambda: not running_shares(admin), timeout=LEASE_S + RELEASE_S, interval=0.2,
                   what="the share released by its lease")
        ended = admin.job(share["id"])
        assert ended["state"] == "cancelled" and "lease expired" in ended["reason"], ended
    finally:
        server.kill()
