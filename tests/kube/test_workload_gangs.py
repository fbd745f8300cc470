"""Gangs declared with the Workload API (scheduling.k8s.io PodGroup): one all-or-nothing gpupool gang each."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpupool.app.backend import build_core
from gpupool.backends.kubernetes.workload_gangs import gang_refusal
from gpupool.wire.errors import Conflict
from tests.kube.cluster import Kubelet
from tests.kube.conftest import kube_config
from tests.kube.test_kubectl_pods import ADMIN, jobs_of, kubectl_pod
from tests.service.helpers import wait_for

GROUP, VERSION = "scheduling.k8s.io", "v1beta1"  # what the v1.37 test API server serves (GenericWorkload on)


def make_gang(api: Any, ns: str, workload: str, group: str, min_count: int) -> None:
    """A Workload with one gang template and the PodGroup made from it, as a job controller would."""
    objects = client.CustomObjectsApi(api.api_client)
    objects.create_namespaced_custom_object(GROUP, VERSION, ns, "workloads", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Workload", "metadata": {"name": workload},
        "spec": {"podGroupTemplates": [{"name": "workers", "schedulingPolicy": {"gang": {"minCount": min_count}}}]},
    })
    objects.create_namespaced_custom_object(GROUP, VERSION, ns, "podgroups", {
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "PodGroup", "metadata": {"name": group},
        "spec": {"workloadRef": {"workloadName": workload, "templateName": "workers"},
                 "schedulingPolicy": {"gang": {"minCount": min_count}}},
    })


def gang_pod(api: Any, ns: str, name: str, group: str, gpus: int = 4, project: str = "vision",
             gated: bool = False) -> Any:
    """A worker of the gang: a kubectl pod for gpupool whose spec names its PodGroup."""
    return api.create_namespaced_pod(ns, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"gpupool.io/project": project}},
        "spec": {"schedulerName": "gpupool", "restartPolicy": "Never", "schedulingGroup": {"podGroupName": group},
                 "schedulingGates": [{"name": "gpupool.io/admission"}] if gated else [],
                 "containers": [{"name": "main", "image": "registry.example/train:1", "command": ["torchrun"],
                                 "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}]},
    })


def gang_jobs(core: Any, ns: str, group: str) -> list[dict[str, Any]]:
    return [j for j in core.list_jobs(ADMIN) if j["labels"].get("gpupool.io/podgroup") == f"{ns}/{group}"]


def bound(api: Any, ns: str, names: list[str]) -> list[str]:
    return [api.read_namespaced_pod(n, ns).spec.node_name for n in names]


async def test_a_podgroup_is_bound_whole_once_its_min_count_pods_exist_and_never_paused(
        api: Any, namespace: str, core_on_nodes: Any) -> None:
    core, nodes = await core_on_nodes(nodes=2, projects={"vision": {"train_guarantee": 16}})
    make_gang(api, namespace, "trainer", "trainer-0", min_count=3)
    workers = [f"worker-{k}" for k in range(3)]
    with Kubelet(api, namespace):
        for name in workers[:2]:
            gang_pod(api, namespace, name, "trainer-0", gated=name == "worker-1")  # gpupool's gate: held till then
        kubectl_pod(api, namespace, "alone", gpus=1)  # looked at in the same sync: bound on its own, as always
        await wait_for(lambda: api.read_namespaced_pod("alone", namespace).spec.node_name, what="the lone pod bound")
        await asyncio.sleep(0.5)
        assert bound(api, namespace, workers[:2]) == [None, None]  # 2 of 3: nothing queued, nothing bound
        assert not gang_jobs(core, namespace, "trainer-0")
        assert not any(jobs_of(core, namespace, n) for n in workers[:2])  # never queued one by one
        gang_pod(api, namespace, workers[2], "trainer-0")
        await wait_for(lambda: all(bound(api, namespace, workers)), what="the whole gang bound")
        (job,) = gang_jobs(core, namespace, "trainer-0")
        assert (job["state"], job["kind"], job["request"]["replicas"], job["request"]["gpus"]) == (
            "running", "train", 3, 4)
        placed = sorted(r["node"] for r in job["assignment"]["replicas"])
        assert sorted(bound(api, namespace, workers)) == placed and set(placed) <= set(nodes)
        assert not any(jobs_of(core, namespace, n) for n in workers)
        assert not api.read_namespaced_pod("worker-1", namespace).spec.scheduling_gates  # removed, then bound
        with pytest.raises(Conflict, match="PodGroup"):
            await core.pause(ADMIN, job["id"])


async def test_a_podgroup_over_its_quota_waits_whole_and_cancel_deletes_its_pods(
        api: Any, namespace: str, core_on_nodes: Any) -> None:
    core, _ = await core_on_nodes(nodes=2, projects={"vision": {"train_guarantee": 0, "train_limit": 12}})
    with Kubelet(api, namespace):
        first, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 4, "command": ["python", "a.py"]})
        await wait_for(lambda: core.get_job(ADMIN, first["id"])["state"] == "running", what="the first job running")
        make_gang(api, namespace, "big", "big-0", min_count=3)
        workers = [f"big-{k}" for k in range(3)]
        for name in workers:
            gang_pod(api, namespace, name, "big-0")  # 3 x 4 GPUs: 4 more than the project's limit leaves
        (job,) = await wait_for(lambda: [j for j in gang_jobs(core, namespace, "big-0") if "limit" in j["reason"]],
                                what="the gang queued, and why")
        assert job["state"] == "queued" and "3 × 4 GPU" in job["reason"], job["reason"]
        await asyncio.sleep(0.5)
        assert bound(api, namespace, workers) == [None, None, None]  # none of it placed while it cannot all be
        await core.cancel(ADMIN, job["id"])
        assert core.get_job(ADMIN, job["id"])["state"] == "cancelled"
        await wait_for(lambda: not [p for p in api.list_namespaced_pod(namespace).items
                                    if p.metadata.name in workers], what="the gang's pods deleted")


async def test_the_gang_ends_with_its_pods_success_only_when_all_succeeded(
        api: Any, namespace: str, core_on_nodes: Any) -> None:
    core, _ = await core_on_nodes(projects={"vision": {"train_guarantee": 8}})
    with Kubelet(api, namespace) as kubelet:
        for group, names in (("ok", ["ok-0", "ok-1"]), ("bad", ["bad-0", "bad-1"])):
            make_gang(api, namespace, f"w-{group}", group, min_count=2)
            for name in names:
                gang_pod(api, namespace, name, group, gpus=2)
        ok, bad = [await wait_for(lambda g=g: [j for j in gang_jobs(core, namespace, g) if j["state"] == "running"],
                                  what=f"gang {g} running") for g in ("ok", "bad")]
        kubelet.finish("ok-0", 0)
        await asyncio.sleep(0.5)
        assert core.get_job(ADMIN, ok[0]["id"])["state"] == "running"  # one of two done: the gang still runs
        kubelet.finish("ok-1", 0)
        kubelet.finish("bad-0", 3)
        await wait_for(lambda: core.get_job(ADMIN, ok[0]["id"])["state"] == "succeeded", what="ok succeeded")
        done = await wait_for(lambda: (j := core.get_job(ADMIN, bad[0]["id"]))["state"] == "failed" and j,
                              what="bad failed")
        assert done["exit_code"] == 3, done
        await wait_for(lambda: not [p for p in api.list_namespaced_pod(namespace).items if p.metadata.name == "bad-1"
                                    and not p.metadata.deletion_timestamp], what="the gang's other pod deleted")
        assert api.read_namespaced_pod("ok-0", namespace).status.phase == "Succeeded"  # ended pods are kept


async def test_reclaim_evicts_the_whole_gang_and_cancels_its_job(
        api: Any, namespace: str, core_on_nodes: Any) -> None:
    core, _ = await core_on_nodes(projects={"scrappy": {"train_guarantee": 0}, "owner": {"train_guarantee": 8}})
    with Kubelet(api, namespace, stop_exit_code=0) as kubelet:
        make_gang(api, namespace, "w-pair", "pair", min_count=2)
        for name in ("pair-0", "pair-1"):
            gang_pod(api, namespace, name, "pair", gpus=4, project="scrappy")
        (victim,) = await wait_for(lambda: [j for j in gang_jobs(core, namespace, "pair") if j["state"] == "running"],
                                   what="the over-quota gang running")
        await wait_for(lambda: {"pair-0", "pair-1"} <= set(kubelet.started), what="its pods started")
        await core.submit(ADMIN, {"project": "owner", "gpus": 4, "command": ["python", "train.py"]})
        done = await wait_for(lambda: (j := core.get_job(ADMIN, victim["id"]))["state"] != "running" and j,
                              what="the gang's job settled")
        reason = done["reason"]
        assert done["state"] == "cancelled" and reason.startswith("evicted gang") and "all 2 replicas" in reason
        assert "to give GPUs back to project owner" in reason and reason.endswith("recreate a PodGroup's pods")
        await wait_for(lambda: not [p for p in api.list_namespaced_pod(namespace).items
                                    if p.metadata.name.startswith("pair-")], what="both pods deleted, not one")
        assert [j["state"] for j in gang_jobs(core, namespace, "pair")] == ["cancelled"]  # never queued again


async def test_a_restart_finds_the_running_gang_again_and_binds_nothing_twice(
        api: Any, namespace: str, gpu_nodes: Any, kubeconfig: Path, tmp_path: Path) -> None:
    gpu_nodes(1, gpus=8)
    cfg = kube_config(tmp_path / "state", kubeconfig, namespace)
    core = build_core(cfg)
    await core.start()
    try:
        await wait_for(lambda: core.pool()["nodes"], what="the node in the pool")
        core.set_project(ADMIN, "vision", {"train_guarantee": 8})
        with Kubelet(api, namespace) as kubelet:
            make_gang(api, namespace, "w-pair", "pair", min_count=2)
            for name in ("pair-0", "pair-1"):
                gang_pod(api, namespace, name, "pair", gpus=2)
            (job,) = await wait_for(lambda: [j for j in gang_jobs(core, namespace, "pair") if j["state"] == "running"],
                                    what="the gang running")
            await wait_for(lambda: {"pair-0", "pair-1"} <= set(kubelet.started), what="its pods started")
            await core.stop()
            core = build_core(cfg)
            await core.start()
            await wait_for(lambda: core.get_job(ADMIN, job["id"])["state"] == "running", what="found again")
            await asyncio.sleep(1.0)
            assert [j["id"] for j in gang_jobs(core, namespace, "pair")] == [job["id"]]  # queued once
            assert core.get_job(ADMIN, job["id"])["attempts"] == 1
            kubelet.finish("pair-0", 0)
            kubelet.finish("pair-1", 0)
            await wait_for(lambda: core.get_job(ADMIN, job["id"])["state"] == "succeeded", what="the gang succeeded")
    finally:
        await core.stop()


def test_a_pod_naming_a_v1alpha1_workload_is_refused_with_why() -> None:
    pod = {"metadata": {"name": "w"}, "spec": {"workloadRef": {"name": "trainer", "podGroup": "workers"}}}
    why = gang_refusal(pod)
    assert "Workload trainer, pod group workers (spec.workloadRef" in why and "all-or-nothing" in why, why
    assert gang_refusal({"spec": {}}) == ""
