"""Fixtures for the service tests: a core on simulated GPUs in a temporary state dir."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.service.helpers import cores_made, fast_config


@pytest.fixture
async def make_core(tmp_path: Path) -> AsyncIterator[Callable[..., Any]]:
    """Factory: ``await make_core(**config_overrides)``; every core made is stopped at the end."""
    def config_of(**overrides: Any) -> Any:
        return fast_config(overrides.pop("state_dir", tmp_path / "state"), **overrides)

    async for make in cores_made(config_of):
        yield make
