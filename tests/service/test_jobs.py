"""The policy view of stored jobs (gpupool/service/jobs.py)."""

from __future__ import annotations

from gpupool.policy.model import Request
from gpupool.service.jobs import request_of
from gpupool.service.store import JobRecord

GIB = 1024**3


def job(request: dict) -> JobRecord:
    return JobRecord(id="j", num=1, name="n", project="p", user="u", kind="train", state="queued", request=request)


def test_request_is_converted_and_equal_requests_share_one_object():
    a = request_of(job({"gpus": None, "gpu_fraction": 0.25, "gpu_memory": None, "gpu_model": "A100-80GB",
                        "cpu": 2.5, "memory": 3 * GIB}))
    assert a == Request(gpu_milli=250, gpu_models=frozenset({"A100-80GB"}), cpu_milli=2500, memory_mib=3072)
    b = request_of(job({"gpu_fraction": 0.25, "gpu_model": "A100-80GB", "cpu": 2.5, "memory": 3 * GIB}))
    assert b is a  # one object per distinct request: the engine groups jobs by identity
    other = request_of(job({"gpu_fraction": 0.25, "gpu_model": "T4", "cpu": 2.5, "memory": 3 * GIB}))
    assert other == Request(gpu_milli=250, gpu_models=frozenset({"T4"}), cpu_milli=2500, memory_mib=3072)
    assert other is not a
    assert request_of(job({"gpus": 2})) == Request(gpus=2)
    assert request_of(job({"gpu_memory": 10 * GIB + 1})) == Request(gpu_memory_mib=10 * 1024 + 1)  # MiB, rounded up
