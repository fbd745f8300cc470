"""A pod removed or evicted by someone else requeues its job to resume; it never gives the job a result.

The API server is real; tests/kube/cluster.py plays the kubelet (a graceful
deletion ends the container with its checkpoint exit code). The disruptions
come from the admin's client, as ``kubectl delete pod``, an Eviction, a
kubelet's node-pressure eviction or a ``DisruptionTarget`` condition would.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpupool.app.backend import build_core
from gpupool.backends.kubernetes.disruption import disruption
from gpupool.backends.kubernetes.pods import pod_end
from gpupool.service.actor import Actor
from gpupool.service.core import SchedulerCore
from tests.kube.cluster import Kubelet, now_text, pod_env
from tests.kube.conftest import kube_config
from tests.kube.test_kubectl_pods import jobs_of, kubectl_pod
from tests.service.helpers import wait_for

ADMIN = Actor("admin", True)
GANG = {"project": "vision", "gpus": 8, "replicas": 2, "command": ["torchrun", "train.py"]}


async def _core(tmp_path: Path, kubeconfig: Path, namespace: str, nodes: int = 1, **overrides: Any) -> SchedulerCore:
    core = build_core(kube_config(tmp_path / "state", kubeconfig, namespace, **overrides))
    await core.start()
    await wait_for(lambda: len(core.pool()["nodes"]) == nodes, what="the nodes in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 8 * nodes})
    return core


def _states(core: SchedulerCore, job_id: str) -> list[tuple[str, str]]:
    """(state, reason) of each of the job's events, in order: what ``gpupool events`` shows."""
    return [(e["state"], e.get("reason") or "") for e in core.events_since(0) if e.get("job_id") == job_id]


async def _resumed(core: SchedulerCore, kubelet: Kubelet, api: Any, namespace: str, job_id: str,
                   pods: tuple[str, ...]) -> dict[str, Any]:
    """Wait for attempt 2 running (its pods started by the kubelet, told to resume); the job as then seen.

    A job that turns final instead (the bug: the SIGTERM exit taken as its result) fails at once, saying so.
    """
    await wait_for(lambda: all(p in kubelet.started for p in pods)
                   or core.get_job(ADMIN, job_id)["state"] in ("succeeded", "failed", "cancelled"),
                   what="attempt 2 running")
    job = core.get_job(ADMIN, job_id)
    assert all(p in kubelet.started for p in pods), f"{job['state']}: {job['reason']}"
    assert (job["state"], job["attempts"]) == ("running", 2), job
    for p in pods:
        assert pod_env(api.read_namespaced_pod(p, namespace))["GPUPOOL_RESUME"] == "1"
    return job


def _evicted_status(api: Any, namespace: str, name: str, image: str = "busybox:1.36") -> None:
    """What a kubelet's node-pressure eviction writes: the pod Failed, ``reason: Evicted``, the container killed."""
    api.patch_namespaced_pod_status(name, namespace, {"status": {
        "phase": "Failed", "reason": "Evicted", "message": "The node was low on resource: memory.",
        "containerStatuses": [{"name": "job", "ready": False, "restartCount": 0, "image": image, "imageID": "",
                               "state": {"terminated": {"exitCode": 137, "reason": "Error",
                                                        "startedAt": now_text(), "finishedAt": now_text()}}}]}})


