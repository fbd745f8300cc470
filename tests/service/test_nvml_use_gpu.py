"""The NVML path of allocated vs used on a real GPU (skipped where NVML is not usable).

A child process creates a CUDA context through the driver API (ctypes on
libcuda: no framework needed) and keeps the GPU busy with memsets; the
inventory's sample must show it with memory and, where the driver keeps
per-process accounting, its SM use; :func:`job_use` maps it to its job.
In a container whose PID namespace differs from the driver's, NVML names
host pids: the test then checks the readings only, and says so.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from gpupool.inventory import nvml
from gpupool.inventory.nvml import NvmlInventory, nvml_usable
from gpupool.service.gpu_use import job_use
from gpupool.service.store import JobRecord

pytestmark = [pytest.mark.skipif(not nvml_usable(), reason="NVML is not usable on this machine (no NVIDIA driver)")]

BUSY = r"""
import ctypes, sys, time
cuda = ctypes.CDLL("libcuda.so.1")
assert cuda.cuInit(0) == 0
dev, ctx, ptr = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
assert cuda.cuDeviceGet(ctypes.byref(dev), 0) == 0
assert cuda.cuCtxCreate_v2(ctypes.byref(ctx), 0, dev) == 0
n = 256 << 20
assert cuda.cuMemAlloc_v2(ctypes.byref(ptr), ctypes.c_size_t(n)) == 0
print("ready", flush=True)
end = time.time() + float(sys.argv[1])
while time.time() < end:
    cuda.cuMemsetD32_v2(ptr, ctypes.c_uint(7), ctypes.c_size_t(n // 4))
    cuda.cuCtxSynchronize()
"""


def test_nvml_reports_a_busy_process_and_it_maps_to_its_job():
    inv = NvmlInventory()
    child = subprocess.Popen([sys.executable, "-c", BUSY, "10"], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "CUDA_VISIBLE_DEVICES": inv.gpus()[0].id})
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        inv.sample()  # the per-process ring is read from here on
        time.sleep(nvml.UTIL_MIN_INTERVAL_S + 0.5)  # past the reuse of the last read
        sample = inv.sample()
        gpu = inv.gpus()[0]
        reading = sample[gpu.id]
        assert reading.processes, "a process with a CUDA context holds memory on the GPU"
        assert reading.process_util is None or all(0.0 <= u <= 100.0 for u in reading.process_util.values())
        job = JobRecord(id="j-000001", num=1, name="busy", project="p", user="u", kind="train", state="running",
                        request={}, assignment={"node": "h", "gpus": [{"id": gpu.id, "milli": 1000}]})
        if child.pid not in reading.processes:
            pytest.skip(f"NVML names other pids ({sorted(reading.processes)}) than ours ({child.pid}): a PID "
                        "namespace apart from the driver's; the readings themselves were checked")
        use = job_use(sample, [job], lambda pid: job.id if pid == child.pid else None)[job.id]
        assert use.alloc == 1000 and use.memory >= 256 << 20
        if reading.process_util is not None:
            assert use.measured == 1000 and use.used > 0, (reading, use)  # memsets in a loop keep the SMs busy
    finally:
        child.kill()
        child.wait()
        inv.close()
