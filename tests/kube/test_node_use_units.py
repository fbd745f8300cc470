"""The node agent's report body: a sample's processes summed per pod and GPU, the rest left out."""

from __future__ import annotations

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
