"""Racks on a cluster: a node's group comes from its labels, and a gang's replicas stay within one rack."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpupool.app.backend import build_core
from gpupool.backends.kubernetes.nodes import read_node
from gpupool.service.actor import Actor
from tests.kube.cluster import Kubelet
from tests.kube.conftest import kube_config
from tests.service.helpers import wait_for

ADMIN = Actor("admin", True)


def json_node(labels: dict[str, str]) -> dict[str, Any]:
    """A Node as the API server sends it."""
    return {"metadata": {"name": "n", "labels": labels},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}, "conditions": [{"type": "Ready", "status": "True"}]}}


def test_the_rack_label_wins_over_the_zone_and_neither_means_no_group() -> None:
    zone = "topology.kubernetes.io/zone"
    assert read_node(json_node({"gpupool.io/rack": "r7", zone: "eu-1a"})).policy_node().group == "r7"
    assert read_node(json_node({zone: "eu-1a"})).policy_node().group == "eu-1a"
    assert read_node(json_node({})).policy_node().group == ""


async def test_a_gang_goes_on_two_nodes_of_one_rack_not_the_first_two_nodes(api: Any, namespace: str,
                                                                           gpu_nodes: Any, tmp_path: Path,
                                                                           kubeconfig: Path) -> None:
    lone, a1, a2 = gpu_nodes(3, gpus=8)
    api.patch_node(lone, {"metadata": {"labels": {"topology.kubernetes.io/zone": "zone-b"}}})
    for n in (a1, a2):
        api.patch_node(n, {"metadata": {"labels": {"gpupool.io/rack": "rack-a"}}})
    core = build_core(kube_config(tmp_path / "state", kubeconfig, namespace))
    await core.start()
    try:
        await wait_for(lambda: sorted(n["group"] for n in core.pool()["nodes"]) == ["rack-a", "rack-a", "zone-b"],
                       what="three nodes with their groups in the pool")
        core.set_project(ADMIN, "vision", {"train_guarantee": 16})
        j, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 8, "replicas": 2,
                                         "command": ["python", "train.py"]})
        with Kubelet(api, namespace) as kubelet:
            await wait_for(lambda: sum(p.startswith(f"gpupool-{j['id']}-") for p in kubelet.started) == 2,
                           what="both replica pods running")
        job = core.get_job(ADMIN, j["id"])
        assert sorted(r["node"] for r in job["assignment"]["replicas"]) == sorted([a1, a2])
    finally:
        await core.stop()
