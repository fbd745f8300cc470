"""Where Hub users are Unix accounts (TLJH, LocalProcessSpawner), a root `gpupool serve` runs their jobs as them.

The service runs as root with its default ``run_jobs_as`` (owner): a training
job of the Hub user ``gph-alice`` runs under the account of that name, made
here with ``useradd``; a Hub user without an account is refused at submit.
Skipped, with the reason, where the test cannot make accounts (not root).
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.api.servers import wait_until
from tests.hub.conftest import HUB_SETTINGS, Hub, start_hub, stop_hub

pytestmark = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("useradd") is None,
                                reason="making Unix accounts for the jobs needs root and useradd")

ALICE, NOBODY = "gph-alice", "gph-noaccount"


@pytest.fixture(scope="module")
def account() -> Iterator[pwd.struct_passwd]:
    made = False
    try:
        pwd.getpwnam(ALICE)
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", ALICE], check=True)
        made = True
    yield pwd.getpwnam(ALICE)
    if made:
        subprocess.run(["userdel", ALICE], check=False)


@pytest.fixture(scope="module")
def root_hub(account: pwd.struct_passwd) -> Iterator[Hub]:
    """A Hub whose gpupool service runs jobs as their owners (its default as root)."""
    base = Path(tempfile.mkdtemp(prefix="gpupool-hub-"))
    os.chmod(base, 0o755)  # jobs of other accounts pass through it to their own job directory
    hub = start_hub(base, HUB_SETTINGS, run_jobs_as="", users=[ALICE, NOBODY],
                    groups={"vision": [ALICE, NOBODY]})
    try:
        yield hub
    finally:
        stop_hub(hub)
        shutil.rmtree(base, ignore_errors=True)


def test_a_hub_users_training_job_runs_as_their_unix_account(root_hub: Hub, account: pwd.struct_passwd) -> None:
    root_hub.gp("GET", "/projects", ALICE)
    assert root_hub.gp("PUT", "/projects/vision", "hubadmin", body={"train_guarantee": 1})[0] == 200
    spec = {"project": "vision", "gpu_fraction": 0.25, "command": ["sh", "-c", "echo uid=$(id -u) user=$(id -un)"]}
    status, job = root_hub.gp("POST", "/jobs", ALICE, body=spec)
    assert status == 201, job

    def finished() -> str:
        state = root_hub.gp("GET", f"/jobs/{job['id']}", ALICE)[1]["state"]
        return state if state in ("succeeded", "failed") else ""

    assert wait_until(finished, timeout=60, interval=0.2, what="alice's job to end") == "succeeded"
    log = root_hub.gp("GET", f"/jobs/{job['id']}/logs", ALICE)[1]["data"]
    assert f"uid={account.pw_uid} user={ALICE}" in log
    # a Hub user with no account here gets a clear refusal, not a job run as someone else
    status, reply = root_hub.gp("POST", "/jobs", NOBODY, body=spec)
    assert status == 403 and "has no Unix account" in reply["error"]
