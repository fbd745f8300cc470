"""Kill -9 load test: does a finished job ever run again, is a state ever missing from the events?

Runs `gpupool serve` (as in production, ``on_shutdown: leave``) for R rounds
on one state directory. Each round starts the service, submits J short
one-GPU jobs, sends random pauses, resumes and cancels while they run, and
kills the service with SIGKILL at a random moment; the jobs' processes live
on (the next start re-adopts them). After the last round the service runs to
the end: paused jobs are resumed until every job is final.

Every job appends ``start`` and ``end`` lines to a ledger; ``end`` is its
last act (``os._exit(0)`` right after). Counted at the end:

- reruns of a finished job: a ``start`` after the same job's ``end``;
- stops that won over an exit: a job ``paused``/``cancelled`` whose last
  attempt wrote ``end`` (its command had finished);
- jobs whose event stream lacks a state they were in (``running`` for a job
  that started; its final state);
- GPUs given twice: two whole-GPU jobs running on one GPU at once.

The service checks for ended processes every second (poll_s 1.0), and most
operations aim at running jobs, so stops often meet commands that just ended.
Prints one table. The issue that asked for it saw 25 reruns in ~1,900 jobs.

    .venv/bin/python bench/crash_load.py [--rounds 20] [--jobs 50] [--seed 1]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._serve import ServeProcess  # noqa: E402
from gpupool.client import GpupoolClient  # noqa: E402
from gpupool.wire.errors import GpupoolError  # noqa: E402

TOKEN = "crash-load-admin"
SETTINGS = {"tick_s": 0.5, "poll_s": 1.0, "pause_grace_s": 2.0, "min_runtime_s": 0.0, "resume_backoff_s": 0.0,
            "on_shutdown": "leave", "history_interval_s": 5.0, "watchdog": "off", "reply_wait_s": 0.2,
            "events_max_rows": 1_000_000}  # keep every event: the check reads them all
JOB = r"""
import os, sys, time
def note(what):
    fd = os.open(os.environ["LEDGER"], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    os.write(fd, f"{what} {os.environ['GPUPOOL_JOB_ID']} {os.environ['GPUPOOL_ATTEMPT']} {time.time()} "
                 f"{os.environ['CUDA_VISIBLE_DEVICES']}\n".encode())
    os.close(fd)
note("start")
time.sleep(float(sys.argv[1]))
note("end")
os._exit(0)
"""


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def one_round(client: GpupoolClient, rng: random.Random, ledger: Path, jobs: int, ids: list[str],
              aim: float) -> int:
    """Submit ``jobs`` jobs and poke random live ones until the kill; returns how many operations were sent."""
    for _ in range(jobs):
        spec = {"project": "p", "gpus": 1, "command": [sys.executable, "-c", JOB, f"{rng.uniform(0.05, 0.6):.3f}"],
                "env": {"LEDGER": str(ledger)}}
        ids.append(client.submit(spec)["id"])
    ops = 0
    until = time.monotonic() + rng.uniform(1.0, 3.0)
    running: list[str] = []
    while time.monotonic() < until:
        if ops % 5 == 0:  # aim at what runs now: a stop that meets a just-ended command is the case in question
            running = [j["id"] for j in client.jobs(state="running", limit=1000)]
        job = rng.choice(running) if running and rng.random() < aim else rng.choice(ids)
        action = rng.choices(["pause", "resume", "cancel"], weights=[5, 4, 1])[0]
        try:
            getattr(client, action)(job)
            ops += 1
        except GpupoolError:
            pass  # not live any more, or not paused: fine
        time.sleep(rng.uniform(0.0, 0.03))
    return ops


def drain(client: GpupoolClient, ids: list[str], timeout: float) -> None:
    """Resume what is paused until every job is final."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        live = [j for j in client.jobs(state="queued,running,paused", limit=10000)]
        if not live:
            return
        for j in live:
            if j["state"] == "paused":
                try:
                    client.resume(j["id"])
                except GpupoolError:
                    pass
        time.sleep(0.3)
    raise RuntimeError("jobs did not all finish")


def analyse(state: Path, ledger: Path) -> dict[str, Any]:
    db = sqlite3.connect(f"file:{state / 'state.db'}?mode=ro", uri=True)
    jobs = {r[0]: {"state": r[1], "exit_code": r[2]} for r in db.execute("SELECT id, state, exit_code FROM jobs")}
    events: dict[str, set[str]] = {}
    for (body,) in db.execute("SELECT body FROM events"):
        e = json.loads(body)
        if e.get("type") == "job":
            events.setdefault(e["job_id"], set()).add(e["state"])
    db.close()
    lines = [ln.split() for ln in ledger.read_text().splitlines()] if ledger.exists() else []
    by_job: dict[str, list[tuple[float, str, int, str]]] = {}
    for what, jid, att, t, gpu in lines:
        by_job.setdefault(jid, []).append((float(t), what, int(att), gpu))
    reruns = stop_won = missing_events = 0
    intervals: dict[str, list[tuple[float, float]]] = {}
    for jid, marks in by_job.items():
        marks.sort()
        ended_at = next((t for t, what, _, _ in marks if what == "end"), None)
        if ended_at is not None and any(what == "start" and t > ended_at for t, what, _, _ in marks):
            reruns += 1
        last_attempt = max(a for _, _, a, _ in marks)
        if jobs[jid]["state"] in ("paused", "cancelled") and any(
                what == "end" and a == last_attempt for _, what, a, _ in marks):
            stop_won += 1
        seen = events.get(jid, set())
        if "running" not in seen or jobs[jid]["state"] not in seen:
            missing_events += 1
            print(f"  {jid}: events {sorted(seen)}, state {jobs[jid]['state']}", file=sys.stderr)
        starts = {a: (t, gpu) for t, what, a, gpu in marks if what == "start"}
        ends = {a: t for t, what, a, _ in marks if what == "end"}
        for a, (t0, gpu) in starts.items():
            if a in ends:
                intervals.setdefault(gpu, []).append((t0, ends[a]))
    double = 0
    for spans in intervals.values():
        spans.sort()
        double += sum(1 for (_, a1), (b0, _) in zip(spans, spans[1:], strict=False) if b0 < a1)
    states: dict[str, int] = {}
    for j in jobs.values():
        states[j["state"]] = states.get(j["state"], 0) + 1
    return {"jobs": len(jobs), "ran": len(by_job), "states": states, "reruns": reruns, "stop_won": stop_won,
            "missing_events": missing_events, "double_booked": double}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--jobs", type=int, default=50, help="jobs submitted per round")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--poll-s", type=float, default=SETTINGS["poll_s"], help="how often ended processes are seen")
    ap.add_argument("--aim", type=float, default=0.8, help="share of operations aimed at running jobs")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="gpupool-crash-load-") as tmp:
        base = Path(tmp)
        state, ledger = base / "state", base / "ledger.txt"
        service = ServeProcess(state, "4xA100-80GB", {**SETTINGS, "poll_s": args.poll_s}, TOKEN,
                               env={"GPUPOOL_RUN_JOBS_AS": "service",
                                    "GPUPOOL_RUNTIME_DIR": str(base / "runtime")}, port=free_port())
        ids: list[str] = []
        ops = 0
        t0 = time.monotonic()
        for r in range(args.rounds):
            service.start()
            client = GpupoolClient(service.url, TOKEN)
            if r == 0:
                client.set_project("p", train_guarantee=4)
            ops += one_round(client, rng, ledger, args.jobs, ids, args.aim)
            service.kill9()
        service.start()
        try:
            drain(GpupoolClient(service.url, TOKEN), ids, timeout=900)
        finally:
            service.stop()
        result = analyse(state, ledger)
        took = time.monotonic() - t0
    print(f"kill -9 load test: {args.rounds} rounds x {args.jobs} jobs, seed {args.seed}, poll_s {args.poll_s}, "
          f"aim {args.aim}, "
          f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, {time.strftime('%Y-%m-%d')}")
    rows = [("jobs submitted", result["jobs"]), ("jobs that ran", result["ran"]),
            ("final states", ", ".join(f"{k} {v}" for k, v in sorted(result["states"].items()))),
            ("pause/resume/cancel calls", ops), ("service kills (SIGKILL)", args.rounds),
            ("reruns of a finished job", result["reruns"]),
            ("stops that won over a recorded end", result["stop_won"]),
            ("jobs missing a state in the events", result["missing_events"]),
            ("GPUs given twice", result["double_booked"]), ("wall time", f"{took:.0f} s")]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"  {k:<{width}}  {v}")
    bad = result["reruns"] + result["stop_won"] + result["missing_events"] + result["double_booked"]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
