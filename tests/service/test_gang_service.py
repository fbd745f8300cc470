"""Multi-node gangs in the service (issue 12): JobSpec replicas, the store, the Job JSON, and the cycle
that starts, waits, rejects and pauses a gang's replicas as one job on a real core with simulated nodes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpupool.backends.base import Launch
from gpupool.service.jobs import workloads_of
from gpupool.service.store import JobRecord, Store
from gpupool.service.validation import PoolLimits, validate_spec
from gpupool.wire.errors import InvalidRequest
from tests.service.helpers import ADMIN, ALICE, BOB, PY, older_store, started, wait_for

TWO_NODES = "node-a@rack1=8xA100-80GB;node-b@rack1=8xA100-80GB"
LIMITS = PoolLimits(models={"A100-80GB": 80 * 1024**3}, max_gpus={"build": 8, "train": 8}, cpu=16.0,
                    memory=64 * 1024**3, total_gpus=16, train_nodes=(8, 8))


def _spec(**fields: Any) -> dict[str, Any]:
    return {"project": "vision", "command": ["python", "train.py"], **fields}


# ---------------------------------------------------------------- validation
def test_replicas_default_to_one_and_a_gang_of_whole_gpus_is_kept():
    assert validate_spec(_spec(gpus=2), {"vision"}, LIMITS).replicas == 1
    assert validate_spec(_spec(gpus=2, replicas=None), {"vision"}, LIMITS).replicas == 1
    assert validate_spec(_spec(gpus=8, replicas=2), {"vision"}, LIMITS).replicas == 2
    assert validate_spec(_spec(gpus=1, replicas=16), {"vision"}, LIMITS).replicas == 16


@pytest.mark.parametrize("fields,fragment", [
    ({"gpus": 1, "replicas": 0}, "replicas must be a whole number from 1 to 64, not 0"),
    ({"gpus": 1, "replicas": 65}, "replicas must be a whole number from 1 to 64, not 65"),
    ({"gpus": 1, "replicas": "2"}, "replicas must be a whole number from 1 to 64"),
    ({"gpus": 1, "replicas": 1.5}, "replicas must be a whole number from 1 to 64"),
    ({"gpus": 1, "replicas": True}, "replicas must be a whole number from 1 to 64"),
    ({"gpu_fraction": 0.5, "replicas": 2}, "needs whole GPUs per replica (gpus >= 1), not gpu_fraction"),
    ({"gpu_memory": 2**30, "replicas": 2}, "needs whole GPUs per replica (gpus >= 1), not gpu_memory"),
    ({"replicas": 2}, "replicas=2 needs gpus"),
    ({"kind": "build", "command": None, "gpus": 1, "replicas": 2}, "replicas is for train jobs"),
    ({"gpus": 8, "replicas": 3}, "replicas=3 × gpus=8 does not fit this pool: its train nodes could hold at most 2"),
])
def test_bad_replicas_are_refused_with_the_rule(fields, fragment):
    with pytest.raises(InvalidRequest) as e:
        validate_spec(_spec(**fields), {"vision"}, LIMITS)
    assert fragment in e.value.message


# ---------------------------------------------------------------- the store and the policy's view
def _job(num: int, **kw: Any) -> JobRecord:
    base: dict[str, Any] = dict(id=f"j-{num:06d}", num=num, name="t", project="vision", user="alice", kind="train",
                                state="queued", request={"gpus": 8}, submitted_at=1.0, command=["true"])
    base.update(kw)
    return JobRecord(**base)


def test_a_store_from_before_replicas_is_upgraded_in_place(tmp_path: Path):
    """A state.db whose jobs table has no replicas column opens with its jobs as one replica each."""
    assert "replicas" not in older_store(tmp_path / "state.db", "    replicas INTEGER NOT NULL DEFAULT 1,\n")
    s = Store(tmp_path / "state.db")
    assert s.job("j-000001").replicas == 1  # type: ignore[union-attr]
    s.insert_job(_job(2, replicas=4))
    s.close()
    again = Store(tmp_path / "state.db")
    assert again.job("j-000002").replicas == 4  # type: ignore[union-attr]
    again.close()


def test_a_gang_job_is_one_workload_per_replica():
    queued = workloads_of(_job(7, replicas=2))
    assert [(w.id, w.gang, w.gang_size, w.request.gpus, w.assignment) for w in queued] == [
        ("j-000007/0", "j-000007", 2, 8, None), ("j-000007/1", "j-000007", 2, 8, None)]
    gpu = {"index": 0, "model": "A100-80GB", "milli": 1000, "memory_limit": 1}
    running = _job(7, replicas=2, state="running", started_at=5.0, assignment={
        "node": "node-a", "gpus": [{**gpu, "id": "a0"}, {**gpu, "id": "b0"}],
        "replicas": [{"rank": 0, "node": "node-a", "gpus": [{**gpu, "id": "a0"}]},
                     {"rank": 1, "node": "node-b", "gpus": [{**gpu, "id": "b0"}]}]})
    ws = workloads_of(running)
    assert [(w.assignment.node, w.assignment.gpus) for w in ws] == [  # type: ignore[union-attr]
        ("node-a", (("a0", 1000),)), ("node-b", (("b0", 1000),))]
    assert [w.id for w in workloads_of(_job(8))] == ["j-000008"]  # a plain job keeps its id


# ---------------------------------------------------------------- a real core on two simulated nodes
class RecordingExecutor:
    """Wraps the core's executor and keeps every Launch it was given (the rest is the real executor)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.launches: list[Launch] = []

    def launch(self, launch: Launch) -> Any:
        self.launches.append(launch)
        return self.inner.launch(launch)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


