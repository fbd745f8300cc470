"""`gpupool report` end to end: a real `gpupool serve` on simulated GPUs, a job that drives its own use, the CLI."""

from __future__ import annotations

import csv
import io
import json
import sys
import time

from .servers import ServeProcess, gpupool, http, wait_until

BUSY_THEN_IDLE = "import time, gpupool; gpupool.sim_use(busy=1.0); time.sleep(2); gpupool.sim_use(busy=0.0); time.sleep(2)"


def test_report_shows_each_users_allocated_used_and_idle_gpu_hours(tmp_path):
    srv = ServeProcess(tmp_path / "state", tmp_path, simulate="2xA100-80GB",
                       settings={"tick_s": 0.2, "history_interval_s": 0.2, "on_shutdown": "stop"}).start()
    try:
        admin = srv.env()
        assert gpupool(["projects", "set", "vision", "--guarantee", "2", "--members", "alice"],
                       admin).returncode == 0
        tokens = {u: gpupool(["tokens", "create", u], admin).stdout.strip() for u in ("alice", "bob")}
        alice, bob = srv.env(tokens["alice"]), srv.env(tokens["bob"])
        out = gpupool(["submit", "--project", "vision", "--gpus", "1", "--json", "--", sys.executable, "-c",
                       BUSY_THEN_IDLE], alice)
        assert out.returncode == 0, out.stderr
        job_id = json.loads(out.stdout)["id"]
        wait_until(lambda: json.loads(gpupool(["describe", job_id, "--json"], alice).stdout)["state"] == "succeeded",
                   timeout=60, what="the job to finish")
        time.sleep(0.5)  # a tick after its end

        table = gpupool(["report", "--since", "1h"], alice)
        assert table.returncode == 0, table.stderr
        assert "vision" in table.stdout and "train" in table.stdout and "EFFICIENCY" in table.stdout
        rows = list(csv.DictReader(io.StringIO(gpupool(["report", "--by", "job", "--since", "2h", "--csv"],
                                                       alice).stdout)))
        assert [(r["job_id"], r["project"], r["user"], r["kind"]) for r in rows] == [(job_id, "vision", "alice",
                                                                                       "train")]
        used, alloc = float(rows[0]["used_gpu_hours"]) * 3600, float(rows[0]["allocated_gpu_hours"]) * 3600
        assert 1.4 <= used <= 2.6 and alloc - used >= 1.4 and 0.25 <= float(rows[0]["efficiency"]) <= 0.6

        # Bob is no member of vision and ran nothing: he sees no row; the admin sees alice's
        assert json.loads(gpupool(["report", "--by", "project", "--json"], bob).stdout)["rows"] == []
        by_user = json.loads(gpupool(["report", "--by", "user", "--json"], admin).stdout)["rows"]
        assert [(r["user"], r["kind"]) for r in by_user] == [("alice", "train")]
        bad = gpupool(["report", "--since", "a while"], alice)
        assert bad.returncode == 2 and "not a duration" in bad.stderr
        assert http("GET", srv.url + "/api/v1/report")[0] == 401  # a token, like every endpoint
        status, reply = http("GET", srv.url + "/api/v1/report?by=team", tokens["alice"])
        assert status == 400 and "by must be one of" in reply["error"]
    finally:
        assert srv.stop() == 0
