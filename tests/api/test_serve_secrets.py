"""`gpupool serve` keeps its admin token off the command line and out of its jobs' reach (issue 16, item 5).

The attack of the issue: a job finds the service (its wrapper's parent) and
reads the token from ``/proc/<service>/cmdline`` or ``/proc/<service>/environ``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from gpupool.client import GpupoolClient

from .servers import cli_env, gpupool


def _listening_url(proc: subprocess.Popen[str]) -> str:
    """The URL from `gpupool serve`'s banner (its first lines), or the failure with its stderr."""
    while True:
        line = proc.stdout.readline() if proc.stdout else ""
        assert line, proc.stderr.read() if proc.stderr else ""
        if "listening on " in line:
            return line.split("listening on ", 1)[1].split()[0]


def test_a_token_on_the_command_line_is_refused_with_the_way_to_give_it(tmp_path):
    env = cli_env("", None, tmp_path)
    out = gpupool(["serve", "--state-dir", str(tmp_path / "s"), "--port", "0", "--simulate", "1xA100-80GB",
                   "--admin-token", "s3cret"], env)
    assert out.returncode == 2
    assert "/proc/PID/cmdline" in out.stderr and "--admin-token-file" in out.stderr
    assert not (tmp_path / "s").exists()  # refused before anything started


def test_the_admin_token_file_must_be_private(tmp_path):
    token = tmp_path / "token"
    token.write_text("file-token\n")
    token.chmod(0o644)
    out = gpupool(["serve", "--state-dir", str(tmp_path / "s"), "--port", "0", "--simulate", "1xA100-80GB",
                   "--admin-token-file", str(token)], cli_env("", None, tmp_path))
    assert out.returncode == 2 and "chmod 600" in out.stderr
    token.chmod(0o600)
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpupool", "serve", "--state-dir", str(tmp_path / "state"), "--port", "0",
         "--simulate", "1xA100-80GB", "--admin-token-file", str(token)],
        env=cli_env("", None, tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        url = _listening_url(proc)
        assert GpupoolClient(url, "file-token").whoami()["admin"] is True
    finally:
        proc.terminate()
        proc.wait(30)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                    reason="running the service as an unprivileged account needs root and setpriv")
def test_a_process_of_the_services_own_user_cannot_read_its_token(tmp_path):
    """The service runs as an unprivileged account (nobody), and so does the attacker, as a job running as
    the service's own user would: the service's command line holds no token and its environment is closed."""
    home = Path(tempfile.mkdtemp(prefix="gpupool-nobody-"))
    os.chmod(home, 0o755)
    os.chown(home, 65534, 65534)
    as_nobody = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]
    try:
        env = cli_env("", None, home)
        env.update(GPUPOOL_ADMIN_TOKEN="admin-secret-xyz", GPUPOOL_RUN_JOBS_AS="auto")
        proc = subprocess.Popen(
            [*as_nobody, sys.executable, "-m", "gpupool", "serve", "--state-dir", str(home / "state"),
             "--port", "0", "--simulate", "1xA100-80GB"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=str(home))
        try:
            url = _listening_url(proc)
            assert GpupoolClient(url, "admin-secret-xyz").whoami()["admin"] is True
            cmdline = subprocess.run([*as_nobody, "cat", f"/proc/{proc.pid}/cmdline"], capture_output=True)
            assert cmdline.returncode == 0 and b"gpupool" in cmdline.stdout
            assert b"admin-secret-xyz" not in cmdline.stdout
            environ = subprocess.run([*as_nobody, "cat", f"/proc/{proc.pid}/environ"], capture_output=True)
            assert environ.returncode != 0 and b"Permission denied" in environ.stderr
            assert b"admin-secret-xyz" not in environ.stdout
        finally:
            proc.terminate()
            proc.wait(30)
    finally:
        shutil.rmtree(home, ignore_errors=True)