ENV_DUMP = ("import json, os, sys, time; "
            "open('env-' + os.environ.get('RANK', 'x') + '.json', 'w').write(json.dumps(dict(os.environ))); "
            "time.sleep(float(sys.argv[1]))")


async def _gang_core(make_core: Any, **overrides: Any) -> Any:
    core = await make_core(simulate=TWO_NODES, **overrides)
    core.executor = RecordingExecutor(core.executor)
    return core


async def test_two_by_eight_gpus_start_together_on_two_nodes(make_core, tmp_path: Path):
    core = await _gang_core(make_core)
    core.set_project(ADMIN, "vision", {"train_guarantee": 16})
    job, _ = await core.submit(ALICE, _spec(gpus=8, replicas=2, workdir=str(tmp_path),
                                            command=[PY, "-c", ENV_DUMP, "30"]))
    assert job["request"]["replicas"] == 2 and job["state"] == "queued"
    job = await started(core, job["id"])
    assert job["state"] == "running", job["reason"]
    assert job["reason"].startswith("starts 2 × 8 GPUs together on node-a, node-b within project vision's guarantee")
    a = job["assignment"]
    assert [(r["rank"], r["node"], len(r["gpus"])) for r in a["replicas"]] == [(0, "node-a", 8), (1, "node-b", 8)]
    assert a["node"] == "node-a" and [g["id"] for g in a["gpus"]] == [g["id"] for r in a["replicas"] for g in r["gpus"]]
    node_of = {g.id: n.name for n in core.pool_state.nodes for g in n.gpus}
    assert {node_of[g["id"]] for g in a["replicas"][1]["gpus"]} == {"node-b"}
    # one Launch with each rank's node, its own GPU environment and its own assignment
    (launch,) = core.executor.launches
    assert [(r.rank, r.node) for r in launch.replicas] == [(0, "node-a"), (1, "node-b")]
    for r, placed in zip(launch.replicas, a["replicas"], strict=True):
        assert r.assignment == {"node": placed["node"], "gpus": placed["gpus"]}
        assert r.gpu_env["CUDA_VISIBLE_DEVICES"] == ",".join(g["id"] for g in placed["gpus"])
    # the pool and the project count all 16 GPUs
    pool = core.pool()
    assert all(g["allocated"] == 1 and g["allocations"][0]["job_id"] == job["id"]
               for n in pool["nodes"] for g in n["gpus"])
    (vision,) = [p for p in core.list_projects() if p["name"] == "vision"]
    assert vision["usage"]["train"] == 16
    from prometheus_client import generate_latest

    metrics = generate_latest(core.registry).decode()
    assert 'gpupool_project_allocated_gpus{kind="train",project="vision"} 16.0' in metrics
    # what each replica's process saw (the local executor runs one process per replica)
    envs = await wait_for(lambda: _envs(tmp_path, 2), 20, "both replicas' env files")
    assert {e["RANK"] for e in envs} == {"0", "1"} and {e["WORLD_SIZE"] for e in envs} == {"2"}
    assert len({(e["MASTER_ADDR"], e["MASTER_PORT"]) for e in envs}) == 1
    assert {e["CUDA_VISIBLE_DEVICES"] for e in envs} == {
        ",".join(g["id"] for g in r["gpus"]) for r in a["replicas"]}


def _envs(workdir: Path, n: int) -> list[dict[str, str]] | None:
    files = sorted(workdir.glob("env-*.json"))
    if len(files) < n:
        return None
    try:
        return [json.loads(f.read_text()) for f in files]
    except ValueError:  # still being written
        return None


