"""What a job inherits from the service (issue 16, item 5): never its credentials; its files are private."""

from __future__ import annotations

import os
import stat

from tests.service.helpers import ADMIN, ALICE, PY, wait_for

SHOW_ENV = "import json, os; print(json.dumps(dict(os.environ)))"


async def test_a_job_gets_no_credential_of_the_service(make_core, monkeypatch):
    for name in ("GPUPOOL_ADMIN_TOKEN", "GPUPOOL_TOKEN", "JUPYTERHUB_API_TOKEN", "JUPYTER_TOKEN"):
        monkeypatch.setenv(name, f"secret-{name}")
    monkeypatch.setenv("HARMLESS_SETTING", "kept")
    core = await make_core()
    core.set_project(ADMIN, "p", {"train_guarantee": 1})
    job, _ = await core.submit(ALICE, {"project": "p", "gpus": 1, "command": [PY, "-c", SHOW_ENV],
                                       "env": {"MY_TOKEN": "the job's own"}})
    await wait_for(lambda: core.get_job(ADMIN, job["id"])["state"] == "succeeded", what="the job")
    out = core.read_log(ALICE, job["id"])["data"]
    assert "secret-" not in out
    assert '"HARMLESS_SETTING": "kept"' in out and '"MY_TOKEN": "the job\'s own"' in out


async def test_state_and_job_files_are_private_to_the_service_user(make_core, tmp_path):
    core = await make_core()
    core.set_project(ADMIN, "p", {"train_guarantee": 1})
    job, _ = await core.submit(ALICE, {"project": "p", "gpus": 1, "command": [PY, "-c", "print('hi')"]})
    await wait_for(lambda: core.get_job(ADMIN, job["id"])["state"] == "succeeded", what="the job")
    state = core.state_dir

    def mode(path):
        return oct(stat.S_IMODE(os.stat(path).st_mode))

    assert mode(state) == "0o700" and mode(state / "jobs") == "0o700"
    assert mode(state / "state.db") == "0o600"
    assert mode(state / "jobs" / job["id"]) == "0o700" and mode(state / "jobs" / job["id"] / "job.log") == "0o600"
    assert mode(core.get_job(ADMIN, job["id"])["workdir"]) == "0o700"
