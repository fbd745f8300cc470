"""On a machine with NVIDIA GPUs: the embedded scheduler uses them, and a GPU kernel sees its real GPU.

Skipped where NVML has no GPU (the usual CI machine).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from kernel_helpers import kernel_env

from jupyter_gpupool import leases
from jupyter_gpupool.connection import nvml_gpu_count

pytestmark = [
    pytest.mark.skipif(nvml_gpu_count() == 0, reason="needs an NVIDIA GPU visible through NVML"),
    pytest.mark.timeout(240),
]


@pytest.fixture
def gpupool_config(gpupool_config: dict[str, Any]) -> dict[str, Any]:
    return {**gpupool_config, "simulate": ""}


def nvml_uuids() -> set[str]:
    import pynvml

    pynvml.nvmlInit()
    try:
        out = set()
        for i in range(pynvml.nvmlDeviceGetCount()):
            uuid = pynvml.nvmlDeviceGetUUID(pynvml.nvmlDeviceGetHandleByIndex(i))
            out.add(uuid.decode() if isinstance(uuid, bytes) else uuid)
        return out
    finally:
        pynvml.nvmlShutdown()


async def test_gpu_kernel_gets_a_real_gpu(jp_fetch: Any, jp_serverapp: Any, gpupool_app: Any) -> None:
    status = json.loads((await jp_fetch("gpupool", "api", "status")).body)
    assert status["simulated"] is False
    body = {"path": "gpu.ipynb", "type": "notebook", "name": "gpu.ipynb", "kernel": {"name": "gpupool-python3-0.5"}}
    session = json.loads((await jp_fetch("api", "sessions", method="POST", body=json.dumps(body))).body)
    kernel_id = session["kernel"]["id"]
    env = await kernel_env(jp_serverapp, kernel_id)
    assert env["CUDA_VISIBLE_DEVICES"] in nvml_uuids()
    assert env["GPUPOOL_SIMULATED"] == "0" and env["GPUPOOL_GPU_FRACTION"] == "0.5"
    assert int(env["GPUPOOL_GPU_MEMORY_LIMIT"]) > 0
    job_id = leases.held()[kernel_id].job_id
    await jp_fetch("api", "sessions", session["id"], method="DELETE")
    client = await gpupool_app.connection.client()
    assert (await client.job(job_id))["state"] == "cancelled"
