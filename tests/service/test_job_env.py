"""What a job inherits from the service: an allow-list, never its credentials (issue 22, item 2); its files are private."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from gpupool.service.config import ServiceConfig
from gpupool.wire.errors import InvalidRequest
from tests.service.helpers import ADMIN, ALICE, PY, wait_for

SHOW_ENV = "import json, os; print(json.dumps(dict(os.environ)))"


async def _job_env(core, env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a job of alice's sees, as it prints it."""
    core.set_project(ADMIN, "p", {"train_guarantee": 1})
    job, _ = await core.submit(ALICE, {"project": "p", "gpus": 1, "command": [PY, "-c", SHOW_ENV],
                                       "env": env or {}})
    await wait_for(lambda: core.get_job(ADMIN, job["id"])["state"] == "succeeded", what="the job")
    out = core.read_log(ALICE, job["id"])["data"]
    return json.loads(out.strip().splitlines()[-1])


async def test_a_job_gets_the_allow_list_of_the_service_environment_and_its_own(make_core, monkeypatch):
    for name in ("GPUPOOL_ADMIN_TOKEN", "GPUPOOL_TOKEN", "JUPYTERHUB_API_TOKEN", "JUPYTER_TOKEN"):
        monkeypatch.setenv(name, f"secret-{name}")
    # what an admin's shell often holds when it starts the service: none of it is a job's business
    for name in ("AWS_SECRET_ACCESS_KEY", "HF_TOKEN", "DATABASE_PASSWORD", "HARMLESS_SETTING"):
        monkeypatch.setenv(name, f"secret-{name}")
    monkeypatch.setenv("LC_TIME", "C.UTF-8")
    monkeypatch.setenv("TZ", "UTC")
    env = await _job_env(await make_core(), {"MY_TOKEN": "the job's own"})
    assert not [k for k, v in env.items() if v.startswith("secret-")], env
    assert env["MY_TOKEN"] == "the job's own"
    assert env["PATH"] == os.environ["PATH"] and env["LC_TIME"] == "C.UTF-8" and env["TZ"] == "UTC"
    assert env["GPUPOOL_JOB_ID"] and env["CUDA_VISIBLE_DEVICES"] is not None  # the GPU variables
    assert env["HOME"] == os.environ["HOME"]  # the service's own account: its own home


async def test_an_admin_passes_more_names_on_purpose_but_never_the_service_credentials(make_core, monkeypatch):
    monkeypatch.setenv("HF_HOME", "/models/hf")
    monkeypatch.setenv("NCCL_DEBUG", "INFO")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret-aws")
    env = await _job_env(await make_core(job_env_passthrough=["HF_HOME", "NCCL_*"]))
    assert env["HF_HOME"] == "/models/hf" and env["NCCL_DEBUG"] == "INFO"
    assert "AWS_SECRET_ACCESS_KEY" not in env
    with pytest.raises(InvalidRequest, match="GPUPOOL_ADMIN_TOKEN"):
        ServiceConfig(state_dir=Path("/nonexistent"), job_env_passthrough=["GPUPOOL_*"])
    with pytest.raises(InvalidRequest, match="list of environment variable names"):
        ServiceConfig(state_dir=Path("/nonexistent"), job_env_passthrough=["NOT A NAME"])


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
