"""kill -9 of the scheduler while it creates and binds pods, 20 rounds: no pod twice, no job lost, no GPU given twice."""

from __future__ import annotations

import collections
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from gpupool.client import GpupoolClient
from tests.kube.cluster import Kubelet, wait
from tests.kube.test_serve_cli import TOKEN

ROUNDS = 20  # the count: each round is a service start (~2 s here), two submits and a kill -9
JOBS_PER_ROUND = 2
NODES = -(-ROUNDS * JOBS_PER_ROUND // 8)  # 8 GPUs each: room for every job at once (40 one-GPU jobs: 5 nodes)


def serve(tmp_path: Path, kubeconfig: Path, namespace: str) -> tuple[subprocess.Popen[str], str]:
    cfg = tmp_path / "fast.json"
    # one identity for every restart, as a pod's name is across its container's restarts: each takes its own
    # Lease back at once (a new identity would wait out the dead one's; tests/kube/test_leader.py does that)
    cfg.write_text('{"poll_s": 0.05, "tick_s": 0.2, "min_runtime_s": 0, "resume_backoff_s": 0, '
                   '"pause_grace_s": 2, "cycle_min_interval_s": 0, "kube_leader_identity": "crash-test-pod"}')
    proc = subprocess.Popen([sys.executable, "-m", "gpupool", "serve", "--port", "0", "--state-dir",
                             str(tmp_path / "state"), "--config", str(cfg), "--backend", "kubernetes",
                             "--kubeconfig", str(kubeconfig), "--namespace", namespace],
                            env={**os.environ, "GPUPOOL_ADMIN_TOKEN": TOKEN}, stdout=subprocess.PIPE,
                            stderr=open(tmp_path / "serve.log", "a"), text=True)  # kept for a failure's reader
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "listening on" in line, line
    return proc, line.split("listening on ")[1].split()[0]


def test_kill_9_during_binding_loses_nothing_and_duplicates_nothing(api: Any, namespace: str, gpu_nodes: Any,
                                                                    kubeconfig: Path, tmp_path: Path) -> None:
    gpu_nodes(NODES, gpus=8)
    rng = random.Random(14)
    ids: list[str] = []
    with Kubelet(api, namespace) as kubelet:
        for _ in range(ROUNDS):
            proc, url = serve(tmp_path, kubeconfig, namespace)
            c = GpupoolClient(url, TOKEN)
            wait(lambda c=c: len(c.pool()["nodes"]) == NODES, what="the nodes")
            c.set_project("vision", train_guarantee=NODES * 8)
            for _ in range(JOBS_PER_ROUND):
                ids.append(c.submit({"project": "vision", "gpus": 1, "command": ["python", "t.py"]})["id"])
            time.sleep(rng.uniform(0, 0.08))  # a random moment: creating, binding, or after
            proc.send_signal(signal.SIGKILL)
            proc.wait(10)
        proc, url = serve(tmp_path, kubeconfig, namespace)
        try:
            c = GpupoolClient(url, TOKEN)
            jobs = wait(lambda: (js := c.jobs(project="vision")) and all(j["state"] == "running" for j in js)
                        and len(js) == len(ids) and js, timeout=60, what="every job running")
            # a job is running from the moment its pod's create+bind begins: wait for the binds to land too
            pods = wait(lambda: (ps := api.list_namespaced_pod(namespace).items) and len(ps) == len(ids)
                        and all(p.spec.node_name for p in ps) and ps,
                        timeout=30, what="one bound pod per job, strays swept")
        finally:
            proc.send_signal(signal.SIGTERM)
            proc.wait(20)
    by_job = {j["id"]: j for j in jobs}
    assert sorted(by_job) == sorted(ids)  # none lost
    names = {p.metadata.name for p in pods}
    assert names == {f"gpupool-{j['id']}-{j['attempts']}" for j in jobs}  # each job's current attempt, no other
    for p in pods:
        job = by_job[p.metadata.labels["gpupool.io/job"]]
        assert p.spec.node_name == job["assignment"]["node"]
    started = collections.Counter(kubelet.started)
    assert max(started.values()) == 1  # no pod ran twice
    running_pods = collections.Counter(n.rsplit("-", 1)[0] for n in started)
    gpus = [g["id"] for j in jobs for g in j["assignment"]["gpus"]]
    assert len(gpus) == len(set(gpus)) == len(ids)  # no GPU given twice
    print(f"{len(ids)} jobs, {sum(running_pods.values())} pods started, attempts "
          f"{sorted(collections.Counter(j['attempts'] for j in jobs).items())}")
