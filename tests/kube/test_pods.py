"""Jobs as pods on a real API server: bound to a node with the right GPUs, settled from the container's status."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from gpupool.app.backend import build_core
from gpupool.service.actor import Actor
from tests.kube.cluster import Kubelet, pod_env
from tests.kube.conftest import kube_config
from tests.service.helpers import wait_for

ADMIN = Actor("admin", True)


def our_pods(api: Any, ns: str) -> dict[str, Any]:
    return {p.metadata.name: p for p in api.list_namespaced_pod(ns).items}


async def test_a_job_is_a_pod_bound_to_a_node_and_ends_with_its_exit_code(api: Any, namespace: str, gpu_nodes: Any,
                                                                          kubeconfig: Path, tmp_path: Path) -> None:
    nodes = gpu_nodes(3, gpus=8)
    core = build_core(kube_config(tmp_path / "state", kubeconfig, namespace))
    await core.start()
    try:
        await wait_for(lambda: len(core.pool()["nodes"]) == 3, what="3 nodes in the pool")
        assert {len(n["gpus"]) for n in core.pool()["nodes"]} == {8}
        assert {g["model"] for n in core.pool()["nodes"] for g in n["gpus"]} == {"A100-80GB"}
        core.set_project(ADMIN, "vision", {"train_guarantee": 8})
        job, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 2, "command": ["python", "train.py"]})
        with Kubelet(api, namespace) as kubelet:
            pods = await wait_for(lambda: [p for p in our_pods(api, namespace).values() if p.spec.node_name],
                                  what="a bound pod")
            (pod,) = pods
            assert pod.spec.node_name in nodes
            assert pod.spec.scheduler_name == "gpupool"
            assert pod.metadata.labels == {"gpupool.io/job": job["id"], "gpupool.io/attempt": "1",
                                           "gpupool.io/project": "vision", "app.kubernetes.io/managed-by": "gpupool"}
            env = pod_env(pod)
            got = core.get_job(ADMIN, job["id"])
            indices = ",".join(str(g["index"]) for g in got["assignment"]["gpus"])
            assert got["assignment"]["node"] == pod.spec.node_name
            assert env["NVIDIA_VISIBLE_DEVICES"] == indices
            assert env["CUDA_VISIBLE_DEVICES"] == "0,1"
            assert env["GPUPOOL_JOB_ID"] == job["id"] and env["GPUPOOL_RESUME"] == "0"
            assert pod.spec.containers[0].command == ["python", "train.py"]
            assert pod.spec.containers[0].image == "busybox:1.36"
            await wait_for(lambda: pod.metadata.name in kubelet.started, what="the pod running")
            kubelet.finish(pod.metadata.name, 0)
            done = await wait_for(lambda: (j := core.get_job(ADMIN, job["id"]))["state"] != "running" and j,
                                  what="the job settled")
        assert done["state"] == "succeeded" and done["exit_code"] == 0, done
        await wait_for(lambda: not our_pods(api, namespace), what="the finished pod deleted")
        log = core.read_log(ADMIN, job["id"])["data"]
        assert f"attempt 1 of {job['id']}" in log
    finally:
        await core.stop()


async def test_a_failing_command_fails_the_job_with_its_code(api: Any, namespace: str, gpu_nodes: Any,
                                                             kubeconfig: Path, tmp_path: Path) -> None:
    gpu_nodes(1, gpus=4)
    core = build_core(kube_config(tmp_path / "state", kubeconfig, namespace))
    await core.start()
    try:
        core.set_project(ADMIN, "nlp", {"train_guarantee": 4})
        job, _ = await core.submit(ADMIN, {"project": "nlp", "gpu_fraction": 0.25, "command": ["false"]})
        with Kubelet(api, namespace) as kubelet:
            name = f"gpupool-{job['id']}-1"
            await wait_for(lambda: name in kubelet.started, what="the pod running")
            kubelet.finish(name, 3)
            done = await wait_for(lambda: (j := core.get_job(ADMIN, job["id"]))["state"] != "running" and j,
                                  what="the job settled")
        assert (done["state"], done["exit_code"]) == ("failed", 3)
        assert done["reason"] == "exited with code 3"
    finally:
        await core.stop()


async def test_the_liveness_mark_stands_while_pods_run_and_moves_when_one_ends(api: Any, namespace: str,
                                                                              gpu_nodes: Any, kubeconfig: Path,
                                                                              tmp_path: Path) -> None:
    """The core skips scanning every running pod while the executor's mark stands: it must move on an end."""
    gpu_nodes(1, gpus=4)
    core = build_core(kube_config(tmp_path / "state", kubeconfig, namespace))
    await core.start()
    try:
        core.set_project(ADMIN, "nlp", {"train_guarantee": 4})
        jobs = [(await core.submit(ADMIN, {"project": "nlp", "gpu_fraction": 0.25, "command": ["sleep", "60"]}))[0]
                for _ in range(3)]
        names = [f"gpupool-{j['id']}-1" for j in jobs]
        with Kubelet(api, namespace) as kubelet:
            await wait_for(lambda: all(n in kubelet.started for n in names), what="3 pods running")
            # Once the pods' Running updates have reached the watch (later on a loaded machine), the mark stands
            # for a whole second while they run; pods that moved it all the time would never let it.
            deadline = time.monotonic() + 30
            while True:
                mark = core.executor.changes
                await asyncio.sleep(1.0)
                if core.executor.changes == mark:
                    break
                assert time.monotonic() < deadline, "running pods keep moving the mark"
            kubelet.finish(names[1], 7)
            done = await wait_for(lambda: (j := core.get_job(ADMIN, jobs[1]["id"]))["state"] != "running" and j,
                                  what="the ended pod's job settled")
            assert (done["state"], done["exit_code"]) == ("failed", 7)
            assert core.executor.changes != mark
            assert [core.get_job(ADMIN, j["id"])["state"] for j in (jobs[0], jobs[2])] == ["running", "running"]
    finally:
        await core.stop()
