"""Other schedulers' pods holding nvidia.com/gpu on pool nodes count as used: gpupool gives only what is left."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from gpupool.app.backend import build_core
from gpupool.cli.tables import gpus_table
from gpupool.service.actor import Actor
from gpupool.service.core import SchedulerCore
from tests.kube.cluster import Kubelet
from tests.kube.conftest import kube_config
from tests.service.helpers import wait_for

ADMIN = Actor("admin", True)


def placed_pod(api: Any, ns: str, name: str, node: str, gpus: int) -> Any:
    """A pod kube-scheduler placed (spec.nodeName set, the default scheduler) holding ``gpus`` GPUs."""
    return api.create_namespaced_pod(ns, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "cuda:12",
                                                   "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]}})


def held_by_others(core: SchedulerCore) -> dict[int, list[str]]:
    return {g["index"]: [a["user"] for a in g["allocations"] if a["kind"] == "other"]
            for n in core.pool()["nodes"] for g in n["gpus"] if any(a["kind"] == "other" for a in g["allocations"])}


async def test_another_schedulers_pod_holding_6_of_8_gpus_leaves_2(api: Any, namespace: str, gpu_nodes: Any,
                                                                  kubeconfig: Path, tmp_path: Path) -> None:
    (node,) = gpu_nodes(1, gpus=8)
    other_ns = f"o-{uuid.uuid4().hex[:8]}"  # any namespace counts, not only gpupool's
    api.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": other_ns}})
    placed_pod(api, other_ns, "trainer", node, 6)
    placed_pod(api, other_ns, "cpu-only", node, 0)  # holds no GPU: not counted
    core = build_core(kube_config(tmp_path / "state", kubeconfig, namespace))
    await core.start()
    try:
        await wait_for(lambda: len(held_by_others(core)) == 6, what="6 GPUs shown held by the other pod")
        assert held_by_others(core) == {i: [f"{other_ns}/trainer"] for i in range(2, 8)}  # the highest indices
        assert "(other scheduler)/" + f"{other_ns}/trainer" in gpus_table(core.pool())  # gpupool status
        core.set_project(ADMIN, "vision", {"train_guarantee": 8})
        ids = []
        with Kubelet(api, namespace) as kubelet:
            for _ in range(3):
                j, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 1, "command": ["python", "t.py"]})
                ids.append(j["id"])
            await wait_for(lambda: len(kubelet.started) == 2, what="two jobs running")
            states = [core.get_job(ADMIN, i) for i in ids]
            assert sorted(s["state"] for s in states) == ["queued", "running", "running"]
            used = sorted(g["index"] for s in states if s["state"] == "running" for g in s["assignment"]["gpus"])
            assert used == [0, 1]  # never a GPU the other pod holds
            (waiting,) = [s for s in states if s["state"] == "queued"]
            # The other pod finishes: its GPUs come back to the pool, and the third job runs.
            api.patch_namespaced_pod_status("trainer", other_ns, {"status": {"phase": "Succeeded"}})
            running = await wait_for(lambda: (x := core.get_job(ADMIN, waiting["id"]))["state"] == "running" and x,
                                     what="the third job running")
            assert running["assignment"]["gpus"][0]["index"] >= 2
            assert held_by_others(core) == {}
    finally:
        await core.stop()


def test_other_pods_take_the_highest_free_gpus_and_keep_them() -> None:
    from gpupool.backends.kubernetes.other_pods import OtherPod, assign
    from gpupool.policy.model import Gpu, Node

    node = Node("n", 64000, 1 << 20, tuple(Gpu(f"n/gpu{i}", i, "A100-80GB", 81920) for i in range(8)),
                frozenset({"train"}))
    a = OtherPod("a", "x/a", "n", 2, 1.0)
    b = OtherPod("b", "x/b", "n", 3, 2.0)
    elsewhere = OtherPod("c", "x/c", "not-a-pool-node", 4, 0.5)
    held = assign([node], [elsewhere, a, b], {})
    assert [(h.pod.text, h.gpu_ids) for h in held] == [("x/a", ("n/gpu7", "n/gpu6")),
                                                       ("x/b", ("n/gpu5", "n/gpu4", "n/gpu3"))]
    # a ends: b keeps its GPUs (sticky); a newcomer takes the highest free ones
    sticky = {h.pod.uid: h.gpu_ids for h in held}
    d = OtherPod("d", "x/d", "n", 1, 3.0)
    again = assign([node], [b, d], sticky)
    assert [(h.pod.text, h.gpu_ids) for h in again] == [("x/b", ("n/gpu5", "n/gpu4", "n/gpu3")),
                                                        ("x/d", ("n/gpu7",))]
    too_many = assign([node], [OtherPod("e", "x/e", "n", 12, 0.0)], {})
    assert len(too_many[0].gpu_ids) == 8  # never more GPUs than the node has