@pytest.mark.parametrize("exit_code", [143, 0], ids=["sigterm-143", "checkpoints-and-exits-0"])
async def test_a_pod_deleted_by_someone_else_requeues_its_job_to_resume(
        api: Any, namespace: str, gpu_nodes: Any, kubeconfig: Path, tmp_path: Path, exit_code: int) -> None:
    gpu_nodes(1, gpus=8)
    core = await _core(tmp_path, kubeconfig, namespace)
    try:
        job, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 2, "command": ["python", "train.py"]})
        first, second = f"gpupool-{job['id']}-1", f"gpupool-{job['id']}-2"
        with Kubelet(api, namespace, stop_exit_code=exit_code) as kubelet:
            await wait_for(lambda: first in kubelet.started, what="the pod running")
            api.delete_namespaced_pod(first, namespace)  # kubectl delete pod, as the admin (its grace: SIGTERM)
            again = await _resumed(core, kubelet, api, namespace, job["id"], (second,))
            assert first in kubelet.stopped
            states = _states(core, job["id"])
            assert [s for s, _ in states] == ["queued", "running", "paused", "running"], states
            why = states[2][1]
            assert why.startswith(f"its pod {first} was deleted by someone else, not gpupool"), why
            assert f"exited with code {exit_code}" in why and why.endswith("requeued to resume")
            assert again["exit_code"] is None  # the SIGTERM exit is no result
            # gpupool's own deletion is what it asked for: a cancel ends the job, not a requeue.
            await core.cancel(ADMIN, job["id"])
            done = await wait_for(lambda: (j := core.get_job(ADMIN, job["id"]))["state"] != "running" and j,
                                  what="the cancel settled")
            assert (done["state"], done["attempts"]) == ("cancelled", 2)
    finally:
        await core.stop()


async def test_an_eviction_requeues_its_job_to_resume(api: Any, namespace: str, gpu_nodes: Any, kubeconfig: Path,
                                                      tmp_path: Path) -> None:
    """The ``pods/eviction`` subresource (a drain, a descheduler).

    From Kubernetes 1.26 the API server marks the evicted pod with a
    ``DisruptionTarget`` condition (reason ``EvictionByEvictionAPI``) before
    deleting it, so gpupool can say it was an eviction; before (v1.20) the
    pod was only deleted.
    """
    gpu_nodes(1, gpus=8)
    minor = int("".join(c for c in client.VersionApi(api.api_client).get_code().minor if c.isdigit()))
    core = await _core(tmp_path, kubeconfig, namespace)
    try:
        job, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 1, "command": ["python", "train.py"]})
        first = f"gpupool-{job['id']}-1"
        with Kubelet(api, namespace) as kubelet:
            await wait_for(lambda: first in kubelet.started, what="the pod running")
            resp = api.create_namespaced_pod_eviction(first, namespace, {
                "apiVersion": "policy/v1" if minor >= 22 else "policy/v1beta1", "kind": "Eviction",
                "metadata": {"name": first, "namespace": namespace}}, _preload_content=False)
            assert resp.status == 201
            await _resumed(core, kubelet, api, namespace, job["id"], (f"gpupool-{job['id']}-2",))
            states = _states(core, job["id"])
            assert [s for s, _ in states] == ["queued", "running", "paused", "running"], states
            assert (f"its pod {first} was evicted through the Eviction API (a drain or a descheduler)" if minor >= 26
                    else "was deleted by someone else") in states[2][1]
    finally:
        await core.stop()


async def test_a_kubelet_eviction_requeues_its_job_to_resume(api: Any, namespace: str, gpu_nodes: Any,
                                                             kubeconfig: Path, tmp_path: Path) -> None:
    """Node pressure: the kubelet kills the container (137) and marks the pod ``Evicted``; it deletes nothing."""
    nodes = gpu_nodes(1, gpus=8)
    core = await _core(tmp_path, kubeconfig, namespace)
    try:
        job, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 1, "command": ["python", "train.py"]})
        first = f"gpupool-{job['id']}-1"
        with Kubelet(api, namespace) as kubelet:
            await wait_for(lambda: first in kubelet.started, what="the pod running")
            _evicted_status(api, namespace, first)
            await _resumed(core, kubelet, api, namespace, job["id"], (f"gpupool-{job['id']}-2",))
            states = _states(core, job["id"])
            assert [s for s, _ in states] == ["queued", "running", "paused", "running"], states
            assert states[2][1] == (f"its pod {first} was evicted by the kubelet of node {nodes[0]} (The node was "
                                    "low on resource: memory.); its container then exited with code 137; "
                                    "requeued to resume")
    finally:
        await core.stop()


