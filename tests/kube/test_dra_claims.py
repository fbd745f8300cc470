"""kubectl pods whose GPUs come from ResourceClaims (DRA): placed by the policy, devices written into the claim.

Real API server and controller-manager (its resourceclaim controller makes a
template's claim and names it in the pod's status); the DRA driver's
ResourceSlices and DeviceClass are published by the test (tests/kube/dra_objects.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpupool.service.actor import Actor
from tests.kube.cluster import Kubelet
from tests.kube.dra_objects import (
    claim_of,
    claim_template,
    claimed_pod,
    delete_dra_node,
    ensure_device_class,
    make_dra_node,
    resource_api,
)
from tests.kube.test_kubectl_pods import jobs_of, pod_events
from tests.service.helpers import wait_for

ADMIN = Actor("admin", True)


@pytest.fixture
def dra_nodes(api: Any) -> Iterator[Callable[..., str]]:
    """Factory: ``dra_nodes(gpus=4, product=..., memory=...)`` -> the node's name; its slice published."""
    ensure_device_class(api)
    made: list[str] = []

    def make(**options: Any) -> str:
        name = f"dra-{uuid.uuid4().hex[:6]}"
        make_dra_node(api, name, **options)
        made.append(name)
        return name

    yield make
    for n in made:
        delete_dra_node(api, n)


def bound_node(api: Any, ns: str, name: str) -> str:
    return str(api.read_namespaced_pod(name, ns).spec.node_name or "")


