"""kill -9 `gpupool serve` in the middle of a run and start it again: no job lost, none run twice.

Running jobs keep running while the service is dead (they are not its
children's children in the same session); the restarted service re-adopts
them, records the exit of those that finished meanwhile, and starts the queued
ones. Each job writes every attempt's start into its output file, so a second
run would show.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from .servers import ServeProcess, gpupool, wait_until

VICTIM = str(Path(__file__).with_name("victim.py"))
SETTINGS = {"tick_s": 0.2, "poll_s": 0.05, "pause_grace_s": 5.0, "min_runtime_s": 0.5, "resume_backoff_s": 0.0,
            "on_shutdown": "stop"}


def ok(result) -> str:
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}"
    return result.stdout


def states(env) -> dict[str, dict]:
    return {j["id"]: j for j in json.loads(ok(gpupool(["list", "--all", "--json"], env)))}


def test_kill_9_and_restart_loses_nothing_and_runs_nothing_twice(tmp_path):
    srv = ServeProcess(tmp_path / "state", tmp_path, settings=SETTINGS).start()
    try:
        env = srv.env()
        ok(gpupool(["projects", "set", "A", "--guarantee", "4"], env))
        outs: dict[str, Path] = {}
        # One quick job that ends while the service is dead, five longer ones (one waits in the queue).
        for i, steps in enumerate([20, 80, 80, 80, 80, 80]):
            out = tmp_path / f"j{i}.out"
            line = ok(gpupool(["submit", "--project", "A", "--gpus", "1", "--", sys.executable, VICTIM,
                               str(tmp_path / f"j{i}.ckpt"), str(out), str(steps)], env))
            outs[line.split()[0]] = out
        before: dict[str, dict] = {}

        def four_running() -> bool:  # judged on the listing that showed them (a later one may have moved on)
            before.clear()
            before.update(states(env))
            return sum(j["state"] == "running" for j in before.values()) == 4

        wait_until(four_running, 60, 0.1, "four jobs to run")
        queued = [i for i, j in before.items() if j["state"] == "queued"]
        assert len(queued) == 2 or len(queued) == 1 and any(j["state"] == "succeeded" for j in before.values())

        srv.kill9()
        down = gpupool(["status"], env)
        assert down.returncode == 3 and "cannot reach the scheduler" in down.stderr
        time.sleep(2.0)  # the quick job ends while nobody watches

        srv.start(port=srv.port)
        env = srv.env()
        after = states(env)
        assert set(after) == set(outs)  # nothing lost, nothing invented
        wait_until(lambda: all(j["state"] == "succeeded" for j in states(env).values()), 90, 0.2,
                   "all jobs to succeed after the restart")
        final = states(env)
        for job_id, out in outs.items():
            result = json.loads(out.read_text())
            assert len(result["starts"]) == 1, (job_id, result)  # ran exactly once
            assert final[job_id]["attempts"] == 1 and final[job_id]["exit_code"] == 0
        assert len(ok(gpupool(["list", "--all"], env)).splitlines()) == 1 + len(outs)
    finally:
        if srv.proc is not None and srv.proc.poll() is None:
            for job in json.loads(gpupool(["list", "--json"], srv.env()).stdout or "[]"):
                gpupool(["cancel", job["id"]], srv.env())
        srv.stop()