async def test_a_disruption_target_condition_makes_even_exit_0_no_result(api: Any, namespace: str, gpu_nodes: Any,
                                                                         kubeconfig: Path, tmp_path: Path) -> None:
    """Kubernetes 1.26 on marks a pod it disrupts (here the kubelet's graceful node shutdown) before its end."""
    gpu_nodes(1, gpus=8)
    core = await _core(tmp_path, kubeconfig, namespace)
    try:
        job, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 1, "command": ["python", "train.py"]})
        first = f"gpupool-{job['id']}-1"
        with Kubelet(api, namespace) as kubelet:
            await wait_for(lambda: first in kubelet.started, what="the pod running")
            api.patch_namespaced_pod_status(first, namespace, {"status": {"conditions": [{
                "type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet",
                "message": "Pod was terminated in response to imminent node shutdown.",
                "lastTransitionTime": now_text()}]}})
            kubelet.finish(first, 0)  # it checkpointed on SIGTERM and exited 0: not done, only stopped
            await _resumed(core, kubelet, api, namespace, job["id"], (f"gpupool-{job['id']}-2",))
            states = _states(core, job["id"])
            assert [s for s, _ in states] == ["queued", "running", "paused", "running"], states
            assert "was terminated by its kubelet" in states[2][1] and "imminent node shutdown" in states[2][1]
    finally:
        await core.stop()


async def test_a_pod_evicted_while_the_scheduler_was_away_resumes_after_the_restart(
        api: Any, namespace: str, gpu_nodes: Any, kubeconfig: Path, tmp_path: Path) -> None:
    gpu_nodes(1, gpus=8)
    core = await _core(tmp_path, kubeconfig, namespace)
    job, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 1, "command": ["python", "train.py"]})
    first = f"gpupool-{job['id']}-1"
    with Kubelet(api, namespace) as kubelet:
        try:
            await wait_for(lambda: first in kubelet.started, what="the pod running")
        finally:
            await core.stop()  # on_shutdown=leave: the pod keeps running
        _evicted_status(api, namespace, first)
        core = build_core(kube_config(tmp_path / "state", kubeconfig, namespace))
        await core.start()
        try:
            await _resumed(core, kubelet, api, namespace, job["id"], (f"gpupool-{job['id']}-2",))
            assert "failed" not in [s for s, _ in _states(core, job["id"])]
        finally:
            await core.stop()


def _stopped_status(api: Any, namespace: str, name: str, code: int) -> None:
    """What the kubelet writes when a deleted pod's container has ended (the pod is then removed; not here)."""
    api.patch_namespaced_pod_status(name, namespace, {"status": {
        "phase": "Failed", "containerStatuses": [{
            "name": "job", "ready": False, "restartCount": 0, "image": "busybox:1.36", "imageID": "",
            "state": {"terminated": {"exitCode": code, "reason": "Error", "startedAt": now_text(),
                                     "finishedAt": now_text()}}}]}})


async def test_gpupools_own_cancel_and_pause_stand_across_a_restart(api: Any, namespace: str, gpu_nodes: Any,
                                                                    kubeconfig: Path, tmp_path: Path) -> None:
    """Its stop intents are in its store: a pod it deleted and that ended while it was away is not 'someone else's'."""
    gpu_nodes(1, gpus=8)
    core = await _core(tmp_path, kubeconfig, namespace, reply_wait_s=0.2)  # (no kubelet: nothing settles in a reply)
    try:
        cancel, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 1, "command": ["python", "train.py"]})
        pause, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 1, "command": ["python", "train.py"]})
        pods = {j["id"]: f"gpupool-{j['id']}-1" for j in (cancel, pause)}
        with Kubelet(api, namespace) as kubelet:
            await wait_for(lambda: set(pods.values()) <= set(kubelet.started), what="both pods running")
        # No kubelet now: the deletions gpupool asks for stay pending while it stops.
        await core.cancel(ADMIN, cancel["id"])
        await core.pause(ADMIN, pause["id"])
        await wait_for(lambda: all(api.read_namespaced_pod(p, namespace).metadata.deletion_timestamp
                                   for p in pods.values()), what="both pods being deleted")
    finally:
        await core.stop()  # on_shutdown=leave
    for p in pods.values():  # their containers end (SIGTERM) while the scheduler is away
        _stopped_status(api, namespace, p, 143)
    core = build_core(kube_config(tmp_path / "state", kubeconfig, namespace))
    await core.start()
    try:
        done = await wait_for(lambda: (j := core.get_job(ADMIN, cancel["id"]))["state"] != "running" and j,
                              what="the cancel settled")
        assert (done["state"], done["exit_code"]) == ("cancelled", 143), done
        paused = await wait_for(lambda: (j := core.get_job(ADMIN, pause["id"]))["state"] != "running" and j,
                                what="the pause settled")
        assert (paused["state"], paused["exit_code"], paused["attempts"]) == ("paused", 143, 1), paused
        await wait_for(lambda: not api.list_namespaced_pod(namespace).items, what="the ended pods deleted")
        assert core.get_job(ADMIN, pause["id"])["state"] == "paused"  # a user's pause: not resumed by itself
        assert not any("someone else" in why for j in (cancel, pause) for _s, why in _states(core, j["id"]))
    finally:
        await core.stop()