async def test_with_one_node_busy_neither_replica_starts_and_the_job_says_why(make_core, tmp_path: Path):
    core = await _gang_core(make_core)
    core.set_project(ADMIN, "vision", {"train_guarantee": 16})
    small, _ = await core.submit(BOB, _spec(gpus=1, command=[PY, "-c", "import time; time.sleep(60)"]))
    small = await started(core, small["id"])
    assert small["state"] == "running"
    gang, _ = await core.submit(ALICE, _spec(gpus=8, replicas=2, command=[PY, "-c", "pass"]))
    await wait_for(lambda: core.get_job(ADMIN, gang["id"])["reason"] != "queued", 10, "the gang's reason")
    gang = core.get_job(ADMIN, gang["id"])
    assert gang["state"] == "queued" and gang["assignment"] is None
    assert gang["reason"].startswith("2 × 8 GPUs: only 1 node has room for a replica (8 whole GPUs)")
    assert "all replicas start together or none" in gang["reason"]
    assert core.executor.launches[-1].job_id == small["id"]  # nothing of the gang was launched
    # the one-GPU job ends: the gang starts whole
    await core.cancel(BOB, small["id"])
    gang = await wait_for(lambda: (j := core.get_job(ADMIN, gang["id"]))["state"] == "running" and j, 20,
                          "the gang to start")
    assert [r["node"] for r in gang["assignment"]["replicas"]] == ["node-a", "node-b"]


async def test_a_gang_that_cannot_fit_is_refused_at_submit(make_core):
    core = await _gang_core(make_core)
    core.set_project(ADMIN, "vision", {})
    with pytest.raises(InvalidRequest) as e:
        await core.submit(ALICE, _spec(gpus=8, replicas=3))
    assert "could hold at most 2 replicas of 8 GPUs even when idle" in e.value.message
    with pytest.raises(InvalidRequest):
        await core.submit(ALICE, _spec(gpus=9, replicas=2))  # more than one node has
    assert core.list_jobs(ADMIN) == []


# Each replica appends "rank attempt resume" to starts.txt, then runs until SIGTERM (exits 0: checkpointed)
# or until a file named "finish" appears in its working directory.
GANG_WORKER = r"""
import os, signal, sys, time
with open("starts.txt", "a") as f:
    f.write(f"{os.environ['RANK']} {os.environ['GPUPOOL_ATTEMPT']} {os.environ['GPUPOOL_RESUME']}\n")
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
while not os.path.exists("finish"):
    time.sleep(0.05)
"""


def _starts(workdir: Path) -> list[tuple[str, str, str]]:
    path = workdir / "starts.txt"
    return sorted(tuple(line.split()) for line in path.read_text().splitlines()) if path.exists() else []


async def test_a_guaranteed_project_reclaims_a_whole_over_quota_gang(make_core, tmp_path: Path):
    core = await _gang_core(make_core)
    core.set_project(ADMIN, "research", {"train_guarantee": 0})
    core.set_project(ADMIN, "vision", {"train_guarantee": 8})
    wd = tmp_path / "gang"
    wd.mkdir()
    gang, _ = await core.submit(BOB, {"project": "research", "gpus": 8, "replicas": 2, "workdir": str(wd),
                                      "command": [PY, "-c", GANG_WORKER]})
    gang = await started(core, gang["id"])
    assert gang["state"] == "running" and gang["preemptible"] is True  # beyond research's guarantee of 0
    await wait_for(lambda: len(_starts(wd)) == 2, 20, "both replicas to start")
    (research,) = [p for p in core.list_projects() if p["name"] == "research"]
    assert research["usage"]["train"] == 16 and research["usage"]["train_over_quota"] == 16

    mine, _ = await core.submit(ALICE, _spec(gpus=8, command=[PY, "-c", "import time; time.sleep(1.5)"]))
    gang = await wait_for(lambda: (j := core.get_job(ADMIN, gang["id"]))["state"] == "paused" and j, 20,
                          "the gang to be paused")
    (paused,) = [e for e in core.events_since(0) if e.get("job_id") == gang["id"] and e.get("state") == "paused"]
    assert paused["reason"].startswith(f"paused gang {gang['id']} (all 2 replicas) to give GPUs back to project vision")
    assert gang["assignment"] is None and not gang["preemptible"]
    assert core.get_job(ADMIN, mine["id"])["state"] in ("running", "succeeded")
    # never half of it: no replica of the gang holds a GPU while it is paused
    assert not any(a["job_id"] == gang["id"] for n in core.pool()["nodes"] for g in n["gpus"]
                   for a in g["allocations"])
    # vision's job ends: the gang resumes whole (attempt 2, both ranks, GPUPOOL_RESUME=1)
    gang = await wait_for(lambda: (j := core.get_job(ADMIN, gang["id"]))["state"] == "running" and j, 30,
                          "the gang to resume")
    assert gang["attempts"] == 2 and gang["reason"].startswith("resumed (attempt 2): starts 2 × 8 GPUs together")
    await wait_for(lambda: len(_starts(wd)) == 4, 20, "both replicas to restart")
    assert _starts(wd) == [("0", "1", "0"), ("0", "2", "1"), ("1", "1", "0"), ("1", "2", "1")]
    (wd / "finish").touch()
    done = await wait_for(lambda: (j := core.get_job(ADMIN, gang["id"]))["state"] != "running" and j, 20,
                          "the gang to end")
    assert done["state"] == "succeeded" and done["exit_code"] == 0


