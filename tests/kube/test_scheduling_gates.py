"""kubectl pods with gpupool's scheduling gate (gpupool.io/admission): held while queued, removed when bound."""

from __future__ import annotations

import asyncio
from typing import Any

from kubernetes.client.rest import ApiException

from gpupool.backends.kubernetes.gates import remove_gate
from tests.kube.cluster import Kubelet
from tests.kube.test_kubectl_pods import ADMIN, jobs_of, pod_events
from tests.service.helpers import wait_for

GATE = "gpupool.io/admission"


def gated_pod(api: Any, ns: str, name: str, *, gates: tuple[str, ...] = (GATE,), project: str = "vision",
              gpus: int = 1) -> Any:
    """A user's pod for gpupool, written with scheduling gates (as documented in docs/kubernetes.md)."""
    container: dict[str, Any] = {"name": "main", "image": "registry.example/train:1", "command": ["python", "train.py"],
                                 "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
                                 "envFrom": [{"configMapRef": {"name": f"gpupool-{name}"}}]}
    return api.create_namespaced_pod(ns, {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"gpupool.io/project": project}},
        "spec": {"schedulerName": "gpupool", "restartPolicy": "Never", "containers": [container],
                 "schedulingGates": [{"name": g} for g in gates]},
    })


def gates_of(api: Any, ns: str, name: str) -> list[str]:
    return [g.name for g in api.read_namespaced_pod(name, ns).spec.scheduling_gates or []]


def scheduled_condition(api: Any, ns: str, name: str) -> tuple[str, str] | None:
    """The pod's PodScheduled condition (status, reason), as ``kubectl describe pod`` shows it."""
    for c in api.read_namespaced_pod(name, ns).status.conditions or []:
        if c.type == "PodScheduled":
            return c.status, c.reason or ""
    return None


def assert_binding_refused(api: Any, ns: str, name: str, node: str) -> None:
    """What gpupool works around: the API server refuses to bind a pod that still has a gate."""
    body = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node}}
    try:
        api.create_namespaced_pod_binding(name, ns, body, _preload_content=False)
    except ApiException as e:
        assert 400 <= e.status < 500 and "gate" in str(e.body or "").lower(), (e.status, e.body)
    else:
        raise AssertionError("the API server bound a gated pod")
    assert not api.read_namespaced_pod(name, ns).spec.node_name


