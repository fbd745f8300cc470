"""What node agents' GPU use reports cost the scheduler (issue 26, Kubernetes): per report and per tick.

Run: ``python -m bench.node_use`` (``--rounds N``). Prints one table, at 64
nodes x 8 GPUs with 4 pods on every GPU (2,048 quarter-GPU pods, 32 per
report):

1. **Per report**: the CPU of a real ``gpupool serve`` (64 simulated nodes of
   8 GPUs, the node-agent token set) per ``POST /api/v1/nodes/{node}/use``,
   read from its ``/proc/<pid>/stat`` around ``rounds`` x 64 reports sent
   over one keep-alive connection (the HTTP parsing, the token check, the
   JSON Schema validation, the node and GPU checks); the service's idle CPU
   over as long (its own ticks) is measured first and taken off.
2. **Per tick**: :meth:`ReportedUse.sample` (64 fresh reports -> samples,
   pod UID -> job for 2,048 pods) + :func:`job_use` for the 2,048 running
   jobs, in-process, ``time.process_time``, median of the rounds.

Then the share of one core at the shipped settings: every node reporting
every 10 s, a tick every 5 s.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import tempfile
import time
import urllib.parse
import uuid
from pathlib import Path
from typing import Any

from bench._serve import ServeProcess
from gpupool.inventory.simulated import SimulatedInventory
from gpupool.policy.model import Gpu, Node
from gpupool.service.gpu_use import job_use
from gpupool.service.reported_use import NodeAgentActor, ReportedUse
from gpupool.service.store import JobRecord

NODES, GPUS, PODS_PER_GPU = 64, 8, 4
TOKEN = "bench-node-agent-token-0123456789"
ADMIN = "bench-admin-token"
INTERVAL_S, TICK_S = 10.0, 5.0


def node_names() -> list[str]:
    return [f"n{i:02d}" for i in range(NODES)]


def spec() -> str:
    return ";".join(f"{n}={GPUS}xA100-80GB" for n in node_names())


def gpu_ids() -> dict[str, list[str]]:
    return {n: [g.id for g in SimulatedInventory(f"{GPUS}xA100-80GB", node=n).gpus()] for n in node_names()}


def pod_uid(node: int, gpu: int, k: int) -> str:
    return str(uuid.UUID(int=(node << 16) | (gpu << 8) | k))


def body(node: int, ids: list[str]) -> dict[str, Any]:
    return {"interval_s": INTERVAL_S, "gpus": [
        {"id": gid, "index": g, "utilization": 60.0, "memory_used": 4 * PODS_PER_GPU << 30, "measured": True,
         "pods": [{"uid": pod_uid(node, g, k), "sm": 15.0, "memory": 4 << 30} for k in range(PODS_PER_GPU)]}
        for g, gid in enumerate(ids)]}


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def per_report(rounds: int) -> tuple[float, float]:
    """(CPU seconds of the service per report, wall seconds per report as the client saw it)."""
    ids = gpu_ids()
    bodies = [(n, json.dumps(body(i, ids[n])).encode()) for i, n in enumerate(node_names())]
    with tempfile.TemporaryDirectory() as tmp:
        serve = ServeProcess(Path(tmp) / "state", spec(), {"run_jobs_as": "service"}, ADMIN,
                             env={"GPUPOOL_NODE_AGENT_TOKEN": TOKEN})
        serve.start()
        try:
            assert serve.proc is not None
            pid = serve.proc.pid
            parts = urllib.parse.urlsplit(serve.url)
            conn = http.client.HTTPConnection(parts.hostname or "127.0.0.1", parts.port, timeout=30)
            headers = {"Authorization": f"token {TOKEN}", "Content-Type": "application/json"}

            def send_round() -> None:
                for node, data in bodies:
                    conn.request("POST", f"/api/v1/nodes/{node}/use", body=data, headers=headers)
                    reply = conn.getresponse()
                    answer = reply.read()
                    if reply.status != 200:
                        raise SystemExit(f"report refused: {reply.status} {answer[:300]!r}")

            send_round()  # warm: imports, schema validators built
            idle_t0, idle_c0 = time.perf_counter(), cpu_s(pid)
            time.sleep(3.0)
            idle_rate = (cpu_s(pid) - idle_c0) / (time.perf_counter() - idle_t0)
            t0, c0 = time.perf_counter(), cpu_s(pid)
            for _ in range(rounds):
                send_round()
            wall = time.perf_counter() - t0
            used = cpu_s(pid) - c0 - idle_rate * wall
            conn.close()
        finally:
            serve.stop()
    n = rounds * NODES
    return max(0.0, used) / n, wall / n


def per_tick(rounds: int) -> float:
    """CPU seconds of one tick's ReportedUse.sample() + job_use over every job, median."""
    ids = gpu_ids()
    nodes = tuple(Node(n, 64000, 512000, tuple(Gpu(id=gid, index=g, model="A100-80GB", memory_mib=81920)
                                               for g, gid in enumerate(ids[n]))) for n in node_names())
    jobs: list[JobRecord] = []
    pod_jobs: dict[str, str] = {}
    for i, n in enumerate(node_names()):
        for g, gid in enumerate(ids[n]):
            for k in range(PODS_PER_GPU):
                num = len(jobs) + 1
                jid = f"j-{num:06d}"
                jobs.append(JobRecord(id=jid, num=num, name="x", project="p", user="u", kind="train",
                                      state="running", request={},
                                      assignment={"node": n, "gpus": [{"id": gid, "milli": 250}]}))
                pod_jobs[pod_uid(i, g, k)] = jid
    ingest = ReportedUse(TOKEN, lambda: nodes, lambda: pod_jobs)
    actor = NodeAgentActor(user="gpupool:node-agent")
    for i, n in enumerate(node_names()):
        ingest.record(actor, n, body(i, ids[n]))
    times = []
    for _ in range(rounds):
        t0 = time.process_time()
        uses = job_use(ingest.sample(), jobs, lambda pid: None)
        times.append(time.process_time() - t0)
    assert len(uses) == len(jobs) and all(u.measured == 250 and u.used == 150.0 for u in uses.values())
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=20, help="rounds of 64 reports, and ticks timed (default 20)")
    args = ap.parse_args()
    report_cpu, report_wall = per_report(args.rounds)
    tick_cpu = per_tick(args.rounds)
    share = (NODES * report_cpu / INTERVAL_S + tick_cpu / TICK_S) * 100
    print(f"{NODES} nodes x {GPUS} GPUs, {PODS_PER_GPU} pods per GPU ({NODES * GPUS * PODS_PER_GPU} pods); "
          f"{args.rounds} rounds")
    print()
    print("| what | CPU | note |")
    print("|---|---:|---|")
    print(f"| one report (`gpupool serve`, HTTP in) | {report_cpu * 1e3:.2f} ms | "
          f"{report_wall * 1e3:.2f} ms wall per request, one connection |")
    print(f"| one tick: 64 reports -> samples -> per-job use | {tick_cpu * 1e3:.2f} ms | "
          f"{NODES * GPUS * PODS_PER_GPU} running jobs |")
    print(f"| share of one core, reports every {INTERVAL_S:g} s, a tick every {TICK_S:g} s | {share:.2f} % | |")


if __name__ == "__main__":
    main()
