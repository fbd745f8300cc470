"""A pod the API server refuses to create (here a namespace ResourceQuota, as an admin sets one): the job is not
"running", its GPUs go back at once, the server's message is its reason, it waits with a backoff, and it fails
after ``kube_refusals_before_failure`` refusals in a row; a gang creates none of its pods unless all can be."""

from __future__ import annotations

import threading
import time
from typing import Any

from kubernetes import watch

from gpupool.backends.kubernetes.calls import refusal
from gpupool.service.actor import Actor
from tests.kube.cluster import Kubelet
from tests.service.helpers import wait_for

ADMIN = Actor("admin", True)


def set_pod_quota(api: Any, namespace: str, pods: int) -> None:
    """A ResourceQuota ``pods: <pods>`` in the namespace, none used yet.

    The test cluster runs no controller manager, so the quota's status (which
    the admission plugin needs before it admits anything) is set here, as the
    quota controller would; admission then counts each pod it admits.
    """
    body = {"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "pods"},
            "spec": {"hard": {"pods": str(pods)}}}
    try:
        api.create_namespaced_resource_quota(namespace, body)
    except Exception:
        api.patch_namespaced_resource_quota("pods", namespace, {"spec": body["spec"]})
    api.patch_namespaced_resource_quota_status("pods", namespace, {"status": {"hard": {"pods": str(pods)},
                                                                             "used": {"pods": "0"}}})


def allocations(core: Any) -> list[Any]:
    return [a for n in core.pool()["nodes"] for g in n["gpus"] for a in g["allocations"]]


def job_pods(api: Any, namespace: str, job_id: str) -> list[Any]:
    return [p for p in api.list_namespaced_pod(namespace).items if p.metadata.labels.get("gpupool.io/job") == job_id]


def test_a_refusal_is_read_from_the_api_servers_status_body() -> None:
    from kubernetes.client.rest import ApiException

    def answer(status: int, body: str | None, reason: str = "Forbidden") -> ApiException:
        e = ApiException(status=status, reason=reason)
        e.body = body
        return e

    quota = answer(403, '{"kind":"Status","message":"pods \\"p\\" is forbidden: exceeded quota: q",'
                        '"reason":"Forbidden","code":403}')
    assert refusal(quota) == 'pods "p" is forbidden: exceeded quota: q (Forbidden)'
    assert refusal(answer(403, None)) == "HTTP 403 Forbidden"
    assert refusal(answer(409, '{"message":"already exists"}', "Conflict")) is None  # the name is taken: not a rule
    assert refusal(answer(429, None, "Too Many Requests")) is None and refusal(answer(503, None)) is None
    assert refusal(OSError("connection refused")) is None


async def test_a_refused_pod_frees_its_gpus_at_once_and_the_jobs_behind_it_start(
        api: Any, namespace: str, gpu_nodes: Any, make_core: Any) -> None:
    # The repro: the admin's quota refuses gpupool's pods; the 8-GPU job must not show "running"
    # holding the node's 8 GPUs while it has no pod.
    set_pod_quota(api, namespace, 0)
    gpu_nodes(1, gpus=8)
    core = await make_core(kube_refused_backoff_s=60.0)
    await wait_for(lambda: core.pool()["nodes"], what="the node in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 8})
    with Kubelet(api, namespace):
        big, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 8, "command": ["python", "train.py"]})
        held = await wait_for(lambda: "exceeded quota" in (j := core.get_job(ADMIN, big["id"]))["reason"] and j,
                              what="the quota's refusal as the job's reason")
        name = f"gpupool-{big['id'].lower()}-1"
        assert held["state"] == "queued" and held["attempts"] == 0, held
        assert held["reason"] == (f'the API server refused pod {name}: pods "{name}" is forbidden: exceeded quota: '
                                  "pods, requested: pods=1, used: pods=0, limited: pods=0 (Forbidden); "
                                  "refusal 1 of 5, tried again in 60 s"), held["reason"]
        assert allocations(core) == []  # its GPUs went back with the refusal
        deadline = time.monotonic() + 2.0  # and it is not tried again every cycle: it waits out its backoff
        while time.monotonic() < deadline:
            assert core.get_job(ADMIN, big["id"])["state"] == "queued"
            await wait_for(lambda: True)
        # The admin lets one pod in: the job behind the refused one gets the GPUs it does not hold.
        set_pod_quota(api, namespace, 1)
        small, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 1, "command": ["python", "eval.py"]})
        await wait_for(lambda: core.get_job(ADMIN, small["id"])["state"] == "running", what="the small job started")
        pod = await wait_for(lambda: [p for p in job_pods(api, namespace, small["id"]) if p.spec.node_name],
                             what="the small job's pod bound")
        assert pod[0].metadata.name == f"gpupool-{small['id'].lower()}-1"
        assert core.get_job(ADMIN, big["id"])["state"] == "queued"  # still waiting out its backoff
        assert job_pods(api, namespace, big["id"]) == []


