"""`gpupool` next to Lab: on the PATH kernels and terminals inherit, and acting as the Lab user."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from jupyter_gpupool.cli_path import cli_dir, put_cli_on_path


@pytest.mark.skipif(cli_dir() is None, reason="gpupool is not installed next to this Python")
def test_cli_dir_is_appended_once_and_the_command_runs_from_it(tmp_path):
    environ = {"PATH": "/usr/bin:/bin"}
    added = put_cli_on_path(environ)
    assert added == cli_dir() and environ["PATH"] == f"/usr/bin:/bin{os.pathsep}{added}"  # last: shadows nothing
    assert put_cli_on_path(environ) is None and environ["PATH"].count(added) == 1
    # What a kernel's `!gpupool --version` does: find it on that PATH alone.
    result = subprocess.run(["gpupool", "--version"], env={"PATH": environ["PATH"], "HOME": str(tmp_path)},
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.startswith("gpupool "), result.stderr
    empty: dict[str, str] = {}
    assert put_cli_on_path(empty) == cli_dir() and empty["PATH"] == cli_dir()


def test_no_script_no_change(monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setattr("sysconfig.get_path", lambda name: str(tmp_path))
    environ = {"PATH": "/usr/bin"}
    assert put_cli_on_path(environ) is None and environ == {"PATH": "/usr/bin"}


async def test_embedded_scheduler_publishes_the_lab_users_token(tmp_path, monkeypatch):
    """`gpupool` in a terminal beside Lab reaches the embedded scheduler as the Lab user, not as the admin."""
    from gpupool.client import GpupoolClient, runtime_file
    from jupyter_gpupool.connection import PoolConnection, PoolSettings

    for key in ("GPUPOOL_URL", "GPUPOOL_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("GPUPOOL_RUNTIME_DIR", str(tmp_path / "runtime"))
    conn = PoolConnection(PoolSettings(state_dir=str(tmp_path / "state"), simulate="1xA100-80GB"))
    await conn.client()
    try:
        found = runtime_file.newest()
        assert found is not None and found["url"] == conn.url and found["token"] == conn.token
        client = GpupoolClient()  # no URL, no token: what the CLI does
        assert client.url == conn.url and client.token == conn.token
    finally:
        await conn.close()
    assert runtime_file.newest() is None
