"""Fixtures for the Jupyter extension tests: pytest-jupyter's server fixtures, configured for gpupool.

Each test gets its own Jupyter server (pytest-jupyter's fixtures are per test)
with the extension enabled and every path (Jupyter data dir, the embedded
scheduler's state) in the test's tmp dir. ``fake_pool`` swaps the scheduler for
an in-memory double; tests without it use the real embedded scheduler.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import pytest_asyncio
from gpupool_fake import FakeScheduler
from pytest_jupyter.jupyter_server import *  # noqa: F403

from jupyter_gpupool import connection as connection_mod
from jupyter_gpupool import leases

LEASE_S = 3.0


@pytest_asyncio.fixture(autouse=True)
async def jp_asyncio_loop() -> asyncio.AbstractEventLoop:
    """Run pytest-jupyter's server on pytest-asyncio's loop (the project runs asyncio_mode=auto).

    pytest-jupyter otherwise makes a loop of its own for the server while
    pytest-asyncio runs the test coroutine on another, and requests time out.
    """
    return asyncio.get_running_loop()


@pytest.fixture
def gpupool_config() -> dict[str, Any]:
    """c.GPUPool for the test server (tests may change it before the server starts)."""
    return {
        "simulate": "4xA100-80GB",
        "lease_seconds": LEASE_S,
        "renew_interval": 0.5,
        "build_quota": 1.0,
        "kernel_start_timeout": 5.0,
        "scheduler_config": {"tick_s": 0.3, "poll_s": 0.05, "history_interval_s": 1.0, "min_runtime_s": 0.0},
    }


@pytest.fixture
def jp_server_config(gpupool_config: dict[str, Any]) -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_gpupool": True}},
        "GPUPool": gpupool_config,
    }


@pytest.fixture
def gpupool_app(jp_serverapp: Any) -> Any:
    """The loaded extension app."""
    return jp_serverapp.extension_manager.extension_points["jupyter_gpupool"].app


@pytest.fixture
def fake_pool(gpupool_app: Any) -> FakeScheduler:
    """Point the extension at an in-memory scheduler (user 'me', admin)."""
    sched = FakeScheduler()
    client = sched.client("me")
    gpupool_app.connection.user = "me"
    gpupool_app.connection.project = "me"
    gpupool_app.connection.use_client(client, admin_client=sched.client("admin", admin=True))
    return sched


@pytest.fixture(autouse=True)
def _forget_shares() -> Any:
    """Module-level registries must not leak between tests."""
    yield
    for kernel_id in list(leases.held()):
        leases.release(kernel_id)
    connection_mod.set_current(None)