async def test_a_running_gang_is_adopted_whole_after_a_service_restart(make_core, tmp_path: Path):
    state = tmp_path / "state"
    wd = tmp_path / "gang"
    wd.mkdir()
    first = await make_core(simulate=TWO_NODES, state_dir=state, on_shutdown="leave")
    first.set_project(ADMIN, "vision", {"train_guarantee": 16})
    gang, _ = await first.submit(ALICE, _spec(gpus=8, replicas=2, workdir=str(wd), command=[PY, "-c", GANG_WORKER]))
    gang = await started(first, gang["id"])
    await wait_for(lambda: len(_starts(wd)) == 2, 20, "both replicas to start")
    await first.stop()  # "leave": the replicas keep running

    again = await make_core(simulate=TWO_NODES, state_dir=state)
    adopted = again.get_job(ADMIN, gang["id"])
    assert adopted["state"] == "running" and adopted["attempts"] == 1
    assert adopted["assignment"] == gang["assignment"]  # the stored assignment holds every replica
    assert sum(g["allocated"] for n in again.pool()["nodes"] for g in n["gpus"]) == 16
    # its GPUs are still taken: a new job waits rather than getting one of them
    other, _ = await again.submit(BOB, _spec(gpus=1, command=[PY, "-c", "pass"]))
    await wait_for(lambda: again.get_job(ADMIN, other["id"])["reason"] != "queued", 10, "a decision")
    assert again.get_job(ADMIN, other["id"])["state"] == "queued"
    (wd / "finish").touch()
    done = await wait_for(lambda: (j := again.get_job(ADMIN, gang["id"]))["state"] != "running" and j, 20,
                          "the adopted gang to end")
    assert done["state"] == "succeeded" and _starts(wd) == [("0", "1", "0"), ("1", "1", "0")]  # never restarted
    await wait_for(lambda: again.get_job(ADMIN, other["id"])["state"] == "succeeded", 20, "the waiting job")


async def test_a_gang_whose_node_leaves_the_pool_is_stopped_whole(tmp_path: Path):
    """A cluster's node can leave (cordoned, deleted): the whole gang stops, naming that node."""
    from gpupool.app.backend import build_core, local_settings
    from gpupool.backends.local.backend import LocalBackend
    from tests.service.helpers import fast_config

    class ShrinkingPool(LocalBackend):
        """The simulated pool, where a test can take a node away (what a cluster backend's refresh reports)."""

        def __init__(self, *a: Any, **kw: Any) -> None:
            super().__init__(*a, **kw)
            self.changed = False

        def drop(self, name: str) -> None:
            gone = {g.id for n in self.nodes if n.name == name for g in n.gpus}
            self.nodes = tuple(n for n in self.nodes if n.name != name)
            self.gpus = {gid: g for gid, g in self.gpus.items() if gid not in gone}
            self.changed = True

        def refresh(self) -> bool:
            changed, self.changed = self.changed, False
            return changed

    config = fast_config(tmp_path / "state", simulate=TWO_NODES)
    backend = ShrinkingPool(local_settings(config))
    core = build_core(config, backend=backend)
    await core.start()
    try:
        core.set_project(ADMIN, "vision", {"train_guarantee": 16})
        wd = tmp_path / "gang"
        wd.mkdir()
        gang, _ = await core.submit(ALICE, _spec(gpus=8, replicas=2, workdir=str(wd),
                                                command=[PY, "-c", GANG_WORKER]))
        gang = await started(core, gang["id"])
        await wait_for(lambda: len(_starts(wd)) == 2, 20, "both replicas to start")
        backend.drop("node-b")
        gang = await wait_for(lambda: (j := core.get_job(ADMIN, gang["id"]))["state"] not in ("running", "paused")
                              and j, 20, "the gang to stop")
        (paused,) = [e for e in core.events_since(0) if e.get("job_id") == gang["id"] and e.get("state") == "paused"]
        assert paused["reason"] == "node node-b left the pool (cordoned, not ready or deleted); requeued"
        # one 8-GPU node is left: the policy refuses the gang whole (docs/policy.md rule 7) rather than run part
        assert [n.name for n in core.pool_state.nodes] == ["node-a"]
        assert gang["state"] == "rejected" and gang["assignment"] is None
        assert gang["reason"] == ("the train pool could hold at most 1 replicas of 8 whole GPUs on one node even "
                                  "empty; 2 × 8 GPUs needs 2")
        assert _starts(wd) == [("0", "1", "0"), ("1", "1", "0")]  # never restarted in part
    finally:
        await core.stop()


