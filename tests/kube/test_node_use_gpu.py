"""The node agent's NVML path on a real GPU (skipped where NVML is not usable): two CUDA processes, each
standing for a pod by its cgroup file under the agent's proc root, reported per pod as the agent sends it.

The busy process keeps the SMs busy with memsets, the other holds memory and
does nothing (tests/service/test_idle_nvml_gpu.py's children). The report
must name both pods with their memory, and, where the driver keeps
per-process accounting, the busy pod's SM share above the idle one's; where
it does not, the GPU must say ``measured: false`` (unmeasured, never idle).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gpupool.backends.kubernetes.node_use import UseReporter, use_source
from gpupool.inventory import nvml
from gpupool.inventory.nvml import nvml_usable
from gpupool.wire.schemas import validate
from tests.service.test_idle_nvml_gpu import HOLD

pytestmark = [pytest.mark.skipif(not nvml_usable(), reason="NVML is not usable on this machine (no NVIDIA driver)"),
              pytest.mark.timeout(120)]

PODS = {"busy": "11111111-2222-4333-8444-555555555555", "idle": "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"}


def test_the_agent_reports_real_cuda_processes_per_pod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(nvml, "UTIL_MIN_INTERVAL_S", 0.0)  # every report reads the per-process ring afresh
    gpus, sample, close = use_source(None, "gpu-node", None)
    gpu = gpus[0]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu.id}
    children = {what: subprocess.Popen([sys.executable, "-c", HOLD, what], stdout=subprocess.PIPE, text=True, env=env)
                for what in PODS}
    try:
        for what, child in children.items():
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
            (tmp_path / str(child.pid)).mkdir()
            (tmp_path / str(child.pid) / "cgroup").write_text(
                f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{PODS[what].replace('-', '_')}"
                ".slice/cri-containerd-0123.scope\n")
        reporter = UseReporter("http://unused", "gpu-node", lambda: "unused", gpus, sample, str(tmp_path), 1.0,
                               threading.Event())
        reporter.body()  # the per-process ring is read from here on
        sm = {what: 0.0 for what in PODS}
        measured = False
        for _ in range(6):
            time.sleep(1.0)
            body = reporter.body()
            validate("NodeUse", body, "report")
            (g,) = [g for g in body["gpus"] if g["id"] == gpu.id]
            pods = {p["uid"]: p for p in g["pods"]}
            processes = sample()[gpu.id].processes
            if processes and not {c.pid for c in children.values()} & set(processes):
                pytest.skip("NVML names other pids than ours: a PID namespace apart from the driver's")
            assert set(PODS.values()) <= set(pods), (pods, processes)
            if any(processes.values()):  # the driver tells each process's memory (not under every MIG setup)
                assert all(pods[uid]["memory"] >= 256 << 20 for uid in PODS.values()), pods
            measured = measured or g["measured"]
            for what, uid in PODS.items():
                sm[what] += pods[uid]["sm"]
        if measured:
            assert sm["busy"] > sm["idle"] + 1.0, sm
    finally:
        for child in children.values():
            child.kill()
            child.wait()
        close()