async def test_a_pod_refused_again_and_again_fails_its_job_with_the_api_servers_message(
        api: Any, namespace: str, gpu_nodes: Any, make_core: Any) -> None:
    set_pod_quota(api, namespace, 0)
    gpu_nodes(1, gpus=8)
    core = await make_core(kube_refused_backoff_s=0.2, kube_refusals_before_failure=3)
    await wait_for(lambda: core.pool()["nodes"], what="the node in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 8})
    job, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 1, "command": ["python", "train.py"]})
    seen: set[str] = set()

    def final() -> Any:
        j = core.get_job(ADMIN, job["id"])
        seen.add(j["reason"].rpartition("; ")[2])
        return j["state"] not in ("queued", "running") and j

    failed = await wait_for(final, what="the job failed")
    assert failed["state"] == "failed", failed
    name = f"gpupool-{job['id'].lower()}-1"
    assert failed["reason"] == (f'the API server refused pod {name}: pods "{name}" is forbidden: exceeded quota: '
                                "pods, requested: pods=1, used: pods=0, limited: pods=0 (Forbidden) (refused 3 "
                                "times in a row; failed after kube_refusals_before_failure)"), failed["reason"]
    assert {"refusal 1 of 3, tried again in 0.2 s", "refusal 2 of 3, tried again in 0.4 s"} <= seen, seen
    assert failed["attempts"] == 0  # no attempt ever ran
    assert allocations(core) == [] and job_pods(api, namespace, job["id"]) == []


async def test_a_gang_creates_none_of_its_pods_unless_all_can_be_and_binds_none(
        api: Any, namespace: str, gpu_nodes: Any, make_core: Any) -> None:
    set_pod_quota(api, namespace, 1)  # rank 0's pod is admitted, rank 1's refused
    gpu_nodes(2, gpus=8)
    core = await make_core(kube_refused_backoff_s=60.0)
    await wait_for(lambda: len(core.pool()["nodes"]) == 2, what="both nodes in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 16})
    bound: list[str] = []
    created: list[str] = []
    stop = threading.Event()

    def watch_pods() -> None:  # every version of every pod: none may ever be bound
        w = watch.Watch()
        while not stop.is_set():
            for ev in w.stream(api.list_namespaced_pod, namespace, timeout_seconds=1):
                pod = ev["object"]
                created.append(pod.metadata.name)
                if pod.spec.node_name:
                    bound.append(pod.metadata.name)

    watcher = threading.Thread(target=watch_pods, daemon=True)
    watcher.start()
    try:
        with Kubelet(api, namespace):
            gang, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 8, "replicas": 2,
                                                "command": ["torchrun", "train.py"]})
            held = await wait_for(lambda: "exceeded quota" in (j := core.get_job(ADMIN, gang["id"]))["reason"] and j,
                                  what="the refusal as the gang's reason")
            r0, r1 = (f"gpupool-{gang['id'].lower()}-1-r{k}" for k in (0, 1))
            assert held["state"] == "queued" and held["reason"].startswith(
                f'the API server refused pod {r1}: pods "{r1}" is forbidden: exceeded quota: pods'), held
            await wait_for(lambda: job_pods(api, namespace, gang["id"]) == [], what="rank 0's pod deleted")
            assert allocations(core) == []
            await wait_for(lambda: r0 in created, what="the watch saw rank 0's pod")  # it was created, then
    finally:
        stop.set()
        watcher.join(5)
    assert bound == [] and r1 not in created  # no pod of the gang was ever bound; rank 1's never existed
