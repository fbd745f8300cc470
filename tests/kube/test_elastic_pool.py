"""A cluster's pool grows and shrinks: nothing is refused or lost for the nodes of the moment.

On one machine a job no node can hold is refused (the machine will not
grow). On Kubernetes the nodes come later (a fresh install, an autoscaler)
or leave for a while (a drain, a reboot): an admin sets guarantees before the
nodes join, a job for GPUs not there yet waits for them, and a paused job
whose only fitting node left waits for it to come back, rather than ending
`rejected` and lost.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from gpupool.app.backend import build_core
from gpupool.service.actor import Actor
from gpupool.service.core import SchedulerCore
from tests.kube.cluster import Kubelet
from tests.kube.conftest import kube_config
from tests.service.helpers import wait_for

ADMIN = Actor("admin", True)


@pytest.fixture
async def core(tmp_path: Path, kubeconfig: Path, namespace: str) -> AsyncIterator[SchedulerCore]:
    c = build_core(kube_config(tmp_path / "state", kubeconfig, namespace, pause_grace_s=1.0))
    await c.start()
    yield c
    await c.stop()


def state(core: SchedulerCore, job_id: str) -> dict[str, Any]:
    return core.get_job(ADMIN, job_id)


async def test_guarantees_and_jobs_are_taken_before_any_gpu_node_joins(api: Any, namespace: str, gpu_nodes: Any,
                                                                     core: SchedulerCore) -> None:
    assert core.pool()["nodes"] == []
    project = core.set_project(ADMIN, "vision", {"train_guarantee": 16, "build_quota": 2})
    assert project["train_guarantee"] == 16  # not "more than the whole pool (0 GPUs)"
    j, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 8, "gpu_model": "A100-80GB",
                                     "command": ["python", "train.py"]})
    waiting = await wait_for(lambda: "join" in ((x := state(core, j["id"]))["reason"] or "") and x,
                             what="the reason it waits")
    assert waiting["state"] == "queued"
    assert "waits for such a node to join the pool" in waiting["reason"]
    with Kubelet(api, namespace, stop_exit_code=0) as kubelet:
        (node,) = gpu_nodes(1, gpus=8)
        await wait_for(lambda: f"gpupool-{j['id']}-1" in kubelet.started, what="the job's pod running")
    assert state(core, j["id"])["assignment"]["node"] == node


async def test_a_paused_job_whose_node_left_waits_for_it_and_resumes_when_it_is_back(
        api: Any, namespace: str, gpu_nodes: Any, core: SchedulerCore) -> None:
    (node,) = gpu_nodes(1, gpus=8)
    await wait_for(lambda: len(core.pool()["nodes"]) == 1, what="the node in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 8})
    with Kubelet(api, namespace, stop_exit_code=0) as kubelet:
        j, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 8, "command": ["python", "train.py"]})
        job_id = j["id"]
        await wait_for(lambda: f"gpupool-{job_id}-1" in kubelet.started, what="the pod running")
        api.patch_node(node, {"spec": {"unschedulable": True}})  # kubectl drain: the only 8-GPU node leaves
        paused = await wait_for(lambda: (x := state(core, job_id))["state"] == "paused"
                                and "join the pool" in (x["reason"] or "") and x, what="the job paused, waiting")
        assert paused["state"] != "rejected"
        assert "no node of the train pool can hold 8 whole GPUs on one node now" in paused["reason"]
        api.patch_node(node, {"spec": {"unschedulable": False}})  # kubectl uncordon: back
        await wait_for(lambda: f"gpupool-{job_id}-2" in kubelet.started, what="the job resumed as a new pod")
        again = state(core, job_id)
        assert again["state"] == "running" and again["attempts"] == 2
