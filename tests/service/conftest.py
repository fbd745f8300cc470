"""Fixtures for the service tests: a core on simulated GPUs in a temporary state dir."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from scheduler.service.core import SchedulerCore
from tests.service.helpers import fast_config


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
