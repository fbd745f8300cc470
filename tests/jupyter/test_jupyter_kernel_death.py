"""A GPU kernel that dies for good gives its share back at once, not when its lease runs out.

Real kernels on the embedded scheduler, killed with SIGKILL. The lease here is
a minute, so a share seen cancelled within a few seconds was given back by the
provisioner, not taken back by the scheduler at lease expiry.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import pytest
from kernel_helpers import kernel_env
from test_jupyter_kernels import start_session, wait_state

from jupyter_gpupool import leases

pytestmark = pytest.mark.timeout(240)

RELEASED_WITHIN_S = 4.0  # seconds from "Jupyter is done with the kernel" to "share cancelled" (lease: 60 s)


@pytest.fixture
def gpupool_config(gpupool_config: dict[str, Any]) -> dict[str, Any]:
    return {**gpupool_config, "lease_seconds": 60.0, "renew_interval": 0.5}


@pytest.fixture
def jp_server_config(jp_server_config: dict[str, Any]) -> dict[str, Any]:
    """Jupyter's auto-restarter, faster: it polls every 0.3 s and gives up after one restart.

    (Its default, five restarts within 10 s, is what the issue hit with six
    kill -9s in 16 s; one restart shows the same give-up sooner.)
    """
    restarter = {"restart_limit": 1, "time_to_dead": 0.3, "stable_start_time": 120.0}
    return {**jp_server_config, "KernelRestarter": restarter}


async def wait_until(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def test_kernel_jupyter_gives_up_on_gives_its_share_back_at_once(
    jp_fetch: Any, jp_serverapp: Any, gpupool_app: Any
) -> None:
    session = await start_session(jp_fetch, "dies.ipynb", "gpupool-python3-0.25")
    kernel_id = session["kernel"]["id"]
    mkm = jp_serverapp.kernel_manager
    km = mkm.get_kernel(kernel_id)
    client = await gpupool_app.connection.client()
    job_id = leases.held()[kernel_id].job_id
    assert (await client.job(job_id))["state"] == "running"

    # killed once: Jupyter restarts the kernel, which keeps its share (same job, same GPU)
    first = km.provisioner.pid
    os.kill(first, signal.SIGKILL)

    async def restarted() -> bool:
        return km.provisioner.has_process and km.provisioner.pid != first and bool(await km.is_alive())

    await wait_until(restarted, 60, "the auto-restart")
    assert (await kernel_env(jp_serverapp, kernel_id))["GPUPOOL_JOB_ID"] == job_id
    assert (await client.job(job_id))["state"] == "running"

    # killed again before it ran stably: past restart_limit, Jupyter gives up and drops the kernel
    os.kill(km.provisioner.pid, signal.SIGKILL)

    async def dropped() -> bool:
        return kernel_id not in mkm

    await wait_until(dropped, 30, "Jupyter to give up on the kernel")
    job = await wait_state(client, job_id, {"cancelled"}, timeout=RELEASED_WITHIN_S)
    assert job["state"] == "cancelled" and "lease" not in (job.get("reason") or "")
    assert kernel_id not in leases.held()
    pool = await client.pool()
    assert all(g["allocated"] == 0 for n in pool["nodes"] for g in n["gpus"])


async def test_killed_kernel_without_auto_restart_gives_its_share_back_at_once(
    jp_fetch: Any, jp_serverapp: Any, gpupool_app: Any
) -> None:
    session = await start_session(jp_fetch, "nb.ipynb", "gpupool-python3-0.25")
    kernel_id = session["kernel"]["id"]
    client = await gpupool_app.connection.client()
    job_id = leases.held()[kernel_id].job_id
    assert (await client.job(job_id))["state"] == "running"
    # the kernel dies and nothing will restart it (auto-restart off)
    km = jp_serverapp.kernel_manager.get_kernel(kernel_id)
    km.stop_restarter()
    km.autorestart = False
    os.kill(km.provisioner.pid, signal.SIGKILL)
    job = await wait_state(client, job_id, {"cancelled"}, timeout=RELEASED_WITHIN_S)
    assert job["state"] == "cancelled" and "lease" not in (job.get("reason") or "")
    assert kernel_id not in leases.held()
    pool = await client.pool()
    assert all(g["allocated"] == 0 for n in pool["nodes"] for g in n["gpus"])

    # the dead kernel is still listed; restarting it by hand takes a share again
    await jp_fetch("api", "kernels", kernel_id, "restart", method="POST", body=b"")
    new_job = leases.held()[kernel_id].job_id
    assert new_job != job_id and (await client.job(new_job))["state"] == "running"
    assert (await kernel_env(jp_serverapp, kernel_id))["GPUPOOL_JOB_ID"] == new_job
    await jp_fetch("api", "sessions", session["id"], method="DELETE")
    assert (await client.job(new_job))["state"] == "cancelled"
