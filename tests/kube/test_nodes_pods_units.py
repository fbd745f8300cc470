"""The pure parts of the Kubernetes backend: a Node's pool view, a pod's manifest, how a pod's attempt ended."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

from gpupool.backends.base import Launch
from gpupool.backends.kubernetes.nodes import read_node
from gpupool.backends.kubernetes.pods import PodSettings, label_value, pod_end, pod_environment, pod_manifest
from gpupool.policy.model import BUILD_POOL, TRAIN_POOL


def node(name: str = "n1", gpus: str = "4", labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
         ready: str = "True", unschedulable: bool = False, taints: list[dict[str, str]] | None = None) -> dict[str, Any]:
    """A Node as the API server sends it (JSON: camelCase, absent fields left out)."""
    base = {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB", "nvidia.com/gpu.memory": "81920"}
    meta: dict[str, Any] = {"name": name, "labels": {**base, **(labels or {})}}
    if annotations:
        meta["annotations"] = annotations
    spec: dict[str, Any] = {"unschedulable": True} if unschedulable else {}
    if taints:
        spec["taints"] = taints
    return {"apiVersion": "v1", "kind": "Node", "metadata": meta, "spec": spec,
            "status": {"allocatable": {"cpu": "16", "memory": "64Gi", "nvidia.com/gpu": gpus},
                       "conditions": [{"type": "Ready", "status": ready}]}}


def test_a_gpu_node_is_in_both_pools_with_named_gpus() -> None:
    pn = read_node(node())
    assert pn is not None and pn.problem == ""
    assert [g.id for g in pn.gpus] == ["n1/gpu0", "n1/gpu1", "n1/gpu2", "n1/gpu3"]
    assert {g.model for g in pn.gpus} == {"A100-80GB"} and pn.gpus[0].memory == 81920 * 2**20
    assert pn.pools == frozenset({BUILD_POOL, TRAIN_POOL})
    assert (pn.cpu_milli, pn.memory_mib) == (16000, 65536)
    assert pn.policy_node().gpus[0].memory_mib == 81920


def test_nodes_without_gpus_are_not_the_pool_s() -> None:
    assert read_node(node(gpus="0")) is None


def test_pool_label_and_problems() -> None:
    assert read_node(node(labels={"gpupool.io/pool": "train"})).pools == frozenset({TRAIN_POOL})  # type: ignore[union-attr]
    assert "not build, train or both" in read_node(node(labels={"gpupool.io/pool": "b,t"})).problem  # type: ignore[union-attr]
    assert read_node(node(unschedulable=True)).problem == "cordoned"  # type: ignore[union-attr]
    assert read_node(node(ready="False")).problem == "not ready"  # type: ignore[union-attr]
    assert read_node(node(ready="Unknown")).problem.startswith("unreachable")  # type: ignore[union-attr]
    # lost (its pods deleted for good after the grace) even when an admin has also cordoned it
    assert read_node(node(ready="Unknown", unschedulable=True)).lost  # type: ignore[union-attr]
    assert not read_node(node(unschedulable=True)).lost  # type: ignore[union-attr]
    tainted = node(taints=[{"key": "node.kubernetes.io/unreachable", "effect": "NoExecute"}])
    assert read_node(tainted).problem.startswith("tainted")  # type: ignore[union-attr]
    gpu_taint = node(taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}])
    assert read_node(gpu_taint).problem == ""  # type: ignore[union-attr]  # our pods tolerate it


def test_the_node_agent_annotation_gives_exact_gpus_and_a_bad_one_is_ignored() -> None:
    gpus = [{"id": "GPU-b", "index": 1, "memory": 42, "topology_group": "nvlink0"},
            {"id": "GPU-a", "index": 0, "model": "H100-80GB", "topology_group": "nvlink0"}]
    pn = read_node(node(gpus="2", annotations={"gpupool.io/gpus": json.dumps(gpus)}))
    assert pn is not None
    assert [(g.id, g.index, g.model, g.topology_group) for g in pn.gpus] == [
        ("GPU-a", 0, "H100-80GB", "nvlink0"), ("GPU-b", 1, "A100-80GB", "nvlink0")]
    assert pn.gpus[1].memory == 42
    bad = read_node(node(gpus="2", annotations={"gpupool.io/gpus": "[{\"index\": 0}]"}))
    assert bad is not None and [g.id for g in bad.gpus] == ["n1/gpu0", "n1/gpu1"]


def launch(gpus: list[dict[str, object]]) -> Launch:
    return Launch("j-000007", 2, ["python", "t.py"], "/gpupool/work", "alice", "Vision Team",
                  {"PYTHONPATH": "/mine", "K": "v"}, {"CUDA_VISIBLE_DEVICES": "x", "PYTHONPATH": "/host/hook:/mine",
                                                      "GPUPOOL_RESUME": "1"},
                  {"node": "n1", "gpus": gpus})


def test_pod_environment_remaps_gpus_for_a_container() -> None:
    env = pod_environment(launch([{"id": "n1/gpu5", "index": 5}, {"id": "n1/gpu7", "index": 7}]))
    assert (env["NVIDIA_VISIBLE_DEVICES"], env["CUDA_VISIBLE_DEVICES"]) == ("5,7", "0,1")
    assert env["PYTHONPATH"] == "/mine" and env["K"] == "v" and env["GPUPOOL_RESUME"] == "1"
    exact = pod_environment(launch([{"id": "GPU-a", "index": 0}]))
    assert exact["NVIDIA_VISIBLE_DEVICES"] == exact["CUDA_VISIBLE_DEVICES"] == "GPU-a"
    assert pod_environment(launch([]))["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_pod_manifest() -> None:
    m = pod_manifest(launch([{"id": "n1/gpu0", "index": 0}]), PodSettings("ml", "img:1", grace_s=30,
                                                                          workdir_pvc="work"))
    assert m["metadata"]["name"] == "gpupool-j-000007-2"
    assert m["metadata"]["labels"]["gpupool.io/project"] == "Vision_Team"
    assert m["spec"]["schedulerName"] == "gpupool" and m["spec"]["restartPolicy"] == "Never"
    assert m["spec"]["terminationGracePeriodSeconds"] == 30
    c = m["spec"]["containers"][0]
    assert c["image"] == "img:1" and c["workingDir"] == "/gpupool/work"
    assert c["volumeMounts"] == [{"name": "work", "mountPath": "/gpupool/work", "subPath": "j-000007"}]
    assert label_value("-x" * 40).startswith("x") and len(label_value("y" * 80)) == 63


def stamp(t: dt.datetime) -> str:
    """A time as the API server writes it (RFC 3339, whole seconds, UTC)."""
    return t.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod(phase: str, code: int | None, finished: dt.datetime | None = None, deleted: dt.datetime | None = None,
        grace: int | None = None) -> dict[str, Any]:
    """A job pod's JSON with one container status (running, or terminated with ``code`` at ``finished``)."""
    state: dict[str, Any] = {"running": {"startedAt": "2026-01-01T11:00:00Z"}} if code is None else {
        "terminated": {"exitCode": code, **({"finishedAt": stamp(finished)} if finished else {})}}
    meta: dict[str, Any] = {"name": "p"}
    if deleted is not None:
        meta.update(deletionTimestamp=stamp(deleted), deletionGracePeriodSeconds=grace)
    return {"metadata": meta, "status": {"phase": phase, "containerStatuses": [
        {"name": "job", "image": "i", "imageID": "", "ready": False, "restartCount": 0, "state": state}]}}


def test_pod_end_tells_ended_on_its_own_from_stopped() -> None:
    t = dt.datetime(2026, 1, 1, 12, 0, 0, tzinfo=dt.timezone.utc)
    assert pod_end(pod("Running", None)) is None
    ended = pod_end(pod("Succeeded", 0, t))
    assert ended is not None and ended.on_its_own and ended.exit_code == 0
    # Deleted with a 30 s grace at t (deletionTimestamp t+30): finished a second before -> on its own.
    before = pod_end(pod("Running", 0, t - dt.timedelta(seconds=1), t + dt.timedelta(seconds=30), 30))
    assert before is not None and before.on_its_own and before.exit_code == 0
    same = pod_end(pod("Running", 143, t + dt.timedelta(seconds=0.5), t + dt.timedelta(seconds=30), 30))
    assert same is not None and not same.on_its_own and same.exit_code == 143
    no_status = pod_end({"metadata": {"name": "p"}, "status": {"phase": "Failed"}})
    assert no_status is not None and no_status.exit_code is None
