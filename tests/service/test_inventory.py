"""GPU inventory: simulation specs, NVML model names and topology (fake NVML), real NVML when present."""

from __future__ import annotations

import types

import pytest

from gpupool.inventory import detect, nvml
from gpupool.inventory.nvml import NvmlInventory, normalize_model, nvml_usable
from gpupool.inventory.simulated import GIB, SimulatedInventory, parse_spec
from gpupool.wire.errors import InvalidRequest


def test_spec_parsing():
    assert parse_spec("4xA100-80GB") == [(4, "A100-80GB")]
    assert parse_spec("2xa100-80gb, 2xT4") == [(2, "A100-80GB"), (2, "T4")]
    assert parse_spec("H100") == [(1, "H100-80GB")]


@pytest.mark.parametrize("bad", ["", "4xB9000", "0xT4", "x", "4xA100-80GB,,", "2 A100"])
def test_bad_specs_are_clear_errors(bad):
    with pytest.raises(InvalidRequest) as e:
        parse_spec(bad)
    assert "spec" in e.value.message or "model" in e.value.message


def test_simulated_gpus_are_stable_and_grouped():
    inv = SimulatedInventory("2xA100-80GB,2xT4", node="h")
    gpus = inv.gpus()
    assert [g.model for g in gpus] == ["A100-80GB", "A100-80GB", "T4", "T4"]
    assert [g.index for g in gpus] == [0, 1, 2, 3]
    assert gpus[0].memory == 80 * GIB and gpus[2].memory == 16 * GIB
    assert gpus[0].topology_group == gpus[1].topology_group != gpus[2].topology_group
    assert all(g.id.startswith("GPU-") for g in gpus) and len({g.id for g in gpus}) == 4
    assert [g.id for g in SimulatedInventory("2xA100-80GB,2xT4", node="h").gpus()] == [g.id for g in gpus]
    assert inv.simulated and inv.sample() == {}


def test_detect_simulates_when_asked():
    inv = detect("1xT4")
    assert inv.simulated and len(inv.gpus()) == 1


@pytest.mark.parametrize("name,mem,want", [
    ("NVIDIA A100-SXM4-80GB", 80 * GIB, "A100-80GB"),
    ("NVIDIA A100-PCIE-40GB", 40 * GIB, "A100-40GB"),
    ("NVIDIA H100 80GB HBM3", 79 * GIB, "H100-80GB"),
    ("Tesla T4", 15 * GIB, "T4"),
    ("Tesla V100-SXM2-32GB", 32 * GIB, "V100-32GB"),
    ("NVIDIA L4", 22 * GIB, "L4"),
    ("NVIDIA Mystery X", 8 * GIB, "Mystery-X"),
])
def test_model_names(name, mem, want):
    assert normalize_model(name, mem) == want


class _FakeNvml(types.SimpleNamespace):
    """Four GPUs: 0-1 NVLinked, 2-3 under one PCIe switch; per-process memory on GPU 0."""

    NVML_FEATURE_ENABLED = 1
    NVML_NVLINK_MAX_LINKS = 2
    NVML_TOPOLOGY_MULTIPLE = 20

    def nvmlInit(self): pass
    def nvmlShutdown(self): pass
    def nvmlDeviceGetCount(self): return 4
    def nvmlDeviceGetHandleByIndex(self, i): return i
    def nvmlDeviceGetUUID(self, h): return f"GPU-{h}"
    def nvmlDeviceGetName(self, h): return "NVIDIA A100-SXM4-80GB"
    def nvmlDeviceGetMemoryInfo(self, h): return types.SimpleNamespace(total=80 * GIB, used=h * GIB)
    def nvmlDeviceGetPciInfo(self, h): return types.SimpleNamespace(busId=f"00000000:0{h}:00.0")
    def nvmlDeviceGetNvLinkState(self, h, link):
        if h in (0, 1) and link == 0:
            return 1
        raise RuntimeError("not supported")
    def nvmlDeviceGetNvLinkRemotePciInfo(self, h, link): return types.SimpleNamespace(busId=f"00000000:0{1 - h}:00.0")
    def nvmlDeviceGetTopologyCommonAncestor(self, a, b): return 20 if {a, b} == {2, 3} else 50
    def nvmlDeviceGetUtilizationRates(self, h): return types.SimpleNamespace(gpu=10.0 * h)
    def nvmlDeviceGetComputeRunningProcesses(self, h):
        return [types.SimpleNamespace(pid=4242, usedGpuMemory=3 * GIB)] if h == 0 else []
    def nvmlDeviceGetGraphicsRunningProcesses(self, h): return []


def test_nvml_inventory_with_fake_library(monkeypatch):
    monkeypatch.setattr(nvml, "_nvml", lambda: _FakeNvml())
    inv = NvmlInventory()
    gpus = inv.gpus()
    assert [g.id for g in gpus] == ["GPU-0", "GPU-1", "GPU-2", "GPU-3"]
    assert gpus[0].model == "A100-80GB" and not inv.simulated
    groups = [g.topology_group for g in gpus]
    assert groups[0] == groups[1] and groups[0].startswith("nvlink")
    assert groups[2] == groups[3] and groups[2].startswith("pcie") and groups[2] != groups[0]
    s = inv.sample()
    assert s["GPU-0"].processes == {4242: 3 * GIB}
    assert s["GPU-2"].utilization == 20.0 and s["GPU-2"].memory_used == 2 * GIB


@pytest.mark.skipif(not nvml_usable(), reason="NVML is not usable on this machine (no NVIDIA driver)")
def test_real_nvml():
    inv = NvmlInventory()
    try:
        gpus = inv.gpus()
        assert gpus, "NVML works but reports no GPU"
        assert all(g.id.startswith(("GPU-", "MIG-")) and g.memory > 0 and g.topology_group for g in gpus)
        sample = inv.sample()
        assert set(sample) == {g.id for g in gpus}
    finally:
        inv.close()
