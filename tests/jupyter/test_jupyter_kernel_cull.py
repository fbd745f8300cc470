"""Jupyter's own idle culler (``MappingKernelManager.cull_idle_timeout``) frees a GPU kernel's share at once.

Its own module because the culler, once on, culls every kernel of the server.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from test_jupyter_kernels import start_session, wait_state

from jupyter_gpupool import leases

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def gpupool_config(gpupool_config: dict[str, Any]) -> dict[str, Any]:
    return {**gpupool_config, "lease_seconds": 60.0, "renew_interval": 0.5}


@pytest.fixture
def jp_server_config(jp_server_config: dict[str, Any]) -> dict[str, Any]:
    return {**jp_server_config, "MappingKernelManager": {"cull_idle_timeout": 2, "cull_interval": 1}}


async def test_kernel_culled_by_jupyter_gives_its_share_back_at_once(
    jp_fetch: Any, jp_serverapp: Any, gpupool_app: Any
) -> None:
    session = await start_session(jp_fetch, "idle.ipynb", "gpupool-python3-0.25")
    kernel_id = session["kernel"]["id"]
    client = await gpupool_app.connection.client()
    job_id = leases.held()[kernel_id].job_id
    deadline = time.monotonic() + 60
    while kernel_id in jp_serverapp.kernel_manager:
        assert time.monotonic() < deadline, "Jupyter's culler never shut the idle kernel down"
        await asyncio.sleep(0.2)
    job = await wait_state(client, job_id, {"cancelled"}, timeout=2)
    assert job["state"] == "cancelled" and "lease" not in (job.get("reason") or "")
    assert kernel_id not in leases.held()