async def test_a_gated_pod_is_queued_then_ungated_and_bound_when_admitted(api: Any, namespace: str, gpu_nodes: Any,
                                                                         make_core: Any) -> None:
    (node,) = gpu_nodes(1, gpus=8)
    gated_pod(api, namespace, "gated", gpus=2)
    # What the cluster autoscaler and kube-scheduler's metrics see: gated, not unschedulable.
    assert scheduled_condition(api, namespace, "gated") == ("False", "SchedulingGated")
    assert_binding_refused(api, namespace, "gated", node)
    core = await make_core()
    await wait_for(lambda: core.pool()["nodes"], what="the node in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 8})
    bound = await wait_for(lambda: (p := api.read_namespaced_pod("gated", namespace)).spec.node_name and p,
                           what="the gated pod bound")
    assert bound.spec.node_name == node and not bound.spec.scheduling_gates
    (job,) = jobs_of(core, namespace, "gated")
    assert job["state"] == "running" and job["request"]["gpus"] == 2
    (ev,) = await wait_for(lambda: [e for e in pod_events(api, namespace, "gated") if e.reason == "Scheduled"],
                           what="the Scheduled event")
    assert job["id"] in ev.message


async def test_a_gated_pod_over_quota_keeps_its_gate(api: Any, namespace: str, gpu_nodes: Any,
                                                     make_core: Any) -> None:
    gpu_nodes(1, gpus=8)
    core = await make_core()
    await wait_for(lambda: core.pool()["nodes"], what="the node in the pool")
    core.set_project(ADMIN, "capped", {"train_guarantee": 0, "train_limit": 1})
    core.set_project(ADMIN, "vision", {"train_guarantee": 8})
    gated_pod(api, namespace, "too-big", project="capped", gpus=2)
    await wait_for(lambda: [j for j in jobs_of(core, namespace, "too-big") if j["state"] == "rejected"],
                   what="the over-limit pod's job rejected")
    await wait_for(lambda: [e for e in pod_events(api, namespace, "too-big") if e.reason == "GpupoolRejected"],
                   what="the pod told why")
    assert gates_of(api, namespace, "too-big") == [GATE]
    assert scheduled_condition(api, namespace, "too-big") == ("False", "SchedulingGated")
    with Kubelet(api, namespace) as kubelet:
        gated_pod(api, namespace, "all-gpus", gpus=8)
        await wait_for(lambda: "all-gpus" in kubelet.started, what="the first pod running")
        gated_pod(api, namespace, "waits", gpus=8)
        (waiting,) = await wait_for(lambda: jobs_of(core, namespace, "waits"), what="the second pod queued")
        await asyncio.sleep(1.0)  # several cycles: it waits, gated
        assert core.get_job(ADMIN, waiting["id"])["state"] == "queued"
        assert gates_of(api, namespace, "waits") == [GATE]
        assert not api.read_namespaced_pod("waits", namespace).spec.node_name
        kubelet.finish("all-gpus", 0)
        await wait_for(lambda: api.read_namespaced_pod("waits", namespace).spec.node_name,
                       what="the waiting pod bound once the GPUs are free")
        assert gates_of(api, namespace, "waits") == []
    assert gates_of(api, namespace, "too-big") == [GATE] and not api.read_namespaced_pod("too-big", namespace).spec.node_name


async def test_a_pod_with_another_tools_gate_waits_until_only_ours_remains(api: Any, namespace: str, gpu_nodes: Any,
                                                                           make_core: Any) -> None:
    gpu_nodes(1, gpus=8)
    core = await make_core()
    await wait_for(lambda: core.pool()["nodes"], what="the node in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 8})
    gated_pod(api, namespace, "two-gates", gates=("example.com/data-ready", GATE))
    gated_pod(api, namespace, "their-gate", gates=("example.com/data-ready",))
    gated_pod(api, namespace, "ours-only")
    await wait_for(lambda: api.read_namespaced_pod("ours-only", namespace).spec.node_name, what="ours-only bound")
    await asyncio.sleep(1.0)  # the pods were all looked at in the same sync; a few more cycles
    for name, gates in (("two-gates", ["example.com/data-ready", GATE]), ("their-gate", ["example.com/data-ready"])):
        assert not jobs_of(core, namespace, name), name
        assert not api.read_namespaced_pod(name, namespace).spec.node_name, name
        assert gates_of(api, namespace, name) == gates, name
        assert not [e for e in pod_events(api, namespace, name) if e.type == "Warning"], name
    # The other tool removes its gate (gates can only be removed): gpupool takes the pods from there.
    merge = "application/merge-patch+json"  # (replaces the list, as the other tool's controller would)
    api.patch_namespaced_pod("two-gates", namespace, {"spec": {"schedulingGates": [{"name": GATE}]}},
                             _content_type=merge)
    api.patch_namespaced_pod("their-gate", namespace, {"spec": {"schedulingGates": None}}, _content_type=merge)
    for name in ("two-gates", "their-gate"):
        await wait_for(lambda n=name: api.read_namespaced_pod(n, namespace).spec.node_name, what=f"{name} bound")
        assert gates_of(api, namespace, name) == []
        assert [j["state"] for j in jobs_of(core, namespace, name)] == ["running"]


def test_removing_our_gate_keeps_another_tools_gate(api: Any, namespace: str) -> None:
    """gates.remove_gate deletes only gpupool's gate (what a Job's pods may carry as well)."""
    gated_pod(api, namespace, "both", gates=("example.com/data-ready", GATE))
    remove_gate(api, namespace, "both")
    assert gates_of(api, namespace, "both") == ["example.com/data-ready"]
    remove_gate(api, namespace, "both")  # none of ours left: still no error, nothing else removed
    assert gates_of(api, namespace, "both") == ["example.com/data-ready"]