async def test_a_gang_replica_deleted_by_someone_else_requeues_the_whole_gang(
        api: Any, namespace: str, gpu_nodes: Any, kubeconfig: Path, tmp_path: Path) -> None:
    gpu_nodes(2, gpus=8)
    core = await _core(tmp_path, kubeconfig, namespace, nodes=2)
    try:
        job, _ = await core.submit(ADMIN, GANG)
        jid = job["id"]
        r0, r1 = f"gpupool-{jid}-1-r0", f"gpupool-{jid}-1-r1"
        with Kubelet(api, namespace) as kubelet:
            await wait_for(lambda: r0 in kubelet.started and r1 in kubelet.started, what="both replicas running")
            api.delete_namespaced_pod(r1, namespace)
            await _resumed(core, kubelet, api, namespace, jid, (f"gpupool-{jid}-2-r0", f"gpupool-{jid}-2-r1"))
            assert {r0, r1} <= set(kubelet.stopped)  # replica 0 was stopped too: a gang never runs partly
            states = _states(core, jid)
            assert [s for s, _ in states] == ["queued", "running", "paused", "running"], states
            assert states[2][1].startswith(f"replica 1's pod {r1} was deleted by someone else"), states
    finally:
        await core.stop()


async def test_a_gang_replicas_own_failure_before_gpupool_stopped_the_others_still_fails_it_after_a_restart(
        api: Any, namespace: str, gpu_nodes: Any, kubeconfig: Path, tmp_path: Path) -> None:
    """Replica 0 failed, gpupool deleted replica 1 (its own stop, not stored) and was killed: not a disruption."""
    gpu_nodes(2, gpus=8)
    core = await _core(tmp_path, kubeconfig, namespace, nodes=2)
    try:
        job, _ = await core.submit(ADMIN, GANG)
        jid = job["id"]
        r0, r1 = f"gpupool-{jid}-1-r0", f"gpupool-{jid}-1-r1"
        with Kubelet(api, namespace) as kubelet:
            await wait_for(lambda: r0 in kubelet.started and r1 in kubelet.started, what="both replicas running")
    finally:
        await core.stop()  # on_shutdown=leave
    failed_at = (dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=2)).strftime("%Y-%m-%dT%H:%M:%SZ")
    api.patch_namespaced_pod_status(r0, namespace, {"status": {"phase": "Failed", "containerStatuses": [{
        "name": "job", "ready": False, "restartCount": 0, "image": "busybox:1.36", "imageID": "",
        "state": {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": failed_at,
                                 "finishedAt": failed_at}}}]}})
    api.delete_namespaced_pod(r1, namespace)  # what gpupool did on seeing replica 0 fail
    _stopped_status(api, namespace, r1, 143)
    core = build_core(kube_config(tmp_path / "state", kubeconfig, namespace))
    await core.start()
    try:
        done = await wait_for(lambda: (j := core.get_job(ADMIN, jid))["state"] != "running" and j,
                              what="the gang settled")
        assert (done["state"], done["exit_code"], done["attempts"]) == ("failed", 1, 1), done
    finally:
        await core.stop()


