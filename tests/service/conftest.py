"""Fixtures for the service tests: a core on simulated GPUs in a temporary state dir."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from scheduler.service.config import ServiceConfig
from scheduler.service.core import Actor, SchedulerCore

ADMIN = Actor("admin", True)
ALICE = Actor("alice")
BOB = Actor("bob")
PY = sys.executable


def fast_config(state_dir: Path, **overrides: Any) -> ServiceConfig:
    """Short timers so tests are quick; the policy knobs let reclaim act at once."""
    base: dict[str, Any] = dict(
        state_dir=state_dir, simulate="2xA100-80GB", tick_s=0.2, poll_s=0.02, pause_grace_s=2.0,
        reply_wait_s=3.0, history_interval_s=0.2, min_runtime_s=0.0, resume_backoff_s=0.0, admin_token="admin-secret",
        node_name="testhost", cycle_min_interval_s=0.0,
    )
    base.update(overrides)
    return ServiceConfig(**base)


@pytest.fixture
async def make_core(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    """Factory: ``await make_core(**config_overrides)``; every core made is stopped at the end."""
    cores: list[SchedulerCore] = []

    async def make(**overrides: Any) -> SchedulerCore:
        state_dir = overrides.pop("state_dir", tmp_path / "state")
        core = SchedulerCore(fast_config(state_dir, **overrides))
        await core.start()
        cores.append(core)
        return core

    yield make
    for c in cores:
        await c.stop()
