"""A multi-node gang's replicas run by the local executor, with real processes.

Each test launches the attempt the way the service core does (a ``Launch``
with ``replicas``) and looks at what a user would: the environment each
replica saw, whether the replicas really reach each other at
MASTER_ADDR:MASTER_PORT, the job's exit status, the logs, and which replicas
were stopped.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from gpupool.backends.base import Launch, ReplicaLaunch
from gpupool.backends.local.executor import LocalExecutor, ProcessHandle, group_members, proc_start_time
from gpupool.envbuilder import gpu_environment
from tests.api.servers import ServeProcess, gpupool, http, wait_until

PY = sys.executable

KEYS = ["WORLD_SIZE", "RANK", "NODE_RANK", "GPUPOOL_REPLICA", "GPUPOOL_REPLICAS", "MASTER_ADDR", "MASTER_PORT",
        "CUDA_VISIBLE_DEVICES", "GPUPOOL_RESUME", "GPUPOOL_ATTEMPT", "JOB_VAR"]

# One replica of a test gang. argv[1] says what it does; every start appends GPUPOOL_RESUME to starts-RANK.
REPLICA = r"""
import json, os, signal, socket, sys, time
rank = int(os.environ["RANK"]); mode = sys.argv[1]
with open(f"env-{rank}.json", "w") as f:
    json.dump({k: os.environ.get(k) for k in KEYS}, f)
with open(f"starts-{rank}.txt", "a") as f:
    f.write(os.environ["GPUPOOL_RESUME"] + "\n")
def term(*_):
    open(f"term-{rank}", "w").close(); print(f"replica {rank} checkpointed", flush=True); sys.exit(0)
signal.signal(signal.SIGTERM, signal.SIG_IGN if mode == "stubborn" and rank == 0 else term)
with open(f"pid-{rank}", "w") as f:
    f.write(str(os.getpid()))
def ready():
    open(f"ready-{rank}", "w").close()
if mode == "env":
    print(f"replica {rank} of {os.environ['WORLD_SIZE']} ok", flush=True)
    print(f"rank {rank} to stderr", file=sys.stderr, flush=True)
elif mode == "rendezvous":
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    if rank == 0:
        with socket.create_server((addr, port)) as srv:
            conn, _ = srv.accept()
            with conn:
                print("rank 0 received:", conn.makefile().readline().strip(), flush=True)
    else:
        deadline = time.time() + 30
        while True:
            try:
                conn = socket.create_connection((addr, port), timeout=5); break
            except OSError:
                if time.time() > deadline: raise
                time.sleep(0.05)
        with conn:
            conn.sendall(f"hello from rank {rank} of {os.environ['WORLD_SIZE']}\n".encode())
        print(f"rank {rank} sent its greeting", flush=True)
elif mode in ("fail", "stubborn"):
    if rank == 1:
        while not os.path.exists("ready-0"): time.sleep(0.02)
        print("rank 1 gives up", flush=True); sys.exit(3)
    ready(); time.sleep(120)
elif mode == "wait":
    print(f"replica {rank} waiting", flush=True)
    ready(); time.sleep(120)