async def test_a_kubectl_pod_evicted_by_its_kubelet_ends_its_job_cancelled_not_failed(
        api: Any, namespace: str, gpu_nodes: Any, make_core: Any) -> None:
    """An adopted pod is its user's: gpupool cannot recreate it, so its job ends; an eviction is no failure of it."""
    nodes = gpu_nodes(1, gpus=8)
    core = await make_core()
    await wait_for(lambda: core.pool()["nodes"], what="the node in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 8})
    with Kubelet(api, namespace) as kubelet:
        kubectl_pod(api, namespace, "mine", gpus=2)
        await wait_for(lambda: "mine" in kubelet.started, what="the kubectl pod running")
        (job,) = jobs_of(core, namespace, "mine")
        _evicted_status(api, namespace, "mine", image="registry.example/train:1")
        done = await wait_for(lambda: (j := core.get_job(ADMIN, job["id"]))["state"] != "running" and j,
                              what="its job settled")
    assert done["state"] == "cancelled", done
    assert done["reason"] == (f"its pod {namespace}/mine was evicted by the kubelet of node {nodes[0]} (The node "
                              "was low on resource: memory.); gpupool does not recreate it")


async def test_a_kubectl_pod_its_user_deletes_holds_its_gpus_until_it_has_ended(
        api: Any, namespace: str, gpu_nodes: Any, make_core: Any) -> None:
    """Deleting your own pod is your cancel; but it runs on through its grace period, on its GPUs."""
    gpu_nodes(1, gpus=8)
    core = await make_core()
    await wait_for(lambda: core.pool()["nodes"], what="the node in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 8})
    with Kubelet(api, namespace) as kubelet:
        kubectl_pod(api, namespace, "mine", gpus=8)
        await wait_for(lambda: "mine" in kubelet.started, what="the kubectl pod running")
    (job,) = jobs_of(core, namespace, "mine")
    api.delete_namespaced_pod("mine", namespace)  # its grace: 30 s, and no kubelet to end it sooner
    await wait_for(lambda: api.read_namespaced_pod("mine", namespace).metadata.deletion_timestamp,
                   what="the pod terminating")
    await asyncio.sleep(1.0)
    held = core.get_job(ADMIN, job["id"])
    assert held["state"] == "running" and len(held["assignment"]["gpus"]) == 8, held  # still its GPUs
    api.patch_namespaced_pod_status("mine", namespace, {"status": {"phase": "Failed", "containerStatuses": [{
        "name": "main", "ready": False, "restartCount": 0, "image": "registry.example/train:1", "imageID": "",
        "state": {"terminated": {"exitCode": 143, "reason": "Error", "startedAt": now_text(),
                                 "finishedAt": now_text()}}}]}})
    done = await wait_for(lambda: (j := core.get_job(ADMIN, job["id"]))["state"] != "running" and j,
                          what="its job settled")
    assert done["state"] == "cancelled" and "was deleted, not by gpupool" in done["reason"], done


# ---------------------------------------------------------------- the pure reading of a pod
def _pod(**status: Any) -> dict[str, Any]:
    return {"metadata": {"name": "p"}, "spec": {"nodeName": "n1"}, "status": status}


def _ended(code: int, at: dt.datetime) -> list[dict[str, Any]]:
    return [{"name": "job", "state": {"terminated": {"exitCode": code, "finishedAt": at.isoformat()}}}]


def test_only_an_end_before_the_disruption_is_the_containers_own() -> None:
    t = dt.datetime(2026, 11, 28, 9, 0, 0, tzinfo=dt.timezone.utc)
    target = {"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
              "lastTransitionTime": t.isoformat()}
    # Finished a second before the pod was marked: its own result (the pod GC may mark an ended pod).
    own = pod_end(_pod(phase="Succeeded", conditions=[target], containerStatuses=_ended(0, t - dt.timedelta(seconds=1))))
    assert own is not None and own.on_its_own and own.disruption == ""
    # Finished as it was marked: the disruption's doing.
    stopped = pod_end(_pod(phase="Succeeded", conditions=[target], containerStatuses=_ended(0, t)))
    assert stopped is not None and not stopped.on_its_own
    assert stopped.disruption.startswith("was evicted through the Eviction API")
    # A condition no longer True is no disruption; an Evicted pod never ended on its own.
    assert disruption(_pod(conditions=[{**target, "status": "False"}])) is None
    evicted = pod_end(_pod(phase="Failed", reason="Evicted", containerStatuses=_ended(137, t)))
    assert evicted is not None and not evicted.on_its_own and evicted.disruption == "was evicted by the kubelet of node n1"