async def test_a_pod_claiming_a_gpu_from_a_template_gets_the_policys_device_in_its_claim_within_quota(
        api: Any, namespace: str, make_core: Any, dra_nodes: Any) -> None:
    node = dra_nodes(gpus=4)
    core = await make_core()
    await wait_for(lambda: [n for n in core.pool()["nodes"] if n["name"] == node], what="the DRA node in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 1, "train_limit": 1})
    claim_template(api, namespace, "one-gpu", count=1)
    with Kubelet(api, namespace) as kubelet:
        pod = claimed_pod(api, namespace, "first", template="one-gpu")
        await wait_for(lambda: bound_node(api, namespace, "first"), what="the claimed pod bound")
        assert bound_node(api, namespace, "first") == node
        (job,) = jobs_of(core, namespace, "first")
        assert job["request"]["gpus"] == 1 and job["state"] == "running"
        (gpu,) = job["assignment"]["gpus"]
        claim = claim_of(api, namespace, "first")
        assert claim is not None
        alloc = claim["status"]["allocation"]
        assert alloc["devices"]["results"] == [{"request": "gpu", "driver": "gpu.nvidia.com", "pool": node,
                                                "device": f"gpu-{gpu['index']}"}]
        assert alloc["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0]["values"] == [node]
        assert claim["status"]["reservedFor"] == [{"resource": "pods", "name": "first", "uid": pod.metadata.uid}]
        # A second claimed pod is over the project's limit of one GPU: it waits, unbound, its claim untouched.
        claimed_pod(api, namespace, "second", template="one-gpu")
        (second,) = await wait_for(lambda: jobs_of(core, namespace, "second"), what="the second pod queued")
        await wait_for(lambda: core.get_job(ADMIN, second["id"])["reason"], what="the second job's wait reason")
        assert core.get_job(ADMIN, second["id"])["state"] == "queued"
        assert not bound_node(api, namespace, "second")
        second_claim = await wait_for(lambda: claim_of(api, namespace, "second"), what="the second claim made")
        assert not (second_claim.get("status") or {}).get("allocation")
        # The first pod ends: its GPU goes back, and the second pod gets it.
        await wait_for(lambda: "first" in kubelet.started, what="the first pod running")
        kubelet.finish("first", 0)
        await wait_for(lambda: bound_node(api, namespace, "second"), what="the second pod bound after the first")
        claim2 = claim_of(api, namespace, "second")
        assert claim2 is not None and [r["pool"] for r in claim2["status"]["allocation"]["devices"]["results"]] == [
            node]


async def test_a_selector_on_product_and_memory_picks_the_node_whose_devices_match(
        api: Any, namespace: str, make_core: Any, dra_nodes: Any) -> None:
    h100 = dra_nodes(gpus=2, product="NVIDIA H100 80GB HBM3", memory="80Gi")
    a100 = dra_nodes(gpus=8, product="NVIDIA A100-SXM4-40GB", memory="40Gi")
    core = await make_core()
    await wait_for(lambda: {h100, a100} <= {n["name"] for n in core.pool()["nodes"]}, what="both nodes in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 8})
    claim_template(api, namespace, "h100", count=2, selectors=[
        'device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"'])
    claim_template(api, namespace, "big-memory", count=1, selectors=[
        'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("60Gi")) >= 0'])
    claim_template(api, namespace, "small", count=1, selectors=[
        'device.capacity["gpu.nvidia.com"].memory.isLessThan(quantity("60Gi"))'])
    claimed_pod(api, namespace, "on-h100", template="h100")
    claimed_pod(api, namespace, "big", template="small")
    await wait_for(lambda: bound_node(api, namespace, "on-h100") and bound_node(api, namespace, "big"),
                   what="both pods bound")
    assert bound_node(api, namespace, "on-h100") == h100
    assert bound_node(api, namespace, "big") == a100
    claim = claim_of(api, namespace, "on-h100")
    assert claim is not None
    assert sorted(r["device"] for r in claim["status"]["allocation"]["devices"]["results"]) == ["gpu-0", "gpu-1"]
    # The H100 node is full now: a pod whose selector only it passes waits for it, never lands on the A100s.
    claimed_pod(api, namespace, "waits", template="big-memory")
    (job,) = await wait_for(lambda: jobs_of(core, namespace, "waits"), what="the pod queued")
    await wait_for(lambda: core.get_job(ADMIN, job["id"])["reason"], what="its wait reason")
    assert not bound_node(api, namespace, "waits")


async def test_a_claim_gpupool_cannot_place_is_told_on_the_pod_and_checked_again_when_it_changes(
        api: Any, namespace: str, make_core: Any, dra_nodes: Any) -> None:
    dra_nodes(gpus=2)
    core = await make_core()
    await wait_for(lambda: core.pool()["nodes"], what="the node in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 2})
    claim_template(api, namespace, "other-driver", device_class="example.com-fpga")
    claim_template(api, namespace, "bad-cel", selectors=[  # valid for the API server, not for gpupool
        'device.attributes["gpu.nvidia.com"].driverVersion.isGreaterThan(semver("550.0.0"))'])
    resource_api(api).create_namespaced_resource_claim_template(namespace, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate", "metadata": {"name": "alternatives"},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "firstAvailable": [
            {"name": "big", "deviceClassName": "gpu.nvidia.com", "count": 2},
            {"name": "one", "deviceClassName": "gpu.nvidia.com", "count": 1}]}]}}}})
    claimed_pod(api, namespace, "fpga", template="other-driver")
    claimed_pod(api, namespace, "typo", template="bad-cel")
    claimed_pod(api, namespace, "either", template="alternatives")
    claimed_pod(api, namespace, "named", claim="later")
    for pod, says in (("fpga", "device class 'example.com-fpga'"), ("typo", "calls semver(), which gpupool cannot evaluate"),
                      ("either", "firstAvailable"), ("named", f"ResourceClaim {namespace}/later does not exist")):
        (ev,) = await wait_for(lambda p=pod: [e for e in pod_events(api, namespace, p)
                                              if e.reason == "GpupoolClaimUnsupported"], what=f"{pod} told why")
        assert ev.type == "Warning" and says in ev.message, ev.message
        assert not jobs_of(core, namespace, pod) and not bound_node(api, namespace, pod)
    # The missing claim is created: the pod is read again, placed, and its named claim allocated for it.
    resource_api(api).create_namespaced_resource_claim(namespace, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "later"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}})
    await wait_for(lambda: bound_node(api, namespace, "named"), what="the pod with its claim now made bound")
    claim = claim_of(api, namespace, "named")
    assert claim is not None and claim["status"]["reservedFor"][0]["name"] == "named"
    # Its pod deleted, the controller-manager ends the reservation and gpupool gives the named claim's GPU back.
    api.delete_namespaced_pod("named", namespace, grace_period_seconds=0)
    await wait_for(lambda: not (resource_api(api).read_namespaced_resource_claim("later", namespace).status
                                .allocation), what="the named claim deallocated")


