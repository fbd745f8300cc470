"""What a team sees on a cluster: reclaim of over-quota work, a cordoned or lost node, a scheduler restart."""

from __future__ import annotations

from typing import Any

from gpupool.service.actor import Actor
from gpupool.service.core import SchedulerCore
from tests.kube.cluster import Kubelet, pod_env
from tests.service.helpers import wait_for

ADMIN = Actor("admin", True)


def pods(api: Any, ns: str) -> dict[str, Any]:
    return {p.metadata.name: p for p in api.list_namespaced_pod(ns).items}


def job(core: SchedulerCore, job_id: str) -> dict[str, Any]:
    return core.get_job(ADMIN, job_id)


async def submit(core: SchedulerCore, project: str, gpus: int, name: str = "") -> str:
    j, _ = await core.submit(ADMIN, {"project": project, "gpus": gpus, "command": ["python", "train.py"],
                                     **({"name": name} if name else {})})
    return str(j["id"])


async def test_over_quota_pod_is_deleted_gracefully_and_resumes_as_a_new_pod(api: Any, namespace: str,
                                                                              gpu_nodes: Any, make_core: Any) -> None:
    (node,) = gpu_nodes(1, gpus=8)
    core = await make_core()
    await wait_for(lambda: len(core.pool()["nodes"]) == 1, what="the node in the pool")
    core.set_project(ADMIN, "scrappy", {"train_guarantee": 0})
    core.set_project(ADMIN, "owner", {"train_guarantee": 8})
    with Kubelet(api, namespace, stop_exit_code=0) as kubelet:  # a job that checkpoints on SIGTERM exits 0
        a1, a2 = await submit(core, "scrappy", 4), await submit(core, "scrappy", 4)
        await wait_for(lambda: len(kubelet.started) == 2, what="both over-quota pods running")
        claim = await submit(core, "owner", 4)
        await wait_for(lambda: kubelet.stopped, what="a scrappy pod deleted")
        (victim_pod,) = kubelet.stopped
        victim = a1 if victim_pod.startswith(f"gpupool-{a1}") else a2
        assert victim_pod == f"gpupool-{victim}-1"
        paused = await wait_for(lambda: (j := job(core, victim))["state"] == "paused" and j, what="victim paused")
        assert paused["exit_code"] == 0  # the checkpointing exit status the kubelet reported
        await wait_for(lambda: f"gpupool-{claim}-1" in kubelet.started, what="the owner's pod running")
        # The deletion was graceful: the API server kept the pod until the kubelet ended it.
        assert victim_pod not in pods(api, namespace)
        kubelet.finish(f"gpupool-{claim}-1", 0)
        await wait_for(lambda: f"gpupool-{victim}-2" in kubelet.started, what="the victim resumed as a new pod")
        resumed = api.read_namespaced_pod(f"gpupool-{victim}-2", namespace)
        env = pod_env(resumed)
        assert (env["GPUPOOL_ATTEMPT"], env["GPUPOOL_RESUME"]) == ("2", "1")
        assert resumed.metadata.labels["gpupool.io/attempt"] == "2"
        assert job(core, victim)["attempts"] == 2
        assert job(core, claim)["state"] == "succeeded"


async def test_a_cordoned_node_hands_its_job_to_another_node(api: Any, namespace: str, gpu_nodes: Any,
                                                             make_core: Any) -> None:
    gpu_nodes(2, gpus=8)
    core = await make_core()
    await wait_for(lambda: len(core.pool()["nodes"]) == 2, what="2 nodes in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 16})
    with Kubelet(api, namespace, stop_exit_code=0) as kubelet:
        j = await submit(core, "vision", 8)
        await wait_for(lambda: kubelet.started, what="the pod running")
        first = job(core, j)["assignment"]["node"]
        api.patch_node(first, {"spec": {"unschedulable": True}})  # kubectl cordon
        await wait_for(lambda: f"gpupool-{j}-2" in kubelet.started, what="the job running again")
        moved = job(core, j)
        assert moved["state"] == "running" and moved["assignment"]["node"] != first
        assert api.read_namespaced_pod(f"gpupool-{j}-2", namespace).spec.node_name == moved["assignment"]["node"]
        assert f"gpupool-{j}-1" in kubelet.stopped  # stopped gracefully, not failed
        assert first in core.status(ADMIN)["backend"]["nodes_out"]
        assert core.status(ADMIN)["backend"]["nodes_out"][first] == "cordoned"
        assert [n["name"] for n in core.pool()["nodes"]] == [moved["assignment"]["node"]]


async def test_a_node_that_dies_has_its_pod_removed_and_its_job_resumed_elsewhere(api: Any, namespace: str,
                                                                                  gpu_nodes: Any,
                                                                                  make_core: Any) -> None:
    gpu_nodes(2, gpus=8)
    core = await make_core(pause_grace_s=1.0)
    await wait_for(lambda: len(core.pool()["nodes"]) == 2, what="2 nodes in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 16})
    kubelet = Kubelet(api, namespace)
    with kubelet:
        j = await submit(core, "vision", 8)
        await wait_for(lambda: kubelet.started, what="the pod running")
    dead = job(core, j)["assignment"]["node"]
    api.delete_node(dead)  # its kubelet is gone too: nobody will confirm the pod's end
    pod = f"gpupool-{j}-1"
    await wait_for(lambda: pod not in pods(api, namespace), timeout=20, what="the pod deleted for good")
    again = await wait_for(lambda: (x := job(core, j))["attempts"] == 2 and x["state"] == "running" and x,
                           what="the job resumed")
    assert again["assignment"]["node"] != dead
    events = [e for e in core.events_since(0) if e.get("job_id") == j and e.get("state") == "paused"]
    assert events and "left the pool" in events[-1]["reason"]
    assert job(core, j)["state"] != "failed"
