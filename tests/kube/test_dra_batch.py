"""batch/v1 Jobs, JobSets and PodGroups whose pods claim GPUs through a ResourceClaimTemplate (DRA): one gang each.

Real API server and controller-manager: the Job controller makes and deletes
the pods, the resourceclaim controller makes each pod's claim from the
template (and deletes it with its pod); the DRA driver's ResourceSlices and
DeviceClass are published by the test (tests/kube/dra_objects.py); the
kubelet is the stand-in of tests/kube/cluster.py.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

from kubernetes import client, config

from gpupool.app.backend import build_core
from gpupool.service.actor import Actor
from tests.kube.cluster import Kubelet
from tests.kube.conftest import kube_config, start_components
from tests.kube.dra_objects import claim_of, claim_template, resource_api
from tests.kube.test_batch_jobs import (  # noqa: F401 (batch: a fixture)
    JOBSET,
    batch,
    job_body,
    job_events,
    job_pods,
    jobs_of,
    jobset_body,
    jobset_pods,
)
from tests.kube.test_dra_claims import dra_nodes  # noqa: F401 (fixture)
from tests.kube.test_workload_gangs import make_gang
from tests.service.helpers import wait_for

ADMIN = Actor("admin", True)


def claimed_job(name: str, template: str, *, project: str = "vision", parallelism: int = 2) -> dict[str, Any]:
    """A suspended Job for gpupool whose pods each claim their GPUs from ResourceClaimTemplate ``template``."""
    body = job_body(name, project=project, parallelism=parallelism)
    pod = body["spec"]["template"]["spec"]
    pod["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": template}]
    pod["containers"][0]["resources"] = {"claims": [{"name": "gpu"}]}
    return body


def claims_in(api: Any, ns: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = api.api_client.sanitize_for_serialization(
        resource_api(api).list_namespaced_resource_claim(ns).items)
    return out


def allocated_for_its_pod(api: Any, ns: str, pod: Any) -> list[str]:
    """The devices of the pod's claim, checked to be allocated on the pod's node and reserved for it ([] before)."""
    claim = claim_of(api, ns, pod.metadata.name)
    status = (claim or {}).get("status") or {}
    if not status.get("allocation"):
        return []
    node = pod.spec.node_name
    assert status["allocation"]["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [node]
    assert status["reservedFor"] == [{"resource": "pods", "name": pod.metadata.name, "uid": pod.metadata.uid}]
    results = status["allocation"]["devices"]["results"]
    assert {(r["request"], r["driver"], r["pool"]) for r in results} == {("gpu", "gpu.nvidia.com", node)}, results
    return [r["device"] for r in results]


async def test_a_job_claiming_a_gpu_per_pod_is_admitted_as_one_gang_reclaimed_and_resumed(
        api: Any, namespace: str, batch: Any, make_core: Any, dra_nodes: Any) -> None:  # noqa: F811
    node = dra_nodes(gpus=2)
    core = await make_core()
    await wait_for(lambda: [n for n in core.pool()["nodes"] if n["name"] == node], what="the DRA node in the pool")
    core.set_project(ADMIN, "scrappy", {"train_guarantee": 0, "train_limit": 2})
    core.set_project(ADMIN, "owner", {"train_guarantee": 2})
    claim_template(api, namespace, "one-gpu", count=1)
    with Kubelet(api, namespace) as kubelet:
        batch.create_namespaced_job(namespace, claimed_job("borrow", "one-gpu", project="scrappy"))
        (job,) = await wait_for(lambda: [j for j in jobs_of(core, namespace, "borrow") if j["state"] == "running"],
                                what="the Job's gang admitted")
        assert (job["project"], job["request"]["gpus"], job["request"]["replicas"]) == ("scrappy", 1, 2)
        first = await wait_for(lambda: len(p := job_pods(api, namespace, "borrow")) == 2 and all(
            x.metadata.name in kubelet.started for x in p) and p, what="both claimed pods bound and running")
        assert {p.spec.node_name for p in first} == {node}
        devices = [d for p in first for d in allocated_for_its_pod(api, namespace, p)]
        chosen = sorted(f"gpu-{g['index']}" for r in job["assignment"]["replicas"] for g in r["gpus"])
        assert sorted(devices) == chosen == ["gpu-0", "gpu-1"]  # each pod its own GPU: the ones the policy chose
        assert not [j for j in core.list_jobs(ADMIN) if j["labels"].get("gpupool.io/pod")]  # not kubectl pods
        first_claims = {c["metadata"]["name"] for c in claims_in(api, namespace)}
        assert len(first_claims) == 2
        # A guaranteed project takes its two GPUs back: the Job is suspended, its pods and their claims go.
        owner, _ = await core.submit(ADMIN, {"project": "owner", "gpus": 2, "command": ["python", "train.py"]})
        await wait_for(lambda: core.get_job(ADMIN, job["id"])["state"] == "paused", what="the Job's job paused")
        assert batch.read_namespaced_job("borrow", namespace).spec.suspend is True
        (told,) = [e for e in job_events(api, namespace, "borrow") if e.reason == "GpupoolStopped"]
        assert "project owner" in told.message, told.message
        await wait_for(lambda: not job_pods(api, namespace, "borrow"), what="its pods deleted")
        await wait_for(lambda: not first_claims & {c["metadata"]["name"] for c in claims_in(api, namespace)},
                       what="their claims deleted with them")
        await wait_for(lambda: core.get_job(ADMIN, owner["id"])["state"] == "running", what="the owner's job running")
        # The owner is done: the Job resumes, its new pods' new claims allocated before they are bound.
        await core.cancel(ADMIN, owner["id"])
        second = await wait_for(lambda: len(p := job_pods(api, namespace, "borrow")) == 2 and all(
            x.spec.node_name for x in p) and p, what="the Job resumed, its new pods bound")
        assert not {p.metadata.name for p in second} & {p.metadata.name for p in first}
        assert sorted(d for p in second for d in allocated_for_its_pod(api, namespace, p)) == ["gpu-0", "gpu-1"]
        for p in second:
            assert p.metadata.annotations["gpupool.io/resume"] == "1"
        resumed = core.get_job(ADMIN, job["id"])
        assert resumed["state"] == "running" and resumed["attempts"] == 2


async def test_a_job_whose_claims_gpupool_cannot_place_is_told_and_one_waiting_for_its_template_is_read_again(
        api: Any, namespace: str, batch: Any, make_core: Any, dra_nodes: Any) -> None:  # noqa: F811
    node = dra_nodes(gpus=2)
    core = await make_core()
    await wait_for(lambda: [n for n in core.pool()["nodes"] if n["name"] == node], what="the DRA node in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 2})
    claim_template(api, namespace, "fpga", device_class="example.com-fpga")
    with Kubelet(api, namespace):
        batch.create_namespaced_job(namespace, claimed_job("other-class", "fpga", parallelism=1))
        batch.create_namespaced_job(namespace, claimed_job("early", "later", parallelism=2))
        (told,) = await wait_for(lambda: [e for e in job_events(api, namespace, "other-class")
                                          if e.reason == "GpupoolNotQueued"], what="the Job told why not")
        assert "cannot place this Job's claims" in told.message and "device class 'example.com-fpga'" in told.message
        (early,) = await wait_for(lambda: [e for e in job_events(api, namespace, "early")
                                           if e.reason == "GpupoolNotQueued"], what="the early Job told why not")
        assert f"ResourceClaimTemplate {namespace}/later does not exist" in early.message, early.message
        assert not jobs_of(core, namespace, "other-class") and not jobs_of(core, namespace, "early")
        assert batch.read_namespaced_job("other-class", namespace).spec.suspend is True
        assert not job_pods(api, namespace, "other-class")
        # Its template made: the waiting Job is read again, admitted, and its pods' claims allocated.
        claim_template(api, namespace, "later", count=1)
        pods = await wait_for(lambda: len(p := job_pods(api, namespace, "early")) == 2 and all(
            x.spec.node_name for x in p) and p, what="the early Job admitted, its pods bound")
        assert sorted(d for p in pods for d in allocated_for_its_pod(api, namespace, p)) == ["gpu-0", "gpu-1"]
        assert not jobs_of(core, namespace, "other-class")


async def test_a_jobset_whose_pods_claim_gpus_by_selector_lands_on_the_nodes_whose_devices_pass(
        api: Any, namespace: str, kubeconfig: Path, make_core: Any, dra_nodes: Any) -> None:  # noqa: F811
    start_components(kubeconfig, "jobset")  # the JobSet CRD, controller and webhooks (before the core starts)
    custom = client.CustomObjectsApi(config.new_client_from_config(config_file=str(kubeconfig)))
    h100 = dra_nodes(gpus=2, product="NVIDIA H100 80GB HBM3", memory="80Gi")
    a100 = dra_nodes(gpus=2, product="NVIDIA A100-SXM4-40GB", memory="40Gi")
    core = await make_core()
    await wait_for(lambda: {h100, a100} <= {n["name"] for n in core.pool()["nodes"]}, what="both nodes in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 4})
    claim_template(api, namespace, "one-a100", count=1, selectors=[
        'device.attributes["gpu.nvidia.com"].productName == "NVIDIA A100-SXM4-40GB"'])
    body = jobset_body("ring", workers=1)
    for rj in body["spec"]["replicatedJobs"]:
        rj["template"]["spec"]["template"] = claimed_job("x", "one-a100")["spec"]["template"]
    with Kubelet(api, namespace) as kubelet:
        custom.create_namespaced_custom_object(*JOBSET, namespace, "jobsets", body)
        (job,) = await wait_for(lambda: [j for j in core.list_jobs(ADMIN)
                                         if j["labels"].get("gpupool.io/jobset") == f"{namespace}/ring"
                                         and j["state"] == "running"], what="the JobSet admitted")
        assert (job["request"]["replicas"], job["request"]["gpus"]) == (2, 1)
        pods = await wait_for(lambda: len(p := jobset_pods(api, namespace, "ring")) == 2 and all(
            x.metadata.name in kubelet.started for x in p) and p, what="its 2 pods bound and running")
        assert {p.spec.node_name for p in pods} == {a100}  # never the H100s its selector refuses
        assert sorted(d for p in pods for d in allocated_for_its_pod(api, namespace, p)) == ["gpu-0", "gpu-1"]


async def test_a_podgroup_whose_pods_claim_a_gpu_each_is_bound_whole_with_each_claim_allocated(
        api: Any, namespace: str, make_core: Any, dra_nodes: Any) -> None:  # noqa: F811
    node = dra_nodes(gpus=2)
    core = await make_core()
    await wait_for(lambda: [n for n in core.pool()["nodes"] if n["name"] == node], what="the DRA node in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 2})
    claim_template(api, namespace, "one-gpu", count=1)
    make_gang(api, namespace, "claimed", "claimed-0", min_count=2)
    with Kubelet(api, namespace) as kubelet:
        pods = []
        for k in range(2):
            pods.append(api.create_namespaced_pod(namespace, {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": f"w{k}", "labels": {"gpupool.io/project": "vision"}},
                "spec": {"schedulerName": "gpupool", "restartPolicy": "Never",
                         "schedulingGroup": {"podGroupName": "claimed-0"},
                         "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
                         "containers": [{"name": "main", "image": "registry.example/train:1",
                                         "resources": {"claims": [{"name": "gpu"}]}}]}}))
        (job,) = await wait_for(lambda: [j for j in core.list_jobs(ADMIN) if j["labels"].get("gpupool.io/podgroup")
                                         and j["state"] == "running"], what="the gang admitted")
        assert (job["request"]["gpus"], job["request"]["replicas"]) == (1, 2)
        await wait_for(lambda: {"w0", "w1"} <= set(kubelet.started), what="both pods bound and running")
        bound = [api.read_namespaced_pod(p.metadata.name, namespace) for p in pods]
        assert {p.spec.node_name for p in bound} == {node}
        assert sorted(d for p in bound for d in allocated_for_its_pod(api, namespace, p)) == ["gpu-0", "gpu-1"]


async def test_the_deploy_rbac_is_enough_to_read_a_jobs_claim_template_and_allocate_its_pods_claims(
        api: Any, batch: Any, make_account_core: Any, dra_nodes: Any) -> None:  # noqa: F811
    """As the ServiceAccount of deploy/kubernetes/rbac.yaml (its own namespace): the templates watched, the Job
    admitted, its pod's claim allocated, with no failing call in the backend's health."""
    node = dra_nodes(gpus=2)
    name = f"sa-{uuid.uuid4().hex[:6]}"
    core = await make_account_core()
    await wait_for(lambda: [n for n in core.pool()["nodes"] if n["name"] == node], what="the DRA node, as the SA")
    core.set_project(ADMIN, "vision", {"train_guarantee": 2})
    claim_template(api, "gpupool", name, count=2)
    try:
        with Kubelet(api, "gpupool") as kubelet:
            batch.create_namespaced_job("gpupool", claimed_job(name, name, parallelism=1))
            (pod,) = await wait_for(lambda: [p for p in job_pods(api, "gpupool", name)
                                             if p.metadata.name in kubelet.started], what="admitted and bound as the SA")
            assert pod.spec.node_name == node
            assert sorted(allocated_for_its_pod(api, "gpupool", pod)) == ["gpu-0", "gpu-1"]
            assert core.status(ADMIN)["backend"]["ok"] is True, core.status(ADMIN)["backend"]
            batch.delete_namespaced_job(name, "gpupool", propagation_policy="Background")
    finally:
        resource_api(api).delete_namespaced_resource_claim_template(name, "gpupool")


async def test_a_jobs_next_pod_gets_the_gpu_its_ended_pod_freed_never_one_still_held_across_a_restart(
        api: Any, namespace: str, batch: Any, kubeconfig: Path, dra_nodes: Any,  # noqa: F811
        tmp_path: Path) -> None:
    node = dra_nodes(gpus=2)
    cfg = kube_config(tmp_path / "state", kubeconfig, namespace)
    core = build_core(cfg)
    await core.start()
    try:
        await wait_for(lambda: [n for n in core.pool()["nodes"] if n["name"] == node], what="the DRA node")
        core.set_project(ADMIN, "vision", {"train_guarantee": 2})
        claim_template(api, namespace, "one-gpu", count=1)
        body = claimed_job("steps", "one-gpu", parallelism=2)
        body["spec"].update(completions=4, completionMode="Indexed")  # pods steps-<index>-..., 2 at once

        def pod_of(index: int) -> Any:
            return next((p for p in job_pods(api, namespace, "steps") if p.spec.node_name and
                         p.metadata.annotations.get("batch.kubernetes.io/job-completion-index") == str(index)), None)

        with Kubelet(api, namespace) as kubelet:
            batch.create_namespaced_job(namespace, body)
            first = [await wait_for(lambda i=i: pod_of(i), what=f"pod {i} bound") for i in (0, 1)]
            held = [allocated_for_its_pod(api, namespace, p) for p in first]
            assert sorted(d for ds in held for d in ds) == ["gpu-0", "gpu-1"]
            await wait_for(lambda: first[0].metadata.name in kubelet.started, what="pod 0 running")
            kubelet.finish(first[0].metadata.name, 0)
            third = await wait_for(lambda: pod_of(2), what="pod 2 bound in the slot pod 0 freed")
            assert allocated_for_its_pod(api, namespace, third) == held[0]
            await wait_for(lambda: {first[1].metadata.name, third.metadata.name} <= set(kubelet.started),
                           what="pods 1 and 2 running")
            await core.stop()
            core = build_core(cfg)  # it finds pods 1 and 2 bound: each keeps the slot of the GPU its claim holds
            await core.start()
            (job,) = await wait_for(lambda: [j for j in jobs_of(core, namespace, "steps") if j["state"] == "running"],
                                    what="the Job found again")
            kubelet.finish(first[1].metadata.name, 0)
            fourth = await wait_for(lambda: pod_of(3), what="pod 3 bound in the slot pod 1 freed")
            assert allocated_for_its_pod(api, namespace, fourth) == held[1]  # never pod 2's, still held
            assert core.get_job(ADMIN, job["id"])["attempts"] == 1
    finally:
        await core.stop()
