"""The node agent's report body: a sample's processes summed per pod and GPU, the rest left out."""

from __future__ import annotations

import subprocess
from pathlib import Path

from gpupool.backends.kubernetes.node_use import node_report
from gpupool.inventory import GpuInfo, GpuSample
from gpupool.inventory.cgroups import pod_uid_of_pid
from gpupool.wire.schemas import validate

POD_A = "11111111-2222-4333-8444-555555555555"
POD_B = "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"
GIB = 1 << 30
GPUS = [GpuInfo(f"GPU-{i}", i, "A100-80GB", 80 * GIB) for i in range(3)]


def test_processes_are_summed_per_pod_and_host_processes_left_out(tmp_path: Path) -> None:
    cgroups = {101: f"0::/kubepods/burstable/pod{POD_A}/c1", 102: f"0::/kubepods/burstable/pod{POD_A}/c2",
               201: f"0::/kubepods.slice/kubepods-pod{POD_B.replace('-', '_')}.slice/cri-containerd-x.scope",
               301: "0::/system.slice/nvidia-persistenced.service"}
    for pid, text in cgroups.items():
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "cgroup").write_text(text + "\n")
    asked: list[int] = []

    def pod_of(pid: int) -> str | None:
        asked.append(pid)
        return pod_uid_of_pid(pid, str(tmp_path))

    sample = {
        # two processes of pod A and one of pod B on GPU 0, a host process too
        "GPU-0": GpuSample(80.0, 9 * GIB, {101: 2 * GIB, 102: GIB, 201: 5 * GIB, 301: GIB},
                           {101: 30.0, 102: 10.0, 201: 35.0, 301: 5.0}),
        # NVML cannot read processes here: pod A's memory, no utilisation, not measured
        "GPU-1": GpuSample(None, GIB, {101: GIB}, None),
        # GPU-2 not in the sample at all (a read failed): not measured either
    }
    body = node_report(GPUS, sample, pod_of, 10.0)
    validate("NodeUse", body, "report")  # what the agent sends is what the scheduler accepts
    g0, g1, g2 = body["gpus"]
    assert g0 == {"id": "GPU-0", "index": 0, "utilization": 80.0, "memory_used": 9 * GIB, "measured": True,
                  "pods": [{"uid": POD_A, "sm": 40.0, "memory": 3 * GIB}, {"uid": POD_B, "sm": 35.0, "memory": 5 * GIB}]}
    assert (g1["measured"], g1["utilization"], g1["pods"]) == (False, None, [{"uid": POD_A, "sm": 0.0, "memory": GIB}])
    assert (g2["measured"], g2["pods"], g2["memory_used"]) == (False, [], None)
    assert sorted(asked) == [101, 102, 201, 301]  # each pid's cgroup read once, whatever its GPUs
    assert body["interval_s"] == 10.0


def _agent(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    import os
    import sys

    kubeconfig = tmp_path / "kubeconfig"  # a cluster that is never reached: these fail before any call
    kubeconfig.write_text("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]"
                          "\nusers: [{name: u, user: {token: x}}]\ncontexts: [{name: c, context: {cluster: c, user: u}}]"
                          "\ncurrent-context: c\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_NODE_AGENT_TOKEN")}
    return subprocess.run([sys.executable, "-m", "gpupool", "node-agent", "--kubeconfig", str(kubeconfig),
                           "--node", "n1", "--simulate", "2xA100-80GB", "--scheduler", "http://127.0.0.1:1", *args],
                          capture_output=True, text=True, timeout=60, env=env)


def test_reporting_without_a_token_or_with_an_unreadable_one_is_said_and_exits(tmp_path: Path) -> None:
    done = _agent(tmp_path)
    assert done.returncode == 2 and "--scheduler needs a token" in done.stderr, done.stderr
    done = _agent(tmp_path, "--token-file", str(tmp_path / "missing"))
    assert done.returncode == 1 and "cannot read the node agent token" in done.stderr, done.stderr
    done = _agent(tmp_path, "--use-interval", "0")
    assert done.returncode == 2 and "--use-interval must be above 0" in done.stderr, done.stderr
