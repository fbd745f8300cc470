"""Placement rules on a real API server (issue 24, item 2): nodeSelector, node affinity, taints and tolerations.

Two GPU nodes: a small one (2 GPUs), where the packing puts a one-GPU job
when nothing else decides, and a big one (8 GPUs). Every pod here may only
land on the big one (its labels, or the small one's taint), so each test
fails when gpupool ignores the rule: the pod would go to the small node,
whose kubelet refuses it (nodeSelector, affinity) or which an admin set
aside (taint).
"""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.service.actor import Actor
from tests.kube.cluster import Kubelet
from tests.kube.test_kubectl_pods import jobs_of
from tests.kube.test_kubespawner import hub_kubeconfig  # noqa: F401 (a fixture: KubeSpawner's kubeconfig)
from tests.service.helpers import wait_for

ADMIN = Actor("admin", True)
INFERENCE = {"key": "dedicated", "value": "inference", "effect": "NoSchedule"}


def two_nodes(api: Any, gpu_nodes: Any, taint_small: bool = False) -> tuple[str, str]:
    """(small, big): labelled gpu=a100 and gpu=h100; the small one tainted dedicated=inference if asked."""
    (small,) = gpu_nodes(1, gpus=2)
    (big,) = gpu_nodes(1, gpus=8)
    api.patch_node(small, {"metadata": {"labels": {"example.com/gpu": "a100", "example.com/mem": "40"}}})
    api.patch_node(big, {"metadata": {"labels": {"example.com/gpu": "h100", "example.com/mem": "80"}}})
    if taint_small:
        api.patch_node(small, {"spec": {"taints": [INFERENCE]}})
    return small, big


def bound_node(api: Any, ns: str, name: str) -> str | None:
    return api.read_namespaced_pod(name, ns).spec.node_name


def job_pods(api: Any, ns: str, job_id: str) -> list[Any]:
    return api.list_namespaced_pod(ns, label_selector=f"gpupool.io/job={job_id}").items


async def ready_core(make_core: Any, count: int = 2) -> Any:
    core = await make_core()
    await wait_for(lambda: len(core.pool()["nodes"]) == count, what=f"{count} nodes in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 10})
    return core


def with_spec(api: Any, ns: str, name: str, **spec: Any) -> Any:
    """A kubectl pod of one GPU for project vision, with extra pod spec fields (nodeSelector, affinity...)."""
    container = {"name": "main", "image": "registry.example/train:1", "command": ["python", "train.py"],
                 "resources": {"limits": {"nvidia.com/gpu": "1"}},
                 "envFrom": [{"configMapRef": {"name": f"gpupool-{name}"}}]}
    return api.create_namespaced_pod(ns, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": {"gpupool.io/project": "vision"}},
        "spec": {"schedulerName": "gpupool", "restartPolicy": "Never", "containers": [container], **spec}})


async def test_a_kubectl_pod_lands_only_where_its_node_selector_and_required_affinity_allow(
        api: Any, namespace: str, gpu_nodes: Any, make_core: Any) -> None:
    small, big = two_nodes(api, gpu_nodes)
    core = await ready_core(make_core)
    with Kubelet(api, namespace):
        with_spec(api, namespace, "sel", nodeSelector={"example.com/gpu": "h100"})
        assert await wait_for(lambda: bound_node(api, namespace, "sel"), what="sel bound") == big
        with_spec(api, namespace, "aff", affinity={"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": "example.com/gpu", "operator": "In", "values": ["v100"]}]},
                {"matchExpressions": [{"key": "example.com/mem", "operator": "Gt", "values": ["64"]},
                                      {"key": "example.com/gpu", "operator": "Exists"}]}]}}})
        assert await wait_for(lambda: bound_node(api, namespace, "aff"), what="aff bound") == big
        # a control: without rules the same pod goes to the small node (so the two above were the rules' doing)
        with_spec(api, namespace, "free")
        assert await wait_for(lambda: bound_node(api, namespace, "free"), what="free bound") == small
        # what no node matches waits, saying which rule (the pool is elastic: such a node may join)
        with_spec(api, namespace, "v100", nodeSelector={"example.com/gpu": "v100"})
        (job,) = await wait_for(lambda: [j for j in jobs_of(core, namespace, "v100")
                                         if "nodeSelector" in (j.get("reason") or "")], what="v100's reason")
        assert job["state"] == "queued"
        assert job["reason"] == ("no node of the train pool matches nodeSelector example.com/gpu=v100 now; it waits "
                                 "for such a node to join the pool")
        assert bound_node(api, namespace, "v100") is None
        assert job["request"]["node_selector"] == {"example.com/gpu": "v100"}