async def test_half_gpu_shares_claimed_through_dra_share_one_device_written_in_both_claims(
        api: Any, namespace: str, make_core: Any, dra_nodes: Any) -> None:
    node = dra_nodes(gpus=1)
    core = await make_core()
    await wait_for(lambda: [n for n in core.pool()["nodes"] if n["name"] == node], what="the DRA node in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 1})
    claim_template(api, namespace, "one-gpu", count=1)
    for name in ("half-a", "half-b"):
        claimed_pod(api, namespace, name, template="one-gpu", annotations={"gpupool.io/gpu-fraction": "0.5"})
    await wait_for(lambda: bound_node(api, namespace, "half-a") and bound_node(api, namespace, "half-b"),
                   what="both halves bound to the one GPU")
    for name in ("half-a", "half-b"):
        (job,) = jobs_of(core, namespace, name)
        assert job["request"]["gpu_fraction"] == 0.5 and job["assignment"]["gpus"][0]["milli"] == 500
        claim = claim_of(api, namespace, name)
        assert claim is not None
        assert claim["status"]["allocation"]["devices"]["results"] == [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": node, "device": "gpu-0"}]
        assert claim["status"]["reservedFor"][0]["name"] == name
    # A third half does not fit (the GPU is shared out): it waits.
    claimed_pod(api, namespace, "half-c", template="one-gpu", annotations={"gpupool.io/gpu-fraction": "0.5"})
    (job,) = await wait_for(lambda: jobs_of(core, namespace, "half-c"), what="the third half queued")
    await wait_for(lambda: core.get_job(ADMIN, job["id"])["reason"], what="its wait reason")
    assert not bound_node(api, namespace, "half-c")


async def test_a_pod_asking_for_nvidia_gpu_is_kept_off_nodes_whose_gpus_come_from_slices(
        api: Any, namespace: str, make_core: Any, dra_nodes: Any, gpu_nodes: Any) -> None:
    dra = dra_nodes(gpus=2)  # an exact fit for a 2-GPU pod: best fit would choose it, were it allowed
    (plugin,) = gpu_nodes(1, gpus=4)
    core = await make_core()
    await wait_for(lambda: {dra, plugin} <= {n["name"] for n in core.pool()["nodes"]}, what="both nodes in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 8})
    from tests.kube.test_kubectl_pods import kubectl_pod
    for name in ("two-a", "two-b", "two-c"):
        kubectl_pod(api, namespace, name, gpus=2)
    await wait_for(lambda: bound_node(api, namespace, "two-a") and bound_node(api, namespace, "two-b"),
                   what="two pods bound")
    assert {bound_node(api, namespace, n) for n in ("two-a", "two-b")} == {plugin}
    (job,) = await wait_for(lambda: jobs_of(core, namespace, "two-c"), what="the third pod queued")
    await wait_for(lambda: core.get_job(ADMIN, job["id"])["reason"], what="its wait reason")
    assert not bound_node(api, namespace, "two-c")  # the DRA node's kubelet has no nvidia.com/gpu to admit it


async def test_the_deploy_rbac_is_enough_to_read_slices_and_claims_and_write_an_allocation(
        api: Any, dra_nodes: Any, make_account_core: Any) -> None:
    """As the ServiceAccount of deploy/kubernetes/rbac.yaml: the slices, classes and claims watched, a claim
    allocated and its named claim given back, with no failing call in the backend's health."""
    node = dra_nodes(gpus=2)
    core = await make_account_core()
    await wait_for(lambda: [n for n in core.pool()["nodes"] if n["name"] == node], what="the DRA node, as the SA")
    core.set_project(ADMIN, "vision", {"train_guarantee": 2})
    claim = f"sa-{uuid.uuid4().hex[:6]}"
    resource_api(api).create_namespaced_resource_claim("gpupool", {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": claim},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}}]}}})
    try:
        claimed_pod(api, "gpupool", claim, claim=claim)
        await wait_for(lambda: bound_node(api, "gpupool", claim), what="the claimed pod bound as the SA")
        got = resource_api(api).read_namespaced_resource_claim(claim, "gpupool")
        assert [r.pool for r in got.status.allocation.devices.results] == [node]
        api.delete_namespaced_pod(claim, "gpupool", grace_period_seconds=0)
        await wait_for(lambda: not resource_api(api).read_namespaced_resource_claim(claim, "gpupool").status
                       .allocation, what="the named claim given back as the SA")
        assert core.status(ADMIN)["backend"]["ok"] is True, core.status(ADMIN)["backend"]
    finally:
        resource_api(api).delete_namespaced_resource_claim(claim, "gpupool")


async def test_reclaim_evicts_a_claimed_pod_its_claim_goes_with_it_and_the_guaranteed_pod_gets_the_devices(
        api: Any, namespace: str, make_core: Any, dra_nodes: Any) -> None:
    node = dra_nodes(gpus=2)
    core = await make_core()
    await wait_for(lambda: [n for n in core.pool()["nodes"] if n["name"] == node], what="the DRA node in the pool")
    core.set_project(ADMIN, "scrappy", {"train_guarantee": 0})
    core.set_project(ADMIN, "owner", {"train_guarantee": 2})
    claim_template(api, namespace, "both", count=2)
    with Kubelet(api, namespace, stop_exit_code=0) as kubelet:
        claimed_pod(api, namespace, "borrower", template="both", project="scrappy")
        await wait_for(lambda: "borrower" in kubelet.started, what="the borrowing pod running")
        borrowed = claim_of(api, namespace, "borrower")
        assert borrowed is not None and len(borrowed["status"]["allocation"]["devices"]["results"]) == 2
        claimed_pod(api, namespace, "owned", template="both", project="owner")
        await wait_for(lambda: "borrower" in kubelet.stopped, what="the borrowing pod evicted")
        (victim,) = jobs_of(core, namespace, "borrower")
        await wait_for(lambda: core.get_job(ADMIN, victim["id"])["state"] == "cancelled", what="its job cancelled")
        await wait_for(lambda: bound_node(api, namespace, "owned"), what="the guaranteed pod bound")
    owned = claim_of(api, namespace, "owned")
    assert owned is not None and sorted(r["device"] for r in owned["status"]["allocation"]["devices"]["results"]) \
        == ["gpu-0", "gpu-1"]
    # The evicted pod's claim (its template's, owned by the pod) is gone with the pod.
    name = borrowed["metadata"]["name"]
    await wait_for(lambda: name not in {c.metadata.name for c in
                                        resource_api(api).list_namespaced_resource_claim(namespace).items},
                   what="the evicted pod's claim deleted with it")


async def test_gpupools_own_job_pod_on_a_dra_node_names_a_claim_it_owns_allocated_with_the_chosen_gpus(
        api: Any, namespace: str, make_core: Any, dra_nodes: Any) -> None:
    node = dra_nodes(gpus=4)
    core = await make_core()
    await wait_for(lambda: [n for n in core.pool()["nodes"] if n["name"] == node], what="the DRA node in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 4})
    with Kubelet(api, namespace) as kubelet:
        job, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 2, "command": ["python", "train.py"]})
        pod_name = f"gpupool-{job['id'].lower()}-1"
        await wait_for(lambda: pod_name in kubelet.started, what="the job's pod running")
        pod = api.read_namespaced_pod(pod_name, namespace)
        assert pod.spec.node_name == node
        assert [(c.name, c.resource_claim_name) for c in pod.spec.resource_claims] == [("gpu", f"{pod_name}-gpu")]
        assert [c.name for c in pod.spec.containers[0].resources.claims] == ["gpu"]
        claim = api.api_client.sanitize_for_serialization(
            resource_api(api).read_namespaced_resource_claim(f"{pod_name}-gpu", namespace))
        assert [(o["kind"], o["uid"]) for o in claim["metadata"]["ownerReferences"]] == [("Pod", pod.metadata.uid)]
        assert claim["spec"]["devices"]["requests"][0]["exactly"]["count"] == 2
        chosen = core.get_job(ADMIN, job["id"])["assignment"]["gpus"]
        assert [r["device"] for r in claim["status"]["allocation"]["devices"]["results"]] == [
            f"gpu-{g['index']}" for g in chosen]
        assert claim["status"]["reservedFor"] == [{"resource": "pods", "name": pod_name, "uid": pod.metadata.uid}]
        kubelet.finish(pod_name, 0)
        await wait_for(lambda: core.get_job(ADMIN, job["id"])["state"] == "succeeded", what="the job done")


async def test_devices_another_scheduler_allocated_to_its_pod_are_used_capacity_exactly_those(
        api: Any, namespace: str, make_core: Any, dra_nodes: Any) -> None:
    node = dra_nodes(gpus=4)
    core = await make_core()
    await wait_for(lambda: [n for n in core.pool()["nodes"] if n["name"] == node], what="the DRA node in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 4})
    # What another scheduler does for its pod: allocate the claim (devices gpu-2 and gpu-3), reserve it, bind.
    rapi = resource_api(api)
    rapi.create_namespaced_resource_claim(namespace, {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim", "metadata": {"name": "theirs"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com",
                                                                      "count": 2}}]}}})
    pod = api.create_namespaced_pod(namespace, {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "elsewhere"},
        "spec": {"schedulerName": "another-scheduler", "resourceClaims": [{"name": "gpu", "resourceClaimName": "theirs"}],
                 "containers": [{"name": "c", "image": "cuda:12", "resources": {"claims": [{"name": "gpu"}]}}]}})
    claim = api.api_client.sanitize_for_serialization(rapi.read_namespaced_resource_claim("theirs", namespace))
    claim["status"] = {"allocation": {"devices": {"results": [
        {"request": "gpu", "driver": "gpu.nvidia.com", "pool": node, "device": d} for d in ("gpu-2", "gpu-3")]},
        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]}},
        "reservedFor": [{"resource": "pods", "name": "elsewhere", "uid": pod.metadata.uid}]}
    rapi.replace_namespaced_resource_claim_status("theirs", namespace, claim)
    api.create_namespaced_pod_binding("elsewhere", namespace, {
        "apiVersion": "v1", "kind": "Binding", "metadata": {"name": "elsewhere"},
        "target": {"apiVersion": "v1", "kind": "Node", "name": node}}, _preload_content=False)

    def held() -> dict[int, list[str]]:
        (n,) = [n for n in core.pool()["nodes"] if n["name"] == node]
        return {g["index"]: [a["kind"] for a in g["allocations"]] for g in n["gpus"] if g["allocations"]}
    assert await wait_for(lambda: held(), what="the other pod's devices held") == {2: ["other"], 3: ["other"]}
    # gpupool places its own claimed pod around them: two GPUs fit (gpu-0, gpu-1), the claim says so.
    claim_template(api, namespace, "two", count=2)
    claimed_pod(api, namespace, "ours", template="two")
    await wait_for(lambda: bound_node(api, namespace, "ours"), what="our claimed pod bound")
    ours = claim_of(api, namespace, "ours")
    assert ours is not None
    assert sorted(r["device"] for r in ours["status"]["allocation"]["devices"]["results"]) == ["gpu-0", "gpu-1"]


