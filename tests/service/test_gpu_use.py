"""Allocated vs used (issue 26): the pid -> job mapping, the simulation hook, the downsampled history, the report."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from gpupool.inventory import GpuSample, sim_use
from gpupool.service.actor import Actor
from gpupool.service.gpu_use import JobUse, job_use
from gpupool.service.report import build_report
from gpupool.service.store import SCHEMA_VERSION, JobRecord, ProjectRecord, Store
from gpupool.service.use_history import UseHistory
from gpupool.wire.errors import InvalidRequest
from tests.service.helpers import older_store

HOUR = 3600 * 1000  # milli-GPU-seconds in a GPU-hour


def _job(num: int, project: str, user: str, kind: str, gpus: list[tuple[str, int]], state: str = "running",
         ) -> JobRecord:
    return JobRecord(id=f"j-{num:06d}", num=num, name=f"n{num}", project=project, user=user, kind=kind,
                     state=state, request={}, submitted_at=1.0,
                     assignment={"node": "h", "gpus": [{"id": g, "milli": m} for g, m in gpus]})


# ------------------------------------------------------------------ the mapping
def test_processes_map_to_their_jobs_and_use_is_capped_at_the_share():
    a = _job(1, "vision", "alice", "train", [("GPU-0", 1000), ("GPU-1", 1000)])
    k = _job(2, "vision", "bob", "build", [("GPU-2", 250)])
    burst = _job(3, "nlp", "bob", "build", [("GPU-2", 250)])
    blind = _job(4, "nlp", "carol", "train", [("GPU-3", 1000)])
    queued = _job(5, "nlp", "carol", "train", [("GPU-3", 1000)], state="queued")
    sample = {
        # job 1 runs two processes on GPU-0 (40 % + 30 %) and one on GPU-1 (90 %)
        "GPU-0": GpuSample(70.0, 5, {11: 2 << 30, 12: 1 << 30}, {11: 40.0, 12: 30.0}),
        "GPU-1": GpuSample(90.0, 5, {11: 3 << 30}, {11: 90.0}),
        # the kernel (job 2) uses 20 % of the GPU: 200 of its 250; job 3 bursts to 60 %: its 250; pid 99 is nobody's
        "GPU-2": GpuSample(85.0, 5, {21: 1 << 30, 31: 1 << 29, 99: 1}, {21: 20.0, 31: 60.0, 99: 5.0}),
        # a GPU that cannot measure processes: job 4 is allocated, unmeasured
        "GPU-3": GpuSample(None, None, {41: 1 << 30}, None),
    }
    owners = {11: "j-000001", 12: "j-000001", 21: "j-000002", 31: "j-000003", 41: "j-000004"}
    asked: list[int] = []

    def owner(pid: int) -> str | None:
        asked.append(pid)
        return owners.get(pid)

    got = job_use(sample, [a, k, burst, blind, queued], owner)
    assert got == {
        "j-000001": JobUse(2000, 2000, 700.0 + 900.0, (2 << 30) + (1 << 30) + (3 << 30)),
        "j-000002": JobUse(250, 250, 200.0, 1 << 30),
        "j-000003": JobUse(250, 250, 250.0, 1 << 29),
        "j-000004": JobUse(1000, 0, 0.0, 1 << 30),
    }
    assert sorted(asked) == [11, 12, 21, 31, 41, 99]  # each pid looked up once, though 11 is on two GPUs


def test_a_job_with_no_process_on_a_measured_gpu_is_idle_not_unmeasured():
    idle = _job(1, "p", "u", "build", [("GPU-0", 500)])
    assert job_use({"GPU-0": GpuSample(0.0, 0, {}, {})}, [idle], lambda pid: None) == {
        "j-000001": JobUse(500, 500, 0.0, 0)}
    assert job_use({}, [idle], lambda pid: None) == {"j-000001": JobUse(500, 0, 0.0, 0)}  # no sample at all


# ------------------------------------------------------------------ the simulation hook
def test_the_simulation_hook_is_read_as_nvml_would_report_the_process(tmp_path, monkeypatch):
    monkeypatch.setenv("GPUPOOL_SIM_USE_DIR", str(tmp_path))
    monkeypatch.setenv("GPUPOOL_SIMULATED", "1")
    monkeypatch.setenv("GPUPOOL_GPU_FRACTION", "0.25")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-a")
    import gpupool

    assert gpupool.sim_use(busy=0.8, memory=1 << 30) is True
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = tmp_path / f"{int(dead.stdout)}.json"
    gone.write_text('{"busy": 1, "fraction": 1, "gpus": ["GPU-a"]}')  # a process that has ended
    (tmp_path / "notes.txt").write_text("not a report")
    got = sim_use.read(tmp_path, ["GPU-a", "GPU-b"])
    me = os.getpid()
    assert got["GPU-a"].process_util == {me: pytest.approx(20.0)}  # 80 % of a quarter GPU = 20 % of the GPU
    assert got["GPU-a"].processes == {me: 1 << 30} and got["GPU-a"].utilization == pytest.approx(20.0)
    assert got["GPU-b"] == GpuSample(0.0, 0, {}, {})  # measured, nobody busy
    assert not gone.exists()  # the ended process's report is dropped
    with pytest.raises(ValueError):
        sim_use.report(1.5)
    monkeypatch.setenv("GPUPOOL_SIM_USE_DIR", str(tmp_path / "not-here"))
    assert gpupool.sim_use(busy=0.5) is False  # a folder that is not there (a pod elsewhere): no error
    monkeypatch.setenv("GPUPOOL_SIMULATED", "0")
    assert gpupool.sim_use(busy=0.5) is False  # real GPUs: NVML measures, the hook does nothing


# ------------------------------------------------------------------ history and report
def _store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "state.db")
    for name, members in (("vision", ["alice", "bob"]), ("nlp", ["bob"])):
        s.upsert_project(ProjectRecord(name, members=members, created_at=1.0))
    for num, project, user, kind in ((1, "vision", "alice", "train"), (2, "vision", "bob", "build"),
                                     (3, "nlp", "bob", "train")):
        s.insert_job(_job(num, project, user, kind, []))
    return s


def _drive(h: UseHistory, start: float) -> None:
    """Two minutes sampled every 5 s: job 1 (1 GPU) busy, then idle; job 2 (a quarter) at 40 %; job 3 unmeasured
    for the first minute only."""
    for i in range(25):  # t = start .. start + 120; the first sample starts the count
        t = start + 5 * i
        uses = {1: JobUse(1000, 1000, 1000.0 if i <= 12 else 0.0, (4 << 30) if i <= 12 else (1 << 30)),
                2: JobUse(250, 250, 100.0, 1 << 29)}
        if i <= 12:
            uses[3] = JobUse(500, 0, 0.0, 0)
        h.add(t, uses)
        h.flush(t)


EXPECTED = {  # (project, kind) -> (allocated, used, idle, unmeasured) in milli-GPU-seconds; hand-computed:
    ("nlp", "train"): (500 * 60, 0, 0, 500 * 60),  # half a GPU for 60 s, nothing measured
    ("vision", "build"): (250 * 120, 100 * 120, 150 * 120, 0),  # a quarter for 120 s at 40 % of it
    ("vision", "train"): (1000 * 120, 1000 * 60, 1000 * 60, 0),  # a GPU for 120 s, busy for the first 60
}


def _check(reply: dict, expected: dict) -> None:
    rows = {(r["project"], r["kind"]): r for r in reply["rows"]}
    assert set(rows) == set(expected)
    for key, (alloc, used, idle, unmeasured) in expected.items():
        r = rows[key]
        assert r["allocated_gpu_hours"] == pytest.approx(alloc / HOUR, abs=1e-6)
        assert r["used_gpu_hours"] == pytest.approx(used / HOUR, abs=1e-6)
        assert r["idle_gpu_hours"] == pytest.approx(idle / HOUR, abs=1e-6)
        assert r["unmeasured_gpu_hours"] == pytest.approx(unmeasured / HOUR, abs=1e-6)
        assert r["efficiency"] == (None if alloc == unmeasured else pytest.approx(used / (alloc - unmeasured)))


def test_the_report_matches_a_hand_computed_case_then_after_a_restart_and_the_roll_up(tmp_path):
    start = 1_000_000_200.0  # on a 5 min boundary
    s = _store(tmp_path)
    h = UseHistory(s)
    _drive(h, start)
    admin = Actor("admin", True)
    reply = build_report(admin, h, s, {p.name: p for p in s.projects()}, since=start - 60, by="project",
                         now=start + 125)
    _check(reply, EXPECTED)
    peak = {r["job_id"]: r["peak_memory"] for r in build_report(admin, h, s, {}, start - 60, "job", start + 125)["rows"]}
    assert peak == {"j-000001": 4 << 30, "j-000002": 1 << 29, "j-000003": 0}
    h.flush(start + 125, everything=True)  # what the core does at stop
    s.close()

    # a restart: a new store and history on the same file answer the same; two days later the 10 s rows have
    # been rolled up into 5 min rows and dropped, and the 5 min rows answer the same again
    s = Store(tmp_path / "state.db")
    h = UseHistory(s)
    projects = {p.name: p for p in s.projects()}
    _check(build_report(admin, h, s, projects, start - 60, "project", start + 125), EXPECTED)
    later = start + 2 * 86400
    h.flush(later)
    res = dict(s.query("SELECT res, COUNT(*) FROM gpu_use GROUP BY res").__iter__())
    assert res == {300: 4}  # one 5 min row per job and one of the seconds sampled, no 10 s row left
    _check(build_report(admin, h, s, projects, start - 60, "project", later), EXPECTED)
    s.close()


def test_a_user_sees_their_own_jobs_and_their_projects_totals(tmp_path):
    start = 1_000_000_200.0
    s = _store(tmp_path)
    h = UseHistory(s)
    _drive(h, start)
    projects = {p.name: p for p in s.projects()}

    def rows(actor: Actor, by: str) -> list[tuple[str, str]]:
        key = "job_id" if by == "job" else by
        return [(r[key], r["kind"]) for r in build_report(actor, h, s, projects, start - 60, by, start + 125)["rows"]]

    alice, bob = Actor("alice"), Actor("bob")
    assert rows(alice, "job") == [("j-000001", "train")]
    assert rows(alice, "user") == [("alice", "train")]
    assert rows(alice, "project") == [("vision", "build"), ("vision", "train")]  # bob's kernel counts in vision
    assert rows(bob, "project") == [("nlp", "train"), ("vision", "build"), ("vision", "train")]
    assert rows(Actor("admin", True), "user") == [("alice", "train"), ("bob", "build"), ("bob", "train")]
    with pytest.raises(InvalidRequest):
        build_report(alice, h, s, projects, start, "team", start + 1)
    with pytest.raises(InvalidRequest):
        build_report(alice, h, s, projects, "yesterday", "job", start + 1)


def test_history_stays_bounded_by_its_resolutions(tmp_path):
    """Three days of one job sampled every 10 s keep one day of 10 s rows and every 5 min row (each bucket's
    row of the seconds sampled in it too)."""
    s = _store(tmp_path)
    h = UseHistory(s)
    start = 1_000_000_200.0
    for i in range(3 * 8640 + 1):
        t = start + 10 * i
        h.add(t, {1: JobUse(1000, 1000, 500.0, 0)})
        if i % 30 == 0:
            h.flush(t)
    counts = dict(s.query("SELECT res, COUNT(*) FROM gpu_use GROUP BY res").__iter__())
    assert 2 * 8640 <= counts[10] <= 2 * (8640 + 60) and counts[300] == 2 * 3 * 288
    end = start + 3 * 86400 + 5
    total = h.totals(start - 1, end)[1]
    assert total.alloc == pytest.approx(1000 * 3 * 86400) and total.used == pytest.approx(500 * 3 * 86400)
    # a range reaching back past the 10 s rows: 5 min rows, then the 10 s rows since the last roll-up
    assert h.totals(start + 1.5 * 86400, end)[1].used == pytest.approx(500 * 1.5 * 86400)
    # a range within the last day: 10 s rows alone (a start rounds down to its 10 s bucket)
    assert h.totals(start + 3 * 86400 - 3605, end)[1].used == pytest.approx(500 * 3610)


def test_an_older_store_gets_the_use_table_in_place(tmp_path):
    table = ("CREATE TABLE IF NOT EXISTS gpu_use (res INTEGER NOT NULL, t INTEGER NOT NULL, job INTEGER NOT NULL,\n"
             "    alloc INTEGER NOT NULL, measured INTEGER NOT NULL, used INTEGER NOT NULL, peak_mem INTEGER NOT NULL,\n"
             "    PRIMARY KEY (res, t, job)) WITHOUT ROWID;\n")
    older_store(tmp_path / "state.db", table)
    db = sqlite3.connect(tmp_path / "state.db")
    db.execute("INSERT INTO meta(key, value) VALUES ('schema_version', '1')")
    db.commit()
    assert "gpu_use" not in {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
    db.close()
    s = Store(tmp_path / "state.db")
    assert s.job("j-000001") is not None and s.get_meta("schema_version") == str(SCHEMA_VERSION) == "2"
    h = UseHistory(s)
    h.add(100.0, {1: JobUse(1000, 1000, 1000.0, 0)})
    h.add(105.0, {1: JobUse(1000, 1000, 1000.0, 0)})
    h.flush(200.0)
    assert h.totals(0.0, 200.0)[1].used == pytest.approx(5000)
    s.close()


def test_nvml_per_process_use_reads_the_samples_since_the_last_call():
    """Each process's mean SM use over the samples NVML kept since the last read; NOT_FOUND is "nobody busy",
    NOT_SUPPORTED is "not measured"."""
    import types

    from gpupool.inventory.nvml import NvmlInventory

    class Err(Exception):
        def __init__(self, value: int) -> None:
            self.value = value

    answers: list[object] = []
    asked: list[int] = []

    def get(handle: object, since: int) -> object:
        asked.append(since)
        answer = answers.pop(0)
        if isinstance(answer, Err):
            raise answer
        return answer

    inv = object.__new__(NvmlInventory)
    inv._nv = types.SimpleNamespace(nvmlDeviceGetProcessUtilization=get, NVML_ERROR_NOT_FOUND=6)
    inv._util_seen, inv._util_cache = {}, {}
    row = lambda pid, ts, sm: types.SimpleNamespace(pid=pid, timeStamp=ts, smUtil=sm)  # noqa: E731
    answers[:] = [[row(7, 100, 40), row(7, 200, 60), row(8, 150, 10)], Err(6), Err(3), [row(7, 250, 30)]]
    assert inv._read_process_util("GPU-0", None) == {7: 50.0, 8: 10.0}
    assert inv._read_process_util("GPU-0", None) == {}
    assert inv._read_process_util("GPU-0", None) is None
    assert inv._process_util("GPU-0", None) == {7: 30.0}
    assert inv._process_util("GPU-0", None) == {7: 30.0}  # a second read at once (the Pool view) reuses the first
    assert asked == [0, 200, 200, 200]


def test_the_use_counters_keep_a_bounded_number_of_project_labels(monkeypatch):
    from gpupool.service import metrics as metrics_module

    monkeypatch.setattr(metrics_module, "MAX_USE_PROJECTS", 2)
    m = metrics_module.Metrics()
    m.count_use({("a", "train"): (10.0, 10.0, 4.0), ("b", "build"): (1.0, 0.0, 0.0)})
    m.count_use({("c", "train"): (5.0, 5.0, 5.0), ("d", "train"): (1.0, 1.0, 0.0), ("a", "train"): (1.0, 1.0, 1.0)})
    value = lambda p, k, w: m.registry.get_sample_value(  # noqa: E731
        "gpupool_project_gpu_seconds_total", {"project": p, "kind": k, "what": w})
    assert value("a", "train", "allocated") == 11.0 and value("a", "train", "used") == 5.0
    assert value("b", "build", "measured") is None  # nothing measured: no series
    assert value("(other)", "train", "allocated") == 6.0 and value("c", "train", "allocated") is None


def test_the_keeping_settings_are_checked_when_read(tmp_path):
    from gpupool.service.config import ServiceConfig

    assert ServiceConfig(state_dir=tmp_path, use_coarse_keep_s=7 * 86400).use_coarse_keep_s == 7 * 86400
    for bad in ({"use_fine_keep_s": 10}, {"use_fine_keep_s": 86400, "use_coarse_keep_s": 3600},
                {"use_coarse_keep_s": "90d"}):
        with pytest.raises(InvalidRequest, match="use_fine_keep_s"):
            ServiceConfig(state_dir=tmp_path, **bad)


def test_a_gap_between_samples_counts_nothing(tmp_path):
    """The service was down (or its loop stalled) between two samples: that time is unknown, not idle."""
    s = _store(tmp_path)
    h = UseHistory(s, max_gap_s=30)
    for t in (100.0, 110.0, 200.0, 210.0):  # 10 s counted, 90 s not, 10 s counted
        h.add(t, {1: JobUse(1000, 1000, 1000.0, 0)})
    assert h.totals(0.0, 300.0)[1].alloc == pytest.approx(20_000)