async def test_a_tainted_node_gets_no_gpupool_pod_unless_it_tolerates_the_taint(
        api: Any, namespace: str, gpu_nodes: Any, make_core: Any) -> None:
    small, big = two_nodes(api, gpu_nodes, taint_small=True)
    core = await ready_core(make_core)
    with Kubelet(api, namespace):
        plain, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 1, "command": ["python", "a.py"]})
        (pod,) = await wait_for(lambda: [p for p in job_pods(api, namespace, plain["id"]) if p.spec.node_name],
                                what="the plain job's pod bound")
        assert pod.spec.node_name == big
        tolerating, _ = await core.submit(ADMIN, {
            "project": "vision", "gpus": 1, "command": ["python", "b.py"],
            "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "inference", "effect": "NoSchedule"}]})
        (pod,) = await wait_for(lambda: [p for p in job_pods(api, namespace, tolerating["id"]) if p.spec.node_name],
                                what="the tolerating job's pod bound")
        assert pod.spec.node_name == small  # it may: the packing puts it there
        assert [(t.key, t.operator, t.value, t.effect) for t in pod.spec.tolerations][:2] == [  # (then defaults)
            ("nvidia.com/gpu", "Exists", None, "NoSchedule"), ("dedicated", "Equal", "inference", "NoSchedule")]
        got = core.get_job(ADMIN, tolerating["id"])
        assert got["request"]["tolerations"] == [
            {"key": "dedicated", "operator": "Equal", "value": "inference", "effect": "NoSchedule"}]
        # a kubectl pod without the toleration does not go there either
        with_spec(api, namespace, "k")
        assert await wait_for(lambda: bound_node(api, namespace, "k"), what="k bound") == big


async def test_a_job_specs_node_selector_and_affinity_go_into_its_pod_and_its_placement(
        api: Any, namespace: str, gpu_nodes: Any, make_core: Any) -> None:
    small, big = two_nodes(api, gpu_nodes)
    core = await ready_core(make_core)
    affinity = {"required": [[{"key": "example.com/mem", "operator": "Gt", "values": ["64"]}]],
                "preferred": [{"weight": 10, "match": [{"key": "example.com/gpu", "operator": "Exists"}]}]}
    with Kubelet(api, namespace):
        job, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 1, "command": ["python", "a.py"],
                                           "node_selector": {"example.com/gpu": "h100"}, "node_affinity": affinity})
        (pod,) = await wait_for(lambda: [p for p in job_pods(api, namespace, job["id"]) if p.spec.node_name],
                                what="the job's pod bound")
        assert pod.spec.node_name == big
        assert pod.spec.node_selector == {"example.com/gpu": "h100"}
        na = pod.spec.affinity.node_affinity
        (term,) = na.required_during_scheduling_ignored_during_execution.node_selector_terms
        assert [(e.key, e.operator, e.values) for e in term.match_expressions] == [("example.com/mem", "Gt", ["64"])]
        (pref,) = na.preferred_during_scheduling_ignored_during_execution
        assert pref.weight == 10 and pref.preference.match_expressions[0].operator == "Exists"
        assert core.get_job(ADMIN, job["id"])["request"]["node_affinity"] == affinity


async def test_a_bad_rule_in_a_job_spec_is_refused_naming_it(namespace: str, gpu_nodes: Any,
                                                              make_core: Any, api: Any) -> None:
    from gpupool.wire.errors import InvalidRequest

    two_nodes(api, gpu_nodes)
    core = await ready_core(make_core)
    with pytest.raises(InvalidRequest, match="example.com/mem Gt takes exactly one whole number"):
        await core.submit(ADMIN, {"project": "vision", "gpus": 1, "command": ["x"], "node_affinity": {
            "required": [[{"key": "example.com/mem", "operator": "Gt", "values": ["lots"]}]]}})
    with pytest.raises(InvalidRequest, match="an Exists toleration has no value"):
        await core.submit(ADMIN, {"project": "vision", "gpus": 1, "command": ["x"], "tolerations": [
            {"key": "dedicated", "operator": "Exists", "value": "inference"}]})


