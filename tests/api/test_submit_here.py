"""The README's first CLI example, as a new user types it (issue 22, item 11).

``gpupool submit --project P --gpus 1 -- python train.py`` from the folder
that holds ``train.py``: the job runs there (the real ``gpupool`` command, as a
process, against a real scheduler on this machine), and when it
fails at once ``gpupool list`` still shows it, with its reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpupool.client import GpupoolClient, on_this_machine, with_submit_dir

from .servers import EmbeddedThread, wait_until

SETTINGS = {"tick_s": 0.2, "poll_s": 0.05, "pause_grace_s": 2.0, "min_runtime_s": 0.0, "resume_backoff_s": 0.0}


@pytest.fixture(scope="module")
def svc(tmp_path_factory):
    srv = EmbeddedThread(tmp_path_factory.mktemp("here") / "state", simulate="2xA100-80GB", admin_token="admin-t",
                         projects={"vision": {"train_guarantee": 2}}, config=SETTINGS)
    srv.alice = GpupoolClient(srv.url, "admin-t").create_token("alice")["token"]
    yield srv
    srv.close()


def _gpupool(svc, cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUPOOL_URL": svc.url, "GPUPOOL_TOKEN": svc.alice, "HOME": str(cwd),
           "XDG_CONFIG_HOME": str(cwd / ".config")}
    return subprocess.run([sys.executable, "-m", "gpupool", *argv], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=60)


def test_a_job_submitted_from_a_folder_runs_in_it(svc, tmp_path):
    (tmp_path / "train.py").write_text("open('model.txt', 'w').write('trained')\n")
    done = _gpupool(svc, tmp_path, "submit", "--project", "vision", "--gpus", "1", "--", sys.executable, "train.py")
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.split()[0]
    admin = GpupoolClient(svc.url, "admin-t")
    job = wait_until(lambda: (j := admin.job(job_id))["state"] in ("succeeded", "failed") and j, what="the job")
    assert job["state"] == "succeeded", admin.logs(job_id)["data"]
    assert job["workdir"] == str(tmp_path)
    assert (tmp_path / "model.txt").read_text() == "trained"
    # another submit, with a label, runs there too
    done = _gpupool(svc, tmp_path, "submit", "--project", "vision", "--gpus", "1", "--label", "a=b", "--",
                    sys.executable, "train.py")
    assert done.returncode == 0, done.stderr
    assert admin.job(done.stdout.split()[0])["workdir"] == str(tmp_path)


def test_a_job_that_failed_at_once_still_shows_in_the_list(svc, tmp_path):
    done = _gpupool(svc, tmp_path, "submit", "--project", "vision", "--gpus", "1", "--", sys.executable,
                    "no_such_script.py")
    job_id = done.stdout.split()[0]
    admin = GpupoolClient(svc.url, "admin-t")
    wait_until(lambda: admin.job(job_id)["state"] == "failed", what="the failure")
    listed = _gpupool(svc, tmp_path, "list")
    row = next((line for line in listed.stdout.splitlines() if line.startswith(job_id)), None)
    assert row is not None and " failed " in row, listed.stdout
    assert job_id in _gpupool(svc, tmp_path, "list", "--all").stdout
    assert job_id not in _gpupool(svc, tmp_path, "list", "--state", "running").stdout


def test_only_a_scheduler_on_this_machine_gets_the_callers_folder():
    assert on_this_machine("http://127.0.0.1:8765") and on_this_machine("http://localhost/x")
    assert on_this_machine("http://[::1]:8765/") and on_this_machine("https://u:p@127.1.2.3:9/api")
    assert not on_this_machine("https://gpupool.example.org") and not on_this_machine("http://10.0.0.7:8765")
    spec = {"project": "p", "command": ["true"]}
    assert with_submit_dir(spec, "http://10.0.0.7:8765") == spec
    assert with_submit_dir({**spec, "workdir": "/x"}, "http://127.0.0.1") == {**spec, "workdir": "/x"}
    assert with_submit_dir(spec, "http://127.0.0.1")["submit_dir"] == os.getcwd()
