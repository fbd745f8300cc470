"""`gpupool` with no flags finds the scheduler running here, and never a dead one's leftovers.

Real `gpupool serve` processes publish their runtime files; the CLI runs as a
process with no URL, as a user types it. A scheduler killed with -9 leaves its
file behind; the CLI must not send its token to whatever listens on that port
later, nor mistake a new process that was given the same id for the scheduler.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpupool.client import runtime_file
from tests.api.servers import ServeProcess, cli_env, gpupool

NOT_FOUND = "no scheduler of yours is running here"


def _env(home: Path, runtime: Path) -> dict[str, str]:
    """A user's shell here: no URL, no token, no saved login; only the runtime folder to look in."""
    env = cli_env("", None, home)
    del env["GPUPOOL_URL"]
    env["GPUPOOL_RUNTIME_DIR"] = str(runtime)
    return env


def _serve(tmp_path: Path, runtime: Path) -> ServeProcess:
    return ServeProcess(tmp_path / "state", tmp_path / "home", simulate="1xA100-80GB",
                        extra_env={"GPUPOOL_RUNTIME_DIR": str(runtime)}).start()


def test_the_runtime_folder_of_every_test_is_a_temporary_one(tmp_path_factory: pytest.TempPathFactory) -> None:
    base = tmp_path_factory.getbasetemp()
    assert Path(runtime_file.runtime_dir()).is_relative_to(base)
    assert Path(os.environ["XDG_RUNTIME_DIR"]).is_relative_to(base)


def test_a_killed_schedulers_file_is_ignored_and_removed(tmp_path: Path) -> None:
    runtime = tmp_path / "runtime"
    serve = _serve(tmp_path, runtime)
    try:
        found = gpupool(["status"], _env(tmp_path / "home", runtime))
        assert found.returncode == 0, found.stderr  # found with no flags while it runs
        (left,) = runtime.glob("scheduler-*.json")
        serve.kill9()
        assert left.exists()  # kill -9: nothing cleaned up
        status = gpupool(["status"], _env(tmp_path / "home", runtime))
        assert status.returncode != 0
        assert NOT_FOUND in status.stderr and serve.url not in status.stderr, status.stderr
        assert not left.exists()
    finally:
        serve.stop()


def test_a_file_whose_process_id_is_now_another_process_is_ignored_and_removed(tmp_path: Path) -> None:
    runtime = tmp_path / "runtime"
    serve = _serve(tmp_path, runtime)
    other = None
    try:
        (left,) = runtime.glob("scheduler-*.json")
        info = json.loads(left.read_text())
        serve.kill9()
        # The id of the dead scheduler, given to a new process: the kernel reuses ids; here the file is
        # pointed at a new process instead, which is what a reader sees either way.
        other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        reused = runtime / f"scheduler-{other.pid}-{serve.port}.json"
        reused.write_text(json.dumps({**info, "pid": other.pid}))
        os.chmod(reused, 0o600)
        left.unlink()
        status = gpupool(["status"], _env(tmp_path / "home", runtime))
        assert status.returncode != 0
        assert NOT_FOUND in status.stderr and serve.url not in status.stderr, status.stderr
        assert not reused.exists()
        assert other.poll() is None  # the other process is left alone
    finally:
        serve.stop()
        if other is not None:
            other.kill()
            other.wait()
