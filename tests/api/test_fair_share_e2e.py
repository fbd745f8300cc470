"""Fair share over time, end to end through the `gpupool` CLI against a real `gpupool serve` (issue 15).

Project a ran 8 GPUs for a (simulated) day, b nothing. Both queue more
over-quota work than the free 8-GPU pool holds: b gets the idle GPUs first,
`gpupool describe` on a's waiting job says why, and `gpupool projects` shows
each project's recent use against its fair share.
"""

from __future__ import annotations

import json
import math
import re
import sys
import time

from gpupool.service.store import Store

from .servers import ServeProcess, gpupool, wait_until

DAY = 86400.0
SETTINGS = {"tick_s": 0.2, "poll_s": 0.05, "usage_half_life_s": DAY, "on_shutdown": "stop",
            "min_runtime_s": 0.0, "resume_backoff_s": 0.0}
SLEEP = [sys.executable, "-c", "import time; time.sleep(120)"]


def ok(result) -> str:
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr}"
    return result.stdout


def test_the_project_that_had_nothing_gets_the_idle_gpus_first_and_the_cli_says_why(tmp_path):
    state = tmp_path / "state"
    # a held 8 GPUs for the last day (with a one-day half-life: 4 GPUs on average lately)
    one_day_of_8 = 8000 * DAY / math.log(2) * (1 - 2 ** -1)
    store = Store(state / "state.db")
    store.save_usage(time.time(), [("a", "train", one_day_of_8)])
    store.close()
    srv = ServeProcess(state, tmp_path, simulate="8xA100-80GB", settings=SETTINGS).start()
    env = srv.env()
    try:
        for name in ("a", "b", "c"):
            ok(gpupool(["projects", "set", name, "--guarantee", "0"], env))
        blocker = json.loads(ok(gpupool(["submit", "--project", "c", "--gpus", "8", "--json", "--", *SLEEP], env)))
        wait_until(lambda: json.loads(ok(gpupool(["describe", blocker["id"], "--json"], env)))["state"] == "running",
                   what="the blocker running")
        jobs = {"a": [], "b": []}
        for name in ("a", "b"):  # a's jobs first: history, not submission order, decides
            for _ in range(8):
                job = json.loads(ok(gpupool(["submit", "--project", name, "--gpus", "1", "--json", "--", *SLEEP], env)))
                jobs[name].append(job["id"])
        ok(gpupool(["cancel", blocker["id"]], env))

        def running() -> dict[str, int] | None:
            listed = json.loads(ok(gpupool(["list", "--json"], env)))
            count = {"a": 0, "b": 0}
            for j in listed:
                if j["state"] == "running" and j["project"] in count:
                    count[j["project"]] += 1
            return count if sum(count.values()) == 8 else None

        count = wait_until(running, what="8 jobs of a and b running")
        assert count["b"] >= 5 and count["a"] <= 3, count  # without history: 4 and 4

        waiting = [j for j in json.loads(ok(gpupool(["list", "--json", "--project", "a"], env)))
                   if j["state"] == "queued"]
        shown = ok(gpupool(["describe", waiting[0]["id"]], env))
        assert "idle GPUs go first to projects that used less of their fair share lately" in shown
        assert "project a held 4 GPUs on average recently" in shown

        table = ok(gpupool(["projects"], env))
        assert "OF FAIR SHARE" in table
        rows = {line.split()[0]: line for line in table.splitlines()[1:] if line.strip()}
        # of a long-run share of 8/3 GPUs each (three projects, weight 1), the policy's measure: a runs
        # count["a"] GPUs now and held 4 on average lately, b runs count["b"] (e.g. both 225% at 2 and 6)
        expected = {"a": 100 * (count["a"] + 4) / (8 / 3), "b": 100 * count["b"] / (8 / 3)}
        shown = {name: int(re.search(r" (\d+)% of 2\.667 ", rows[name]).group(1)) for name in ("a", "b")}
        assert all(abs(shown[n] - expected[n]) <= 1 for n in shown), (shown, expected, table)
        assert "idle GPUs beyond guarantees go first to the projects lowest here" in table
        projects = {p["name"]: p for p in json.loads(ok(gpupool(["projects", "--json"], env)))}
        assert projects["a"]["fair_share"]["recent_gpus"] == 4.0
        assert abs(projects["a"]["fair_share"]["percent"] - expected["a"]) <= 1
    finally:
        for job in json.loads(ok(gpupool(["list", "--json"], env))):
            if job["state"] in ("queued", "running"):
                gpupool(["cancel", job["id"]], env)
        srv.stop()
