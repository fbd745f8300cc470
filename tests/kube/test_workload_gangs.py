"""Pods of a gang declared with the Workload API (scheduling.k8s.io Workload, PodGroup): never bound one by one."""

from __future__ import annotations

import asyncio
from typing import Any

from kubernetes import client

from tests.kube.test_kubectl_pods import ADMIN, jobs_of, kubectl_pod, pod_events
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


def gang_pod(api: Any, ns: str, name: str, group: str) -> Any:
    """A worker of the gang: a kubectl pod for gpupool whose spec names its PodGroup."""
    return api.create_namespaced_pod(ns, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"gpupool.io/project": "vision"}},
        "spec": {"schedulerName": "gpupool", "restartPolicy": "Never", "schedulingGroup": {"podGroupName": group},
                 "containers": [{"name": "main", "image": "registry.example/train:1", "command": ["torchrun"],
                                 "resources": {"limits": {"nvidia.com/gpu": "4"}}}]},
    })


async def test_pods_of_a_workload_api_gang_are_not_bound_one_by_one_and_are_told_why(
        api: Any, namespace: str, gpu_nodes: Any, make_core: Any) -> None:
    gpu_nodes(2, gpus=8)
    core = await make_core()
    await wait_for(lambda: len(core.pool()["nodes"]) == 2, what="the nodes in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 16})
    make_gang(api, namespace, "trainer", "trainer-0", min_count=3)
    for k in range(3):
        gang_pod(api, namespace, f"worker-{k}", "trainer-0")
    kubectl_pod(api, namespace, "alone", gpus=1)  # looked at in the same sync: bound, as always
    await wait_for(lambda: api.read_namespaced_pod("alone", namespace).spec.node_name, what="the lone pod bound")
    for k in range(3):
        name = f"worker-{k}"
        (ev,) = await wait_for(lambda n=name: [e for e in pod_events(api, namespace, n)
                                               if e.reason == "GpupoolNotQueued"], what=f"{name} told why")
        assert ev.type == "Warning" and "PodGroup trainer-0 (spec.schedulingGroup)" in ev.message, ev.message
        assert "all-or-nothing" in ev.message and "Gangs declared with the Workload API" in ev.message
    await asyncio.sleep(0.5)
    for k in range(3):
        assert not api.read_namespaced_pod(f"worker-{k}", namespace).spec.node_name
        assert not jobs_of(core, namespace, f"worker-{k}")