""".replace("KEYS", repr(KEYS))


def _launch(tmp_path: Path, mode: str, attempt: int = 1, n: int = 2, job_id: str = "j-gang") -> Launch:
    """Attempt ``attempt`` of an n-replica gang, each replica with its own GPU environment (as the core builds it)."""
    script = tmp_path / "replica.py"
    script.write_text(REPLICA)
    replicas = tuple(
        ReplicaLaunch(k, f"node-{k}",
                      gpu_environment(job_id, "p", [(f"GPU-node{k}-{i}", 1000, 80 << 30) for i in range(2)],
                                      attempt, attempt > 1, simulated=True, mps=False),
                      {"node": f"node-{k}", "gpus": []})
        for k in range(n))
    return Launch(job_id, attempt, [PY, str(script), mode], str(tmp_path / "work"), "alice", "p",
                  job_env={"JOB_VAR": "from-the-spec"}, replicas=replicas)


def _wait(pred, timeout: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def _wait_dead(ex: LocalExecutor, h: ProcessHandle, timeout: float = 30.0) -> None:
    _wait(lambda: not ex.alive(h), timeout, "the attempt to end")


def _env(tmp_path: Path, rank: int) -> dict[str, str]:
    return json.loads((tmp_path / "work" / f"env-{rank}.json").read_text())


def _gone(pid_file: Path) -> bool:
    return proc_start_time(int(pid_file.read_text())) is None


def test_each_replica_gets_its_gpus_and_the_rendezvous_variables(tmp_path):
    ex = LocalExecutor(tmp_path / "jobs")
    h = ex.launch(_launch(tmp_path, "env"))
    _wait_dead(ex, h)
    assert ex.exit_code("j-gang", 1) == 0 and ex.ended_on_its_own("j-gang", 1)
    e0, e1 = _env(tmp_path, 0), _env(tmp_path, 1)
    assert (e0["WORLD_SIZE"], e1["WORLD_SIZE"]) == ("2", "2")
    assert [e["RANK"] for e in (e0, e1)] == ["0", "1"]
    assert [e["NODE_RANK"] for e in (e0, e1)] == ["0", "1"]
    assert [e["GPUPOOL_REPLICA"] for e in (e0, e1)] == ["0", "1"]
    assert e0["GPUPOOL_REPLICAS"] == e1["GPUPOOL_REPLICAS"] == "2"
    assert e0["MASTER_ADDR"] == e1["MASTER_ADDR"] == "127.0.0.1"
    assert e0["MASTER_PORT"] == e1["MASTER_PORT"] and 0 < int(e0["MASTER_PORT"]) < 65536
    assert e0["CUDA_VISIBLE_DEVICES"] == "GPU-node0-0,GPU-node0-1"
    assert e1["CUDA_VISIBLE_DEVICES"] == "GPU-node1-0,GPU-node1-1"
    assert e0["JOB_VAR"] == e1["JOB_VAR"] == "from-the-spec"
    assert e0["GPUPOOL_RESUME"] == e1["GPUPOOL_RESUME"] == "0"
    # The job's log: every replica's lines (stdout and stderr), each prefixed with its rank.
    log = ex.log_path("j-gang").read_text().splitlines()
    assert "[0] replica 0 of 2 ok" in log and "[1] replica 1 of 2 ok" in log
    assert "[0] rank 0 to stderr" in log and "[1] rank 1 to stderr" in log
    # Each replica's own log: its output alone, unprefixed.
    for k in (0, 1):
        own = ex.replica_log_path("j-gang", k).read_text()
        assert f"replica {k} of 2 ok" in own and "attempt 1 of j-gang" in own
        assert f"replica {1 - k} of 2" not in own and "[" not in own.split("---")[-1]
    assert not group_members(h.pid)


def test_a_new_attempt_gets_a_new_port(tmp_path):
    ex = LocalExecutor(tmp_path / "jobs")
    ports = []
    for attempt in (1, 2):
        h = ex.launch(_launch(tmp_path, "env", attempt=attempt))
        _wait_dead(ex, h)
        ports.append(_env(tmp_path, 0)["MASTER_PORT"])
        assert _env(tmp_path, 1)["MASTER_PORT"] == ports[-1]
    assert ex.exit_code("j-gang", 2) == 0


def test_replicas_rendezvous_at_master_addr_and_port(tmp_path):
    ex = LocalExecutor(tmp_path / "jobs")
    h = ex.launch(_launch(tmp_path, "rendezvous"))
    _wait_dead(ex, h)
    assert ex.exit_code("j-gang", 1) == 0
    assert "rank 0 received: hello from rank 1 of 2" in ex.replica_log_path("j-gang", 0).read_text()
    assert "[1] rank 1 sent its greeting" in ex.log_path("j-gang").read_text()


def test_one_replica_failing_fails_the_attempt_and_stops_the_others(tmp_path):
    ex = LocalExecutor(tmp_path / "jobs", gang_grace_s=10.0)
    h = ex.launch(_launch(tmp_path, "fail"))
    _wait_dead(ex, h)
    assert ex.exit_code("j-gang", 1) == 3
    assert ex.ended_on_its_own("j-gang", 1)  # a failure, not a stop: the job fails and never runs again
    work = tmp_path / "work"
    assert (work / "term-0").exists()  # rank 0 got the checkpoint signal...
    assert _gone(work / "pid-0")  # ...and is gone
    log = ex.log_path("j-gang").read_text()
    assert "[1] rank 1 gives up" in log
    assert "gpupool: replica 1 exited with code 3; stopping the other replicas" in log
    assert "[0] replica 0 checkpointed" in log


def test_a_replica_ignoring_the_checkpoint_signal_is_killed_after_the_grace(tmp_path):
    ex = LocalExecutor(tmp_path / "jobs", gang_grace_s=0.5)
    h = ex.launch(_launch(tmp_path, "stubborn"))
    _wait_dead(ex, h)
    assert ex.exit_code("j-gang", 1) == 3 and ex.ended_on_its_own("j-gang", 1)
    assert _gone(tmp_path / "work" / "pid-0")
    assert not (tmp_path / "work" / "term-0").exists()


async def test_pause_stops_every_replica_and_resume_restarts_all(tmp_path):
    ex = LocalExecutor(tmp_path / "jobs")
    work = tmp_path / "work"
    h = ex.launch(_launch(tmp_path, "wait"))
    _wait(lambda: (work / "ready-0").exists() and (work / "ready-1").exists(), what="both replicas ready")
    assert await ex.stop(h, 10.0)
    assert (work / "term-0").exists() and (work / "term-1").exists()
    assert ex.exit_code("j-gang", 1) == 0 and not ex.ended_on_its_own("j-gang", 1)  # a pause, not an end
    assert not group_members(h.pid)
    for f in work.glob("ready-*"):
        f.unlink()
    h2 = ex.launch(_launch(tmp_path, "wait", attempt=2))
    _wait(lambda: (work / "ready-0").exists() and (work / "ready-1").exists(), what="both replicas resumed")
    assert (work / "starts-0.txt").read_text().split() == ["0", "1"]  # started once, then resumed once
    assert (work / "starts-1.txt").read_text().split() == ["0", "1"]
    assert _env(tmp_path, 0)["GPUPOOL_ATTEMPT"] == _env(tmp_path, 1)["GPUPOOL_ATTEMPT"] == "2"
    # The signal the service sends the wrapper alone reaches every replica through the group.
    ex.request_stop(h2)
    _wait_dead(ex, h2)
    assert not ex.ended_on_its_own("j-gang", 2)
    assert _gone(work / "pid-0") and _gone(work / "pid-1")


def test_a_stop_after_every_replica_ended_does_not_change_the_result(tmp_path):
    ex = LocalExecutor(tmp_path / "jobs")
    h = ex.launch(_launch(tmp_path, "env"))
    _wait(lambda: ex.exit_code("j-gang", 1) is not None, what="the exit file")
    ex.request_stop(h)
    _wait_dead(ex, h)
    assert ex.exit_code("j-gang", 1) == 0 and ex.ended_on_its_own("j-gang", 1)


SERVICE = r"""
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[3])
from tests.service.test_gang_executor import _launch
from gpupool.backends.local.executor import LocalExecutor
tmp = Path(sys.argv[1]); record = Path(sys.argv[2])
h = LocalExecutor(tmp / "jobs").launch(_launch(tmp, "wait"))
record.write_text(f"{h.pid} {h.start_time}")
import time
time.sleep(300)
"""


async def test_a_gang_is_adopted_after_the_service_is_killed(tmp_path):
    """kill -9 of the process that launched the gang: a new executor adopts it; no replica starts twice."""
    record = tmp_path / "record"
    repo = str(Path(__file__).resolve().parents[2])
    svc = subprocess.Popen([PY, "-c", SERVICE, str(tmp_path), str(record), repo])
    work = tmp_path / "work"
    try:
        _wait(lambda: (work / "ready-0").exists() and (work / "ready-1").exists(), what="both replicas ready")
    finally:
        svc.send_signal(signal.SIGKILL)
        svc.wait()
    pid, start = (int(x) for x in record.read_text().split())
    ex = LocalExecutor(tmp_path / "jobs")
    found = ex.recover("j-gang", 1, pid, start)
    assert found.outcome == "running" and ex.alive(found.handle)
    unrecorded = ex.recover("j-gang", 1, None, None)  # the store never got the pid: found by the run files
    assert unrecorded.outcome == "running" and unrecorded.handle.pid == pid
    assert await ex.stop(found.handle, 10.0)
    assert (work / "term-0").exists() and (work / "term-1").exists()
    assert (work / "starts-0.txt").read_text().split() == ["0"]
    assert (work / "starts-1.txt").read_text().split() == ["0"]
    assert ex.exit_code("j-gang", 1) == 0 and not ex.ended_on_its_own("j-gang", 1)
    assert _gone(work / "pid-0") and _gone(work / "pid-1")


def test_gang_env_overrides_the_service_environment(tmp_path, monkeypatch):
    """A RANK or WORLD_SIZE left in the service's own environment never leaks into a replica."""
    monkeypatch.setenv("RANK", "7")
    monkeypatch.setenv("WORLD_SIZE", "99")
    ex = LocalExecutor(tmp_path / "jobs")
    h = ex.launch(_launch(tmp_path, "env", n=3))
    _wait_dead(ex, h)
    assert [_env(tmp_path, k)["RANK"] for k in range(3)] == ["0", "1", "2"]
    assert {_env(tmp_path, k)["WORLD_SIZE"] for k in range(3)} == {"3"}
    assert os.environ["RANK"] == "7"


