"""Settings for the whole suite.

The suite runs as root in CI, where a scheduler's default is to run each
training job as the Unix account named like its owner. The tests' users
(alice, bob...) are token names, not accounts, so the suite runs jobs as the
service's own user; tests/service/test_job_accounts.py tests the per-owner
accounts with real Unix accounts, setting ``run_jobs_as`` itself.

No test may publish a scheduler in, or find one through, the runtime folder of
the user running the tests (``~/.local/share/gpupool/runtime`` or
``$XDG_RUNTIME_DIR/gpupool``): the README's ``gpupool status`` would answer
from a test's scheduler, and a killed one's file would be left behind. So the
runtime folder is a temporary one, for the session (schedulers that fixtures of
a wider scope start) and again for each test; subprocesses inherit it.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

os.environ.setdefault("GPUPOOL_RUN_JOBS_AS", "service")


def _use_runtime_dirs(base: Path, setenv: Callable[[str, str], object]) -> None:
    """Point both variables the runtime folder honours (gpupool.client.runtime_file.runtime_dir) into ``base``.

    ``$XDG_RUNTIME_DIR`` too: a test's subprocess may be given a clean
    environment without the ``GPUPOOL_`` settings (tests.api.servers.cli_env),
    and must not fall back to the user's own /run/user/UID.
    """
    xdg = base / "xdg"
    xdg.mkdir(mode=0o700, exist_ok=True)
    setenv("GPUPOOL_RUNTIME_DIR", str(base / "gpupool"))
    setenv("XDG_RUNTIME_DIR", str(xdg))


@pytest.fixture(scope="session", autouse=True)
def _session_runtime_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A temporary runtime folder for the session, set before any fixture of a wider scope starts a scheduler."""
    base = tmp_path_factory.mktemp("runtime-session")
    saved = {name: os.environ.get(name) for name in ("GPUPOOL_RUNTIME_DIR", "XDG_RUNTIME_DIR")}
    _use_runtime_dirs(base, os.environ.__setitem__)
    try:
        yield base
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture(autouse=True)
def _test_runtime_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch,
                      _session_runtime_dir: Path) -> Path:
    """A runtime folder of each test's own: schedulers it starts are not found by the next test's CLI calls."""
    base = tmp_path_factory.mktemp("runtime")
    _use_runtime_dirs(base, monkeypatch.setenv)
    return base
