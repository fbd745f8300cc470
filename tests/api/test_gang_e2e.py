"""Multi-node gangs end to end (issue 12): `gpupool serve` on a simulated pool of several nodes, driven by
the real CLI and HTTP API, with the job's processes telling what they saw.

The issue's "done when": a 16-GPU training job runs across two simulated nodes from the CLI.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from .servers import ServeProcess, gpupool, http, wait_until

POOL = "node-a@rack1=8xA100-80GB;node-b@rack1=8xA100-80GB;node-c=4xT4"
ENV_DUMP = ("import json, os; open('env-' + os.environ['RANK'] + '.json', 'w').write(json.dumps(dict(os.environ))); "
            "print('rank', os.environ['RANK'], 'of', os.environ['WORLD_SIZE'], flush=True)")


@pytest.fixture(scope="module")
def serve(tmp_path_factory: pytest.TempPathFactory) -> Any:
    base = tmp_path_factory.mktemp("gangs")
    srv = ServeProcess(base / "state", base, simulate=POOL, settings={"on_shutdown": "stop", "min_runtime_s": 0})
    srv.start()
    admin = srv.env()
    assert gpupool(["projects", "set", "vision", "--guarantee", "16"], admin).returncode == 0
    made = gpupool(["tokens", "create", "alice"], admin)
    assert made.returncode == 0, made.stderr
    srv.alice = srv.env(made.stdout.strip())  # type: ignore[attr-defined]
    try:
        yield srv
    finally:
        srv.stop()


def _job(srv: ServeProcess, job_id: str) -> dict[str, Any]:
    status, job = http("GET", f"{srv.url}/api/v1/jobs/{job_id}", srv.admin_token)
    assert status == 200, job
    return job


def test_a_16_gpu_job_runs_across_two_simulated_nodes_from_the_cli(serve: ServeProcess, tmp_path: Path):
    status = gpupool(["status"], serve.alice)
    assert status.returncode == 0
    assert all(f"{n}" in status.stdout for n in ("node-a (rack1)", "node-b (rack1)", "node-c"))
    # a one-GPU job holds an A100 of one node: the gang cannot start, and says why
    blocker = gpupool(["submit", "--project", "vision", "--gpus", "1", "--gpu-model", "A100-80GB", "--",
                       sys.executable, "-c", "import time; time.sleep(120)"], serve.alice)
    assert blocker.returncode == 0, blocker.stderr
    blocker_id = blocker.stdout.split()[0]
    wait_until(lambda: _job(serve, blocker_id)["state"] == "running", what="the one-GPU job to run")

    sub = gpupool(["submit", "--project", "vision", "--replicas", "2", "--gpus", "8", "--workdir", str(tmp_path),
                   "--", sys.executable, "-c", ENV_DUMP], serve.alice)
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.split()[0]
    assert sub.stdout.strip() == (f"{job_id} queued: 2 × 8 GPUs in project vision as alice; "
                                  f"'gpupool describe {job_id}' shows where it runs")
    wait_until(lambda: _job(serve, job_id)["reason"] != "queued", what="the gang's reason")
    waiting = gpupool(["describe", job_id], serve.alice)
    assert waiting.returncode == 0
    assert "state:            queued" in waiting.stdout
    assert "reason:           2 × 8 GPUs: only 1 node has room for a replica (8 whole GPUs)" in waiting.stdout
    listed = gpupool(["list"], serve.alice)
    row = next(line for line in listed.stdout.splitlines() if line.startswith(job_id))
    assert "2 × 8 GPUs" in row and "queued" in row

    assert gpupool(["cancel", blocker_id], serve.alice).returncode == 0
    job = wait_until(lambda: (j := _job(serve, job_id))["state"] in ("running", "succeeded") and j,
                     what="the gang to start")
    assert job["attempts"] == 1
    job = wait_until(lambda: (j := _job(serve, job_id))["state"] not in ("queued", "running") and j,
                     what="the gang to end")
    assert job["state"] == "succeeded", job["reason"]
    # what the two processes saw: one world of 2, ranks 0 and 1, one rendezvous point, 8 GPUs each
    envs = [json.loads((tmp_path / f"env-{k}.json").read_text()) for k in (0, 1)]
    assert [(e["RANK"], e["NODE_RANK"], e["WORLD_SIZE"]) for e in envs] == [("0", "0", "2"), ("1", "1", "2")]
    assert envs[0]["MASTER_ADDR"] == envs[1]["MASTER_ADDR"] == "127.0.0.1"
    assert envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]
    devices = [e["CUDA_VISIBLE_DEVICES"].split(",") for e in envs]
    assert [len(d) for d in devices] == [8, 8] and not set(devices[0]) & set(devices[1])
    log = gpupool(["logs", job_id], serve.alice)
    assert log.returncode == 0 and "[0] rank 0 of 2" in log.stdout and "[1] rank 1 of 2" in log.stdout


def test_describe_lists_each_replicas_node_and_gpus(serve: ServeProcess, tmp_path: Path):
    sub = gpupool(["submit", "--project", "vision", "--replicas", "2", "--gpus", "8", "--workdir", str(tmp_path),
                   "--", sys.executable, "-c", "import time; time.sleep(120)"], serve.alice)
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.split()[0]
    try:
        wait_until(lambda: _job(serve, job_id)["state"] == "running", what="the gang to run")
        out = gpupool(["describe", job_id], serve.alice).stdout
        assert "starts 2 × 8 GPUs together on node-a, node-b" in out
        shares = ", ".join(f"A100-80GB#{i} 1" for i in range(8))
        assert f"assignment:       replica 0 on node-a: {shares}\n" in out
        assert f"replica 1 on node-b: {shares}\n" in out
        pool = http("GET", f"{serve.url}/api/v1/pool", serve.admin_token)[1]
        held = {n["name"]: sum(g["allocated"] for g in n["gpus"]) for n in pool["nodes"]}
        assert held == {"node-a": 8, "node-b": 8, "node-c": 0}
        projects = gpupool(["projects"], serve.alice).stdout
        assert any(line.startswith("vision") and "16/16" in line for line in projects.splitlines())
        metrics = http("GET", f"{serve.url}/metrics", serve.admin_token)[1]
        assert 'gpupool_project_allocated_gpus{kind="train",project="vision"} 16.0' in metrics
    finally:
        gpupool(["cancel", job_id], serve.alice)
    wait_until(lambda: _job(serve, job_id)["state"] == "cancelled", what="the gang to be cancelled")


@pytest.mark.parametrize("args,code,message", [
    (["--replicas", "0", "--gpus", "1"], 2, "--replicas must be at least 1, not 0"),
    (["--replicas", "2", "--gpu-fraction", "0.5"], 2, "--replicas 2 needs --gpus"),
    (["--replicas", "two", "--gpus", "1"], 2, "invalid int value: 'two'"),
    (["--replicas", "65", "--gpus", "1"], 1, "replicas must be a whole number from 1 to 64, not 65"),
    (["--replicas", "3", "--gpus", "8"], 1, "replicas=3 × gpus=8 does not fit this pool"),
    (["--replicas", "2", "--gpus", "9"], 1, "gpus=9 is more than any node of the train pool has (8)"),
])
def test_bad_replicas_are_cli_errors(serve: ServeProcess, args: list[str], code: int, message: str):
    result = gpupool(["submit", "--project", "vision", *args, "--", "true"], serve.alice)
    assert result.returncode == code and message in result.stderr, result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize("fields,message", [
    ({"gpus": 1, "replicas": 0}, "replicas must be a whole number from 1 to 64, not 0"),
    ({"gpus": 1, "replicas": "2"}, "replicas must be a whole number from 1 to 64, not 2"),
    ({"gpus": 1, "replicas": 1.5}, "replicas must be a whole number from 1 to 64, not 1.5"),
    ({"gpu_fraction": 0.5, "replicas": 2}, "needs whole GPUs per replica"),
    ({"kind": "build", "gpus": 1, "replicas": 2}, "replicas is for train jobs"),
])
def test_bad_replicas_are_400s_that_change_nothing(serve: ServeProcess, fields: dict[str, Any], message: str):
    before = http("GET", f"{serve.url}/api/v1/jobs?limit=1000&state=queued,running,paused,succeeded,failed,cancelled,"
                  "rejected", serve.admin_token)[1]
    spec = {"project": "vision", **fields}
    if spec.get("kind") != "build":
        spec["command"] = ["true"]
    status, reply = http("POST", f"{serve.url}/api/v1/jobs", serve.admin_token, body=spec)
    assert status == 400 and message in reply["error"], reply
    after = http("GET", f"{serve.url}/api/v1/jobs?limit=1000&state=queued,running,paused,succeeded,failed,cancelled,"
                 "rejected", serve.admin_token)[1]
    assert after == before


def test_a_bad_simulated_pool_stops_serve_with_a_message(tmp_path: Path):
    import subprocess

    from .servers import cli_env

    result = subprocess.run([sys.executable, "-m", "gpupool", "serve", "--state-dir", str(tmp_path / "s"),
                             "--port", "0", "--simulate", "node-a=8xA100-80GB;node-a=4xT4"],
                            env=cli_env("", None, tmp_path), capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "node node-a appears twice in simulation spec" in result.stderr


@pytest.mark.parametrize(("argv", "replicas"), [
    (["submit", "--project", "vision", "--replicas", "2", "--gpus", "8", "--", "python", "train.py"], 2),
    (["submit", "-p", "vision", "--gpus", "1", "--replicas=4", "--name", "ddp", "--", "torchrun", "x.py"], 4),
    (["submit", "-p", "vision", "--replicas", "1", "--gpu-fraction", "0.5", "--", "x"], 1),
])
def test_the_cli_reads_replicas(argv: list[str], replicas: int):
    from gpupool.cli import main as cli

    options, command = cli._split_command(argv)
    spec = cli.submit_spec(cli.build_parser("submit").parse_args(options), command)
    assert spec["replicas"] == replicas and spec["command"] == command


@pytest.mark.parametrize("argv", [
    ["submit", "-p", "vision", "--replicas", "0", "--gpus", "1", "--", "x"],
    ["submit", "-p", "vision", "--replicas", "2", "--gpu-fraction", "0.5", "--", "x"],
    ["submit", "-p", "vision", "--replicas", "2", "--", "x"],
    ["submit", "-p", "vision", "--replicas", "two", "--gpus", "1", "--", "x"],
])
def test_a_replicas_mistake_is_a_usage_error(argv: list[str], capsys, monkeypatch, tmp_path):
    from gpupool.cli import main as cli

    monkeypatch.setenv("GPUPOOL_URL", "http://127.0.0.1:9")  # never reached: the mistake is found first
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpupool: error: ") and err.count("\n") == 1 and "replicas" in err, err


def test_the_openapi_document_publishes_replicas_as_the_core_enforces_them(serve: ServeProcess):
    from gpupool.wire.limits import MAX_REPLICAS

    status, doc = http("GET", f"{serve.url}/api/v1/openapi.json")
    assert status == 200
    schemas = doc["components"]["schemas"]
    replicas = schemas["JobSpec"]["properties"]["replicas"]
    assert (replicas["type"], replicas["minimum"], replicas["maximum"]) == ("integer", 1, MAX_REPLICAS)
    assert "replicas" in schemas["Job"]["properties"]["assignment"]["properties"]
    assert "replicas" in schemas["Job"]["properties"]["request"]["properties"]
    # the running service takes replicas and refuses one above the published maximum
    ok = http("POST", f"{serve.url}/api/v1/jobs", serve.admin_token,
              body={"project": "vision", "gpus": 1, "replicas": 1, "command": ["true"]})
    assert ok[0] == 201 and ok[1]["request"]["replicas"] == 1
    refused = http("POST", f"{serve.url}/api/v1/jobs", serve.admin_token,
                   body={"project": "vision", "gpus": 1, "replicas": MAX_REPLICAS + 1, "command": ["true"]})
    assert refused[0] == 400
