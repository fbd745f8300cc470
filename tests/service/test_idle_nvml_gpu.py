"""Idle by use on a real GPU, through NVML (skipped where NVML is not usable).

Two child processes hold CUDA contexts on GPU 0 (the driver API through
ctypes: no framework needed): one keeps the SMs busy with memsets, the other
holds its memory and does nothing. Fed the inventory's real samples, the idle
watch flags the idle one's job after its window and never the busy one's. On
a GPU whose driver keeps no per-process accounting every sample is
unmeasured, and nothing may be flagged.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpupool.inventory import nvml
from gpupool.inventory.nvml import NvmlInventory, nvml_usable
from gpupool.service.book import JobBook, Lifecycle
from gpupool.service.gpu_use import job_use
from gpupool.service.idle import IdleWatch
from gpupool.service.metrics import Metrics
from gpupool.service.store import JobRecord, ProjectRecord, Store
from gpupool.service.usage import DecayedUsage

pytestmark = [pytest.mark.skipif(not nvml_usable(), reason="NVML is not usable on this machine (no NVIDIA driver)"),
              pytest.mark.timeout(120)]

HOLD = r"""
import ctypes, sys, time
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0
n = 256 << 20
assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(n)) == 0
print("ready", flush=True)
busy, end = sys.argv[1] == "busy", time.time() + 60
while time.time() < end:
    if busy:
        cuda.cuMemsetD32_v2(ptr, ctypes.c_uint(7), ctypes.c_size_t(n // 4))
        cuda.cuCtxSynchronize()
    else:
        time.sleep(0.1)
"""


def test_an_idle_cuda_process_is_flagged_and_a_busy_one_is_not(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(nvml, "UTIL_MIN_INTERVAL_S", 0.0)  # every sample reads the per-process ring afresh
    inv = NvmlInventory()
    gpu = inv.gpus()[0]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu.id}
    children = {what: subprocess.Popen([sys.executable, "-c", HOLD, what], stdout=subprocess.PIPE, text=True, env=env)
                for what in ("busy", "idle")}
    store = Store(tmp_path / "state.db")
    try:
        for child in children.values():
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        store.upsert_project(ProjectRecord("p", created_at=1.0, idle={
            "train": {"action": "flag", "window_s": 3.0, "below_percent": 1.0}}))
        book = JobBook(store, DecayedUsage(0.0), Lifecycle())
        watch = IdleWatch(book, attempts=None, metrics=Metrics(), max_gap_s=60.0)  # type: ignore[arg-type]
        jobs = {what: JobRecord(id=f"j-{what}", num=n, name=what, project="p", user="u", kind="train",
                                state="running", request={},
                                assignment={"node": "h", "gpus": [{"id": gpu.id, "milli": 500}]})
                for n, what in enumerate(children, 1)}
        owners = {child.pid: jobs[what].id for what, child in children.items()}
        inv.sample()  # the per-process ring is read from here on
        measured = False
        for _ in range(8):
            time.sleep(1.0)
            sample = inv.sample()
            reading = sample[gpu.id]
            if reading.processes and not set(owners) & set(reading.processes):
                pytest.skip(f"NVML names other pids ({sorted(reading.processes)}) than ours: a PID namespace apart "
                            "from the driver's")
            measured = measured or reading.process_util is not None
            watch.observe(time.time(), list(jobs.values()), job_use(sample, jobs.values(), owners.get))
        flags = {what: watch.job_fields(rec)["idle_since"] for what, rec in jobs.items()}
        if not measured:
            assert flags == {"busy": None, "idle": None}  # no per-process accounting: unmeasured, never idle
            return
        assert flags["idle"] is not None and flags["busy"] is None, flags
    finally:
        for child in children.values():
            child.kill()
            child.wait()
        store.close()
        inv.close()
