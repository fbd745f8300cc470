"""Watchdog: the decision logic on fake readings, and the core acting on a fake NVML inventory."""

from __future__ import annotations

import pytest

from gpupool.app.backend import build_core
from gpupool.inventory import GpuInfo, GpuSample
from gpupool.service.watchdog import MIB, Reading, Watchdog, over_limit
from tests.service.helpers import ADMIN, ALICE, PY, fast_config, started, wait_for

GIB = 1024**3


def test_slack_allows_a_cuda_context():
    assert not over_limit(10 * GIB + 200 * MIB, 10 * GIB)
    assert over_limit(11 * GIB, 10 * GIB)


def test_warn_then_stop_after_grace():
    wd = Watchdog("stop", grace_s=10)
    over = [Reading("j-1", "GPU-a", 30 * GIB, 20 * GIB)]
    first = wd.check(over, now=100.0)
    assert [a.kind for a in first] == ["warn"] and "over its share" in first[0].message()
    assert wd.check(over, now=105.0) == []  # within the grace: nothing new
    stop = wd.check(over, now=110.0)
    assert [a.kind for a in stop] == ["stop"]
    assert wd.check(over, now=120.0) == []  # stopped once


def test_going_back_under_resets_and_warn_mode_never_stops():
    wd = Watchdog("stop", grace_s=10)
    over = [Reading("j-1", "GPU-a", 30 * GIB, 20 * GIB)]
    wd.check(over, now=0.0)
    assert wd.check([Reading("j-1", "GPU-a", 1 * GIB, 20 * GIB)], now=5.0) == []
    assert [a.kind for a in wd.check(over, now=12.0)] == ["warn"]  # the clock restarted
    warn_only = Watchdog("warn", grace_s=0)
    assert [a.kind for a in warn_only.check(over, 0.0)] == ["warn"]
    assert warn_only.check(over, 100.0) == []
    assert Watchdog("off").check(over, 0.0) == []


class FakeNvmlInventory:
    """Looks like real GPUs; reports whatever the test puts in ``usage`` (pid -> bytes on GPU 0)."""

    simulated = False

    def __init__(self) -> None:
        self.usage: dict[int, int] = {}
        self._gpus = [GpuInfo("GPU-real-0", 0, "A100-80GB", 80 * GIB, "nvlink0")]

    def gpus(self) -> list[GpuInfo]:
        return list(self._gpus)

    def sample(self) -> dict[str, GpuSample]:
        return {"GPU-real-0": GpuSample(55.0, sum(self.usage.values()), dict(self.usage))}

    def close(self) -> None:
        pass


@pytest.fixture
async def nvml_core(tmp_path):
    inv = FakeNvmlInventory()
    core = build_core(fast_config(tmp_path / "s", simulate=None, watchdog="stop", watchdog_grace_s=0.3), inventory=inv)
    await core.start()
    yield core, inv
    await core.stop()


async def test_core_stops_a_job_over_its_share(nvml_core):
    core, inv = nvml_core
    assert core.simulated is False and core.pool()["simulated"] is False
    core.set_project(ADMIN, "p", {"train_guarantee": 1})
    job, _ = await core.submit(ALICE, {"project": "p", "gpu_fraction": 0.25, "command": [PY, "-c", "import time; time.sleep(60)"]})
    assert (await started(core, job["id"]))["state"] == "running"
    pid = core.book.store.job(job["id"]).pid  # the job's session leader; NVML would list its CUDA processes
    inv.usage = {pid: 40 * GIB}  # a quarter of 80 GiB is 20 GiB
    await wait_for(lambda: core.get_job(ALICE, job["id"])["state"] == "failed", what="watchdog stop")
    done = core.get_job(ALICE, job["id"])
    assert "over its share" in done["reason"]
    kinds = [e for e in core.events_since(0) if e["type"] == "watchdog"]
    assert kinds and kinds[0]["job_id"] == job["id"]
    gpu = core.pool()["nodes"][0]["gpus"][0]
    assert gpu["utilization"] == 55.0 and gpu["memory_used"] == 40 * GIB
    await wait_for(lambda: any("util" in s["gpus"]["GPU-real-0"] for s in core.history(None)["samples"]))


class ReportedPodsInventory(FakeNvmlInventory):
    """GPUs whose use arrives as a cluster's node agent reports it: per pod, each already tied to its job."""

    def __init__(self) -> None:
        super().__init__()
        self.pod_of_job: dict[str, int] = {}  # job id -> the pod's made-up pid (negative, as reported_use makes)

    def sample(self) -> dict[str, GpuSample]:
        from gpupool.service.reported_use import OwnedGpuSample

        owners = {pid: jid for jid, pid in self.pod_of_job.items()}
        return {"GPU-real-0": OwnedGpuSample(55.0, sum(self.usage.values()), dict(self.usage), None, owners)}


async def test_a_pod_a_node_agent_reports_over_its_share_is_stopped(tmp_path):
    """On Kubernetes the watchdog reads node agents' per-pod reports: the pod's job, not a local process."""
    inv = ReportedPodsInventory()
    core = build_core(fast_config(tmp_path / "s", simulate=None, watchdog="stop", watchdog_grace_s=0.3), inventory=inv)
    await core.start()
    try:
        core.set_project(ADMIN, "p", {"train_guarantee": 1})
        job, _ = await core.submit(ALICE, {"project": "p", "gpu_fraction": 0.25,
                                           "command": [PY, "-c", "import time; time.sleep(60)"]})
        assert (await started(core, job["id"]))["state"] == "running"
        inv.pod_of_job[job["id"]] = -1
        inv.usage = {-1: 40 * GIB}  # a quarter of 80 GiB is 20 GiB
        await wait_for(lambda: core.get_job(ALICE, job["id"])["state"] == "failed", what="watchdog stop")
        assert "over its share" in core.get_job(ALICE, job["id"])["reason"]
    finally:
        await core.stop()