# ---------------------------------------------------------------- through the whole service
POOL = "node-a=2xA100-80GB;node-b=2xA100-80GB"
SETTINGS = {"tick_s": 0.2, "poll_s": 0.05, "pause_grace_s": 5.0, "min_runtime_s": 0.0, "resume_backoff_s": 0.0,
            "on_shutdown": "stop"}


def _ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}"
    return result.stdout


def _submit(srv, work: Path, mode: str, replicas: int = 2) -> str:
    script = work.parent / "replica.py"
    script.write_text(REPLICA)
    work.mkdir(parents=True, exist_ok=True)
    spec = {"project": "p", "kind": "train", "gpus": 2, "replicas": replicas, "workdir": str(work),
            "command": [PY, str(script), mode]}
    status, job = http("POST", srv.url + "/api/v1/jobs", srv.admin_token, spec)
    assert status == 201, job
    return str(job["id"])


def _job(srv, job_id: str) -> dict:
    status, job = http("GET", f"{srv.url}/api/v1/jobs/{job_id}", srv.admin_token)
    assert status == 200, job
    return job


def _log(srv, job_id: str, replica: str | None = None) -> tuple[int, dict]:
    query = "" if replica is None else f"?replica={replica}"
    return http("GET", f"{srv.url}/api/v1/jobs/{job_id}/logs{query}", srv.admin_token)