async def test_a_policy_that_places_part_of_a_gang_starts_nothing(tmp_path: Path):
    """The core never runs part of a gang, whatever the policy says: the first-fit fallback (used when the
    engine raises) knows no gangs and places the replicas that fit one by one."""
    from gpupool.app.backend import build_core
    from gpupool.service import fallback_policy
    from tests.service.helpers import fast_config

    core = build_core(fast_config(tmp_path / "state", simulate=TWO_NODES), policy=fallback_policy.schedule)
    core.executor = RecordingExecutor(core.executor)
    await core.start()
    try:
        core.set_project(ADMIN, "vision", {"train_guarantee": 16})
        small, _ = await core.submit(BOB, _spec(gpus=1, command=[PY, "-c", "import time; time.sleep(60)"]))
        assert (await started(core, small["id"]))["state"] == "running"
        gang, _ = await core.submit(ALICE, _spec(gpus=8, replicas=2, command=[PY, "-c", "pass"]))
        await wait_for(lambda: core.get_job(ADMIN, gang["id"])["reason"] != "queued", 10, "the gang's reason")
        for _ in range(3):  # several cycles: the fallback places replica 0 every time, the core never starts it
            core.cycles.run()
        assert core.get_job(ADMIN, gang["id"])["state"] == "queued"
        assert [x.job_id for x in core.executor.launches] == [small["id"]]
        assert sum(g["allocated"] for n in core.pool()["nodes"] for g in n["gpus"]) == 1
        await core.cancel(BOB, small["id"])
        done = await wait_for(lambda: (j := core.get_job(ADMIN, gang["id"]))["state"] == "succeeded" and j, 20,
                              "the gang to run whole once both replicas fit")
        assert done["attempts"] == 1 and len(core.executor.launches[-1].replicas) == 2
    finally:
        await core.stop()


async def test_a_guaranteed_gang_reclaims_two_nodes_and_starts_once_both_victims_stopped(make_core, tmp_path: Path):
    """A gang as claimant: both victims (one per node) take a second to checkpoint; the gang waits for them,
    saying so, and then starts whole."""
    from tests.service.helpers import SLOW_TO_STOP

    core = await _gang_core(make_core, pause_grace_s=5.0)
    core.set_project(ADMIN, "research", {"train_guarantee": 0})
    core.set_project(ADMIN, "vision", {"train_guarantee": 16})
    victims = []
    for k in range(2):
        wd = tmp_path / f"victim{k}"
        wd.mkdir()
        job, _ = await core.submit(BOB, {"project": "research", "gpus": 8, "workdir": str(wd),
                                         "command": [PY, "-c", SLOW_TO_STOP, "1.0"]})
        victims.append(job["id"])
        await wait_for(lambda wd=wd: (wd / "ready").exists(), 20, "a victim to be ready")
    gang, _ = await core.submit(ALICE, _spec(gpus=8, replicas=2, command=[PY, "-c", "import time; time.sleep(30)"]))
    running = await wait_for(lambda: (j := core.get_job(ADMIN, gang["id"]))["state"] == "running" and j, 30,
                             "the gang to start")
    assert all(core.get_job(ADMIN, v)["state"] == "paused" for v in victims)
    seq = {(e["job_id"], e["state"]): e["seq"] for e in core.events_since(0) if e.get("type") == "job"}
    assert max(seq[(v, "paused")] for v in victims) < seq[(gang["id"], "running")]  # no GPU was held twice
    assert [r["node"] for r in running["assignment"]["replicas"]] == ["node-a", "node-b"]
    launches = [x.job_id for x in core.executor.launches]
    assert launches.count(gang["id"]) == 1  # started once, whole, after both victims released their GPUs
    await core.cancel(ALICE, gang["id"])