async def test_a_podgroup_whose_pods_claim_devices_and_ask_nvidia_gpu_too_is_told_it_is_not_queued(
        api: Any, namespace: str, make_core: Any, gpu_nodes: Any) -> None:
    from tests.kube.test_workload_gangs import make_gang

    gpu_nodes(1, gpus=8)
    core = await make_core()
    await wait_for(lambda: core.pool()["nodes"], what="the node in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 8})
    make_gang(api, namespace, "claimed", "claimed-0", min_count=2)
    for k in range(2):
        api.create_namespaced_pod(namespace, {
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"w{k}", "labels": {"gpupool.io/project": "vision"}},
            "spec": {"schedulerName": "gpupool", "restartPolicy": "Never",
                     "schedulingGroup": {"podGroupName": "claimed-0"},
                     "resourceClaims": [{"name": "gpu", "resourceClaimName": f"w{k}-gpu"}],
                     "containers": [{"name": "main", "image": "registry.example/train:1",
                                     "resources": {"limits": {"nvidia.com/gpu": "1"}, "claims": [{"name": "gpu"}]}}]}})
    (ev, *_) = await wait_for(lambda: [e for e in pod_events(api, namespace, "w0") if e.reason == "GpupoolNotQueued"],
                              what="the gang's pods told why")
    assert "claim devices through DRA" in ev.message and "nvidia.com/gpu too" in ev.message, ev.message
    assert ev.type == "Warning"
    assert not [j for j in core.list_jobs(ADMIN) if j["labels"].get("gpupool.io/podgroup")]
    assert not bound_node(api, namespace, "w0") and not bound_node(api, namespace, "w1")