def test_a_gang_through_the_service_logs_kill9_pause_resume_and_failure(tmp_path):
    """What a user sees: a 2 x 2-GPU job on two simulated nodes, from submit to resume, across a kill -9."""
    srv = ServeProcess(tmp_path / "state", tmp_path, simulate=POOL, settings=SETTINGS).start()
    try:
        _ok(gpupool(["projects", "set", "p", "--guarantee", "4"], srv.env()))
        work = tmp_path / "gang"
        job_id = _submit(srv, work, "wait")
        wait_until(lambda: (work / "ready-0").exists() and (work / "ready-1").exists(), 60, what="both replicas")
        job = _job(srv, job_id)
        assert job["state"] == "running" and job["attempts"] == 1
        by_rank = {r["rank"]: r for r in job["assignment"]["replicas"]}
        assert {by_rank[0]["node"], by_rank[1]["node"]} == {"node-a", "node-b"}
        for k in (0, 1):  # each replica sees the GPUs of its own node, and the rendezvous of the gang
            env = json.loads((work / f"env-{k}.json").read_text())
            assert env["CUDA_VISIBLE_DEVICES"] == ",".join(g["id"] for g in by_rank[k]["gpus"])
            assert (env["RANK"], env["WORLD_SIZE"], env["MASTER_ADDR"]) == (str(k), "2", "127.0.0.1")
        assert json.loads((work / "env-0.json").read_text())["MASTER_PORT"] == \
            json.loads((work / "env-1.json").read_text())["MASTER_PORT"]

        # Logs: all replicas prefixed, or one replica alone; a replica out of range is a 400.
        wait_until(lambda: "[1] replica 1 waiting" in _log(srv, job_id)[1]["data"], 30, what="the job log")
        assert "[0] replica 0 waiting" in _log(srv, job_id)[1]["data"]
        status, one = _log(srv, job_id, "1")
        assert status == 200 and "replica 1 waiting" in one["data"] and "replica 0" not in one["data"]
        for bad in ("2", "-1", "x"):
            status, err = _log(srv, job_id, bad)
            assert status == 400, (bad, status, err)
        assert "from 0 to 1" in _log(srv, job_id, "2")[1]["error"]
        out = _ok(gpupool(["logs", job_id, "--replica", "0"], srv.env()))
        assert "replica 0 waiting" in out and "replica 1" not in out
        bad = gpupool(["logs", job_id, "--replica", "5"], srv.env())
        assert bad.returncode != 0 and "replica must be a whole number from 0 to 1" in bad.stderr

        # kill -9 of the service while the gang runs: adopted on restart, no replica started twice.
        srv.kill9()
        srv.start(port=srv.port)
        job = _job(srv, job_id)
        assert job["state"] == "running" and job["attempts"] == 1
        time.sleep(1.0)  # several monitor passes of the restarted service
        assert _job(srv, job_id)["state"] == "running"
        assert [(work / f"starts-{k}.txt").read_text().split() for k in (0, 1)] == [["0"], ["0"]]

        # Pause stops every replica; resume restarts them all with GPUPOOL_RESUME=1.
        _ok(gpupool(["pause", job_id], srv.env()))
        wait_until(lambda: _job(srv, job_id)["state"] == "paused", 30, what="the pause")
        assert (work / "term-0").exists() and (work / "term-1").exists()
        assert _gone(work / "pid-0") and _gone(work / "pid-1")
        for f in work.glob("ready-*"):
            f.unlink()
        _ok(gpupool(["resume", job_id], srv.env()))
        wait_until(lambda: (work / "ready-0").exists() and (work / "ready-1").exists(), 60, what="the resume")
        assert [(work / f"starts-{k}.txt").read_text().split() for k in (0, 1)] == [["0", "1"], ["0", "1"]]
        assert _job(srv, job_id)["attempts"] == 2
        _ok(gpupool(["cancel", job_id], srv.env()))
        wait_until(lambda: _job(srv, job_id)["state"] == "cancelled", 30, what="the cancel")

        # One replica failing fails the job with its exit code; the other is stopped.
        failing = tmp_path / "failing"
        fail_id = _submit(srv, failing, "fail")
        job = wait_until(lambda: (j := _job(srv, fail_id))["state"] in ("failed", "succeeded") and j, 60,
                         what="the failing gang to end")
        assert job["state"] == "failed" and job["exit_code"] == 3, job
        assert (failing / "term-0").exists() and _gone(failing / "pid-0")
        assert "gpupool: replica 1 exited with code 3" in _log(srv, fail_id)[1]["data"]

        # A one-replica job: replica 0 is its whole log, any other a 400.
        solo = tmp_path / "solo"
        solo.mkdir()
        status, job = http("POST", srv.url + "/api/v1/jobs", srv.admin_token,
                           {"project": "p", "kind": "train", "gpus": 1, "workdir": str(solo),
                            "command": [PY, "-c", "print('solo output')"]})
        assert status == 201
        wait_until(lambda: _job(srv, job["id"])["state"] == "succeeded", 60, what="the solo job")
        assert "solo output" in _log(srv, job["id"], "0")[1]["data"]
        assert _log(srv, job["id"], "1")[0] == 400
    finally:
        srv.stop()