async def test_a_kubespawner_profile_that_picks_a_gpu_type_with_node_selector_lands_on_it(
        api: Any, namespace: str, gpu_nodes: Any, make_core: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real KubeSpawner's server pod for a profile with ``node_selector``: adopted, bound to a matching node."""
    from tests.kube.test_kubespawner import User, hub_config, server_pod

    small, big = two_nodes(api, gpu_nodes)
    core = await ready_core(make_core)
    core.set_project(ADMIN, "vision", {"build_quota": 2})
    c, _ = hub_config(monkeypatch, namespace)
    c.KubeSpawner.profile_list = [*c.KubeSpawner.profile_list, {
        "display_name": "1 GPU, H100", "slug": "one-h100",
        "kubespawner_override": {"extra_resource_limits": {"nvidia.com/gpu": "1"},
                                 "node_selector": {"example.com/gpu": "h100"}}}]
    spawner, pod = await server_pod(c, User("alice", ["vision"]), "one-h100")
    assert pod.spec.node_selector == {"example.com/gpu": "h100"}
    with Kubelet(api, namespace):
        api.create_namespaced_pod(namespace, api.api_client.sanitize_for_serialization(pod))
        node = await wait_for(lambda: bound_node(api, namespace, spawner.pod_name), what="the server pod bound")
        assert node == big
        (job,) = jobs_of(core, namespace, spawner.pod_name)
        assert (job["kind"], job["state"], job["request"]["node_selector"]) == (
            "build", "running", {"example.com/gpu": "h100"})


async def test_rules_set_per_pool_and_project_go_with_every_job_of_them(
        api: Any, namespace: str, gpu_nodes: Any, make_core: Any) -> None:
    """The admin sets the small node aside for training (taint) and project vision to the h100 node: a training
    job of nlp lands on the tainted node (the train pool tolerates it), one of vision on the h100 one."""
    small, big = two_nodes(api, gpu_nodes, taint_small=True)
    api.patch_node(small, {"spec": {"taints": [{"key": "dedicated", "value": "training", "effect": "NoSchedule"}]}})
    core = await make_core(
        kube_pool_placement={"train": {"tolerations": [
            {"key": "dedicated", "operator": "Equal", "value": "training", "effect": "NoSchedule"}]}},
        kube_project_placement={"vision": {"node_selector": {"example.com/gpu": "h100"}}})
    await wait_for(lambda: len(core.pool()["nodes"]) == 2, what="2 nodes in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 4})
    core.set_project(ADMIN, "nlp", {"train_guarantee": 4})
    with Kubelet(api, namespace):
        nlp, _ = await core.submit(ADMIN, {"project": "nlp", "gpus": 1, "command": ["python", "a.py"]})
        vision, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 1, "command": ["python", "b.py"]})
        pods = {}
        for job in (nlp, vision):
            (pods[job["id"]],) = await wait_for(
                lambda j=job: [p for p in job_pods(api, namespace, j["id"]) if p.spec.node_name],
                what=f"{job['id']}'s pod bound")
        assert pods[nlp["id"]].spec.node_name == small
        assert ("dedicated", "training") in [(t.key, t.value) for t in pods[nlp["id"]].spec.tolerations]
        assert pods[vision["id"]].spec.node_name == big
        assert pods[vision["id"]].spec.node_selector == {"example.com/gpu": "h100"}
        assert core.get_job(ADMIN, vision["id"])["request"]["node_selector"] == {"example.com/gpu": "h100"}


async def test_a_gang_with_a_node_selector_runs_every_replica_on_matching_nodes(
        api: Any, namespace: str, gpu_nodes: Any, make_core: Any) -> None:
    nodes = gpu_nodes(4, gpus=4)
    for i, n in enumerate(nodes):  # the first two (first in node order) are not the ones asked for
        api.patch_node(n, {"metadata": {"labels": {"example.com/gpu": "h100" if i >= 2 else "a100"}}})
    core = await ready_core(make_core, count=4)
    with Kubelet(api, namespace) as kubelet:
        job, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 4, "replicas": 2, "command": ["torchrun"],
                                           "node_selector": {"example.com/gpu": "h100"}})
        replicas = [f"gpupool-{job['id']}-1-r{r}" for r in range(2)]
        await wait_for(lambda: all(r in kubelet.started for r in replicas), what="both replicas running")
        got = {p.metadata.name: p for p in job_pods(api, namespace, job["id"])}
        assert sorted(got[r].spec.node_name for r in replicas) == sorted(nodes[2:])
        assert all(got[r].spec.node_selector == {"example.com/gpu": "h100"} for r in replicas)
