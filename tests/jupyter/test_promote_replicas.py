"""Promote with replicas (issue 12): a notebook that runs distributed, as a gang of N replicas.

Through the real server extension and its embedded scheduler: bad ``replicas``
values are 400s that leave no snapshot behind; the runner gives each replica
its own output notebook and log in the shared run folder (real processes and
papermill); and a 2 x 8 GPU promote on a pool of two simulated 8-GPU nodes runs
one replica per node, each with its rank and node's GPUs, rank 0's notebook
being the job's output.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest
from tornado.httpclient import HTTPClientError

from jupyter_gpupool.promote import STAGING_PREFIX, papermill_args, run_paths

pytestmark = pytest.mark.timeout(240)

TWO_NODES = "node-a=8xA100-80GB;node-b=8xA100-80GB"
FINAL = ("succeeded", "failed", "cancelled", "rejected")

# What a distributed notebook reads: the rendezvous variables and its own GPUs.
PROBE = (
    "import json, os\n"
    "keys = ['RANK', 'WORLD_SIZE', 'NODE_RANK', 'MASTER_ADDR', 'MASTER_PORT', 'GPUPOOL_REPLICA',\n"
    "        'GPUPOOL_JOB_ID', 'CUDA_VISIBLE_DEVICES']\n"
    "print('RESULT ' + json.dumps({k: os.environ.get(k) for k in keys} | {'epochs': epochs}))\n"
)


def distributed_notebook(path: Path) -> None:
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("epochs = 1\n")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(PROBE)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))


def probe_result(notebook: Path) -> dict[str, Any]:
    """The RESULT line a run of PROBE printed into its output notebook."""
    out = nbformat.read(str(notebook), as_version=4)
    text = "".join(o.get("text", "") for c in out.cells if c.cell_type == "code" for o in c.get("outputs", []))
    return json.loads(text.split("RESULT ", 1)[1].splitlines()[0])


async def post_promote(jp_fetch: Any, body: dict[str, Any]) -> dict[str, Any]:
    reply = await jp_fetch("gpupool", "api", "promote", method="POST", body=json.dumps(body))
    return json.loads(reply.body)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"replicas": 0}, "'replicas' must be from 1 to 64, not 0"),
        ({"replicas": 65, "gpus": 1}, "'replicas' must be from 1 to 64, not 65"),
        ({"replicas": 1.5}, "'replicas' must be a whole number from 1 to 64"),
        ({"replicas": "2"}, "'replicas' must be a whole number from 1 to 64"),
        ({"replicas": True}, "'replicas' must be a whole number from 1 to 64"),
        ({"replicas": 2, "gpus": 0.5}, "'replicas' above 1 needs whole GPUs per replica"),
        ({"replicas": 2, "gpu_fraction": 0.25}, "'replicas' above 1 needs whole GPUs per replica"),
    ],
)
async def test_bad_replicas_are_400s_that_leave_nothing(
    jp_fetch: Any, jp_root_dir: Path, extra: dict[str, Any], message: str
) -> None:
    distributed_notebook(jp_root_dir / "dist.ipynb")
    with pytest.raises(HTTPClientError) as info:
        await post_promote(jp_fetch, {"path": "dist.ipynb", **extra})
    assert info.value.code == 400
    assert message in json.loads(info.value.response.body)["error"]
    assert not (jp_root_dir / "dist.runs").exists() or list((jp_root_dir / "dist.runs").iterdir()) == []


def test_each_replica_runs_the_notebook_into_its_own_files(tmp_path: Path) -> None:
    """Two runner processes of one job in one run folder, started together as a gang's replicas are."""
    distributed_notebook(tmp_path / "dist.ipynb")
    runs = tmp_path / "dist.runs"
    runs.mkdir()
    staging = f"{STAGING_PREFIX}test.ipynb"
    (runs / staging).write_bytes((tmp_path / "dist.ipynb").read_bytes())
    args = papermill_args({"epochs": 3}, "python3", str(tmp_path))
    procs = []
    for rank in (0, 1):
        env = {**os.environ, "GPUPOOL_JOB_ID": "j-000007", "GPUPOOL_ATTEMPT": "1", "GPUPOOL_REPLICA": str(rank),
               "GPUPOOL_REPLICAS": "2", "RANK": str(rank), "WORLD_SIZE": "2"}
        command = [sys.executable, "-m", "jupyter_gpupool.runner", "--staging", staging, "--", *args]
        procs.append(subprocess.Popen(command, cwd=runs, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outputs = [p.communicate(timeout=180)[0].decode() for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    run_dir = runs / "j-000007"
    assert sorted(f.name for f in run_dir.iterdir()) == [
        "input.ipynb", "job.log", "job.replica-1.log", "output.ipynb", "output.replica-1.ipynb"]
    assert probe_result(run_dir / "output.ipynb")["RANK"] == "0"
    assert probe_result(run_dir / "output.replica-1.ipynb")["RANK"] == "1"
    assert probe_result(run_dir / "output.replica-1.ipynb")["epochs"] == 3
    assert "replica 1 of 2" in (run_dir / "job.replica-1.log").read_text()
    assert "replica 0 of 2" in (run_dir / "job.log").read_text()
    assert "replica 1" not in (run_dir / "job.log").read_text()
    assert not list(runs.glob(".staging-*"))


def test_run_paths_name_every_replicas_output() -> None:
    job = {"id": "j-9", "labels": {"promoted": "1", "runs_dir": "w/d.runs"}, "request": {"replicas": 3}}
    assert run_paths(job) == {
        "run_dir": "w/d.runs/j-9",
        "output_notebook": "w/d.runs/j-9/output.ipynb",
        "replica_output_notebooks": ["w/d.runs/j-9/output.ipynb", "w/d.runs/j-9/output.replica-1.ipynb",
                                     "w/d.runs/j-9/output.replica-2.ipynb"],
    }


@pytest.fixture
def two_node_pool(gpupool_config: dict[str, Any]) -> dict[str, Any]:
    """The embedded scheduler on two simulated 8-GPU nodes."""
    gpupool_config["simulate"] = TWO_NODES
    return gpupool_config


async def test_sixteen_gpu_promote_runs_on_both_nodes(
    two_node_pool: dict[str, Any], jp_fetch: Any, jp_root_dir: Path
) -> None:
    distributed_notebook(jp_root_dir / "dist.ipynb")
    job = await post_promote(jp_fetch, {"path": "dist.ipynb", "gpus": 8, "replicas": 2, "parameters": {"epochs": 2}})
    assert job["request"]["gpus"] == 8 and job["request"]["replicas"] == 2
    assert job["output_notebook"] == f"dist.runs/{job['id']}/output.ipynb"

    deadline, seen_replicas = time.monotonic() + 200, None
    while time.monotonic() < deadline:
        current = json.loads((await jp_fetch("gpupool", "api", "jobs", job["id"])).body)
        if current["state"] == "running" and (current.get("assignment") or {}).get("replicas"):
            seen_replicas = current["assignment"]["replicas"]
        if current["state"] in FINAL:
            break
        await asyncio.sleep(0.3)
    logs = json.loads((await jp_fetch("gpupool", "api", "jobs", job["id"], "logs", params={"offset": "0"})).body)
    assert current["state"] == "succeeded", logs["data"][-3000:]
    assert seen_replicas is not None, "the running job never showed its replicas"
    assert [r["rank"] for r in seen_replicas] == [0, 1]
    assert sorted(r["node"] for r in seen_replicas) == ["node-a", "node-b"]
    assert all(len(r["gpus"]) == 8 for r in seen_replicas)

    run_dir = jp_root_dir / current["run_dir"]
    ranks = [probe_result(jp_root_dir / p) for p in current["replica_output_notebooks"]]
    assert [r["RANK"] for r in ranks] == ["0", "1"] and [r["NODE_RANK"] for r in ranks] == ["0", "1"]
    assert {r["WORLD_SIZE"] for r in ranks} == {"2"} and {r["GPUPOOL_JOB_ID"] for r in ranks} == {job["id"]}
    assert len({(r["MASTER_ADDR"], r["MASTER_PORT"]) for r in ranks}) == 1 and ranks[0]["MASTER_PORT"]
    assert all(r["epochs"] == 2 for r in ranks)
    # each replica saw its own node's 8 GPUs
    for rank, seen in zip(ranks, seen_replicas, strict=True):
        assert rank["CUDA_VISIBLE_DEVICES"].split(",") == [g["id"] for g in seen["gpus"]]
    assert current["replica_output_notebooks"][0] == current["output_notebook"]
    assert (run_dir / "job.log").exists() and (run_dir / "job.replica-1.log").exists()
    assert "papermill exited with status 0" in logs["data"]
    assert "[0] " in logs["data"] and "[1] " in logs["data"]
    # each replica's log alone, through the extension; a rank the job does not have is a 400
    for rank in (0, 1):
        alone = json.loads((await jp_fetch("gpupool", "api", "jobs", job["id"], "logs",
                                           params={"offset": "0", "replica": str(rank)})).body)["data"]
        assert f'"RANK": "{rank}"' in alone and f'"RANK": "{1 - rank}"' not in alone
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("gpupool", "api", "jobs", job["id"], "logs", params={"offset": "0", "replica": "2"})
    assert info.value.code == 400 and "replica" in json.loads(info.value.response.body)["error"]
