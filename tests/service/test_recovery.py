"""Crash recovery: the service runs in a subprocess and is killed with SIGKILL, then started again.

What must hold (the issue's promise): no job is lost or run twice, no GPU
share is given twice, processes the dead service started are adopted again,
a job that finished while the service was down is recorded as finished (not
rerun), and a job whose process vanished is requeued with a clear reason.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpupool.backends.local.executor import group_members

PY = sys.executable
ROOT = Path(__file__).resolve().parents[2]

LEDGER_JOB = r"""
import os, sys, time
jid, att, res = os.environ["GPUPOOL_JOB_ID"], os.environ["GPUPOOL_ATTEMPT"], os.environ["GPUPOOL_RESUME"]
def note(what):
    fd = os.open(os.environ["LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, f"{what} {jid} {att} {res} {time.time()} {os.environ['CUDA_VISIBLE_DEVICES']}\n".encode())
    os.close(fd)
note("start")
time.sleep(float(sys.argv[1]) if res == "0" else float(sys.argv[2]))
note("end")
"""


def _spec(ledger: Path, first: float, again: float = 0.1) -> dict:
    return {"project": "p", "gpus": 1, "command": [PY, "-c", LEDGER_JOB, str(first), str(again)],
            "env": {"LEDGER": str(ledger)}}


class Server:
    def __init__(self, state: Path, specs: list[dict], gpus: str = "2xA100-80GB") -> None:
        self.state = state
        self.specs_path = state.parent / "specs.json"
        self.specs_path.write_text(json.dumps(specs))
        self.gpus = gpus
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, env: dict[str, str] | None = None) -> None:
        (self.state / "server.ready").unlink(missing_ok=True)
        self.proc = subprocess.Popen([PY, "-m", "tests.service.crash_server", str(self.state), str(self.specs_path),
                                      self.gpus], cwd=str(ROOT), stdout=subprocess.DEVNULL,
                                     stderr=open(self.state.parent / "server.err", "ab"),
                                     env={**os.environ, **(env or {})})

    def wait_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while not (self.state / "server.ready").exists():
            assert self.proc is not None and self.proc.poll() is None, (self.state.parent / "server.err").read_text()
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait()

    def terminate(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _jobs(state: Path) -> dict[str, dict]:
    db = sqlite3.connect(f"file:{state / 'state.db'}?mode=ro", uri=True, timeout=10)
    try:
        db.row_factory = sqlite3.Row
        return {r["id"]: dict(r) for r in db.execute("SELECT * FROM jobs")}
    except sqlite3.OperationalError:
        return {}
    finally:
        db.close()


def _events(state: Path) -> list[dict]:
    db = sqlite3.connect(f"file:{state / 'state.db'}?mode=ro", uri=True, timeout=10)
    try:
        return [json.loads(r[0]) for r in db.execute("SELECT body FROM events ORDER BY seq")]
    finally:
        db.close()


def _wait(pred, timeout: float = 60, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def _ledger(path: Path) -> list[tuple[str, str, int, str, float, str]]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        what, jid, att, res, t, gpu = line.split()
        out.append((what, jid, int(att), res, float(t), gpu))
    return out


def _check_no_double_booking(ledger: list, killed_at: dict[tuple[str, int], float]) -> None:
    """Whole-GPU jobs: the run intervals on each GPU never overlap."""
    starts = {(j, a): (t, g) for w, j, a, _, t, g in ledger if w == "start"}
    ends = {(j, a): t for w, j, a, _, t, _ in ledger if w == "end"}
    by_gpu: dict[str, list[tuple[float, float, str]]] = {}
    for key, (t0, gpu) in starts.items():
        t1 = ends.get(key, killed_at.get(key, float("inf")))
        by_gpu.setdefault(gpu, []).append((t0, t1, f"{key}"))
    for gpu, spans in by_gpu.items():
        spans.sort()
        for (_a0, a1, ka), (b0, _b1, kb) in zip(spans, spans[1:], strict=False):
            assert b0 >= a1, f"GPU {gpu} given twice: {ka} until {a1} and {kb} from {b0}"


def _cleanup(state: Path) -> None:
    for job in _jobs(state).values():
        if job["pid"]:
            for pid in group_members(job["pid"]):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def test_restart_adopts_finishes_and_requeues(tmp_path):
    state = tmp_path / "state"
    state.mkdir()
    ledger = tmp_path / "ledger.txt"
    specs = [_spec(ledger, 4.0), _spec(ledger, 0.5), _spec(ledger, 60.0), _spec(ledger, 0.2), _spec(ledger, 0.2)]
    server = Server(state, specs, gpus="3xA100-80GB")
    try:
        server.start()
        server.wait_ready()
        adopted, finished_while_down, lost, q1, q2 = sorted(_jobs(state))
        _wait(lambda: sum(1 for w, *_ in _ledger(ledger) if w == "start") == 3, what="three jobs running")
        server.kill9()
        jobs = _jobs(state)
        assert [jobs[j]["state"] for j in (adopted, finished_while_down, lost, q1, q2)] == [
            "running", "running", "running", "queued", "queued"]
        # While the service is down: one job ends by itself, another one's processes vanish.
        _wait(lambda: any(w == "end" and j == finished_while_down for w, j, *_ in _ledger(ledger)), what="job end")
        lost_pid = jobs[lost]["pid"]
        os.killpg(lost_pid, signal.SIGKILL)
        killed_at = {(lost, 1): time.time()}
        _wait(lambda: not group_members(lost_pid), what="lost job gone")

        server.start()
        server.wait_ready()
        _wait(lambda: all(j["state"] == "succeeded" for j in _jobs(state).values()), timeout=90, what="all done")
        jobs = _jobs(state)
        led = _ledger(ledger)
        runs = {jid: [(a, r) for w, j, a, r, *_ in led if w == "start" and j == jid] for jid in jobs}
        assert runs[adopted] == [(1, "0")]  # adopted, not restarted
        assert runs[finished_while_down] == [(1, "0")]  # recorded from its exit file, not rerun
        assert runs[lost] == [(1, "0"), (2, "1")]  # requeued, resumed
        assert runs[q1] == [(1, "0")] and runs[q2] == [(1, "0")]
        assert jobs[lost]["attempts"] == 2 and jobs[adopted]["attempts"] == 1
        lost_events = [e for e in _events(state) if e.get("job_id") == lost and e.get("state") == "paused"]
        assert lost_events and "process lost during restart" in lost_events[0]["reason"]
        _check_no_double_booking(led, killed_at)
        server.terminate()
        assert all(not group_members(j["pid"] or 0) for j in jobs.values() if j["pid"])
        assert all(j["pid"] is None and j["assignment"] is None for j in jobs.values())  # shares released
    finally:
        server.terminate()
        _cleanup(state)


@pytest.mark.parametrize("seed", [1, 2])
def test_repeated_kill9_never_loses_or_doubles_jobs(tmp_path, seed):
    rng = random.Random(seed)
    state = tmp_path / "state"
    state.mkdir()
    ledger = tmp_path / "ledger.txt"
    specs = [_spec(ledger, rng.choice([0.1, 0.3, 0.6])) for _ in range(8)]
    server = Server(state, specs)
    try:
        for _ in range(4):
            server.start()
            server.wait_ready()
            time.sleep(rng.uniform(0.05, 0.8))
            server.kill9()
        server.start()
        server.wait_ready()
        _wait(lambda: len(_jobs(state)) == 8 and all(j["state"] == "succeeded" for j in _jobs(state).values()),
              timeout=120, what="all jobs done")
        led = _ledger(ledger)
        for jid in _jobs(state):
            starts = [x for x in led if x[0] == "start" and x[1] == jid]
            ends = [x for x in led if x[0] == "end" and x[1] == jid]
            # Only the service was killed, never a job: each job ran exactly once.
            assert len(starts) == 1 and len(ends) == 1, (jid, starts, ends)
        _check_no_double_booking(led, {})
    finally:
        server.terminate()
        _cleanup(state)


def test_a_state_is_never_committed_without_its_event(tmp_path):
    """The service dies just before writing a job's ``running`` event: after a restart the event stream
    still shows every state the job went through (state and event are one transaction)."""
    state = tmp_path / "state"
    state.mkdir()
    ledger = tmp_path / "ledger.txt"
    server = Server(state, [_spec(ledger, 0.3)])
    try:
        server.start(env={"GPUPOOL_TEST_DIE_AT_EVENT": "running"})
        _wait(lambda: server.proc is not None and server.proc.poll() is not None, what="the service to die")
        assert server.proc is not None and server.proc.returncode == 9
        server.start()
        server.wait_ready()
        _wait(lambda: [j["state"] for j in _jobs(state).values()] == ["succeeded"], what="the job to finish")
        (jid,) = _jobs(state)
        states = [e["state"] for e in _events(state) if e.get("job_id") == jid]
        assert states == ["queued", "running", "succeeded"], states
        assert [w for w, j, *_ in _ledger(ledger) if j == jid] == ["start", "end"]  # ran once
    finally:
        server.terminate()
        _cleanup(state)