# ---------------------------------------------------------------- as the job owner's Unix account (root service)
AS_OWNER = (  # sh, not Python: the account may not enter this checkout's virtual environment
    'echo "rank $RANK uid $(id -u) cwd $(pwd)"; '
    'if cat "$0" >/dev/null 2>&1; then echo "rank $RANK read the spec"; else echo "rank $RANK cannot read the spec"; fi'
)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("useradd") is None,
                    reason="running replicas as another Unix account needs root and useradd")
def test_replicas_run_as_the_owner_and_their_logs_are_the_owners():
    name = "gpt-gang"
    try:
        pwd.getpwnam(name)
        made = False
    except KeyError:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", name], check=True)
        made = True
    base = Path(tempfile.mkdtemp(prefix="gpupool-gang-"))
    try:
        os.chmod(base, 0o755)
        account = pwd.getpwnam(name)
        ex = LocalExecutor(base / "jobs", traversable=True, run_jobs_as="owner")
        spec = base / "jobs" / "j-own" / "run" / "attempt-1.gang"
        launch = Launch("j-own", 1, ["sh", "-c", AS_OWNER, str(spec)], str(ex.default_workdir("j-own")), name, "p",
                        replicas=tuple(ReplicaLaunch(k, f"node-{k}", {"GPUPOOL_RESUME": "0"}, {}) for k in range(2)))
        h = ex.launch(launch)
        _wait_dead(ex, h)
        assert ex.exit_code("j-own", 1) == 0
        assert spec.exists()
        for k in (0, 1):
            own = ex.replica_log_path("j-own", k)
            st = own.stat()
            assert (st.st_uid, st.st_mode & 0o777) == (account.pw_uid, 0o600)
            text = own.read_text()
            assert f"rank {k} uid {account.pw_uid} cwd {ex.default_workdir('j-own')}" in text
            assert f"rank {k} cannot read the spec" in text  # the service's run files stay out of the job's reach
        assert ex.log_path("j-own").stat().st_uid == account.pw_uid
    finally:
        shutil.rmtree(base, ignore_errors=True)
        if made:
            subprocess.run(["userdel", name], check=False)
