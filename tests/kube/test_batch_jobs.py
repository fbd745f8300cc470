"""batch/v1 Jobs labelled with a project, admitted by gpupool as one gang: on the real API server and Job controller.

The Job controller of kube-controller-manager makes and deletes the pods; the
kubelet is the stand-in of tests/kube/cluster.py (bound pods run, end when
told, and answer a graceful deletion).
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from gpupool.app.backend import build_core
from gpupool.backends.kubernetes.batch_adoption import read_job, read_jobset
from gpupool.cli.tables import jobs_table
from gpupool.service.actor import Actor
from tests.kube.cluster import Kubelet
from tests.kube.conftest import kube_config, start_components
from tests.service.helpers import wait_for

ADMIN = Actor("admin", True)


def batch_api(kubeconfig: Path) -> client.BatchV1Api:
    return client.BatchV1Api(config.new_client_from_config(config_file=str(kubeconfig)))


@pytest.fixture
def batch(kubeconfig: Path) -> client.BatchV1Api:
    """batch/v1 on the test API server, as a team's kubectl uses it."""
    return batch_api(kubeconfig)


def job_body(name: str, *, project: str = "vision", parallelism: int = 2, gpus: int = 1, suspend: bool = True,
             scheduler: str | None = "gpupool") -> dict[str, Any]:
    """What ``kubectl apply`` of a team's Job for gpupool creates (the resume signal read through the downward API)."""
    pod_spec: dict[str, Any] = {"restartPolicy": "Never", "containers": [{
        "name": "job", "image": "registry.example/train:1", "command": ["python", "train.py"],
        "resources": {"limits": {"nvidia.com/gpu": str(gpus)}},
        "env": [{"name": "GPUPOOL_RESUME",
                 "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['gpupool.io/resume']"}}}]}]}
    if scheduler:
        pod_spec["schedulerName"] = scheduler
    return {"apiVersion": "batch/v1", "kind": "Job",
            "metadata": {"name": name, "labels": {"gpupool.io/project": project}},
            "spec": {"suspend": suspend, "parallelism": parallelism, "completions": parallelism,
                     "backoffLimit": 0, "template": {"spec": pod_spec}}}


def job_pods(api: Any, ns: str, name: str) -> list[Any]:
    return [p for p in api.list_namespaced_pod(ns, label_selector=f"batch.kubernetes.io/job-name={name}").items
            if p.metadata.deletion_timestamp is None]


def jobs_of(core: Any, ns: str, name: str) -> list[dict[str, Any]]:
    return [j for j in core.list_jobs(ADMIN) if j["labels"].get("gpupool.io/batch-job") == f"{ns}/{name}"]


def job_events(api: Any, ns: str, name: str, kind: str = "Job") -> list[Any]:
    return [e for e in api.list_namespaced_event(ns).items
            if e.involved_object.kind == kind and e.involved_object.name == name]


def test_a_job_is_read_as_one_gang_of_parallelism_replicas() -> None:
    body = job_body("train", parallelism=3, gpus=2)
    body["metadata"].update(namespace="team", uid="u1")
    spec, user, problem = read_job(body, "gpupool")
    assert problem == "" and user == "kubectl:team"
    assert (spec["project"], spec["kind"], spec["name"], spec["gpus"], spec["replicas"]) == (
        "vision", "train", "team/train", 2, 3)
    body["spec"]["completions"] = 1  # never more pods at once than completions
    assert "replicas" not in read_job(body, "gpupool")[0]
    _, _, problem = read_job(job_body("x", scheduler=None) | {"metadata": {"name": "x", "namespace": "t"}}, "gpupool")
    assert "schedulerName: gpupool" in problem
    _, _, problem = read_job(job_body("x", gpus=0) | {"metadata": {"name": "x", "namespace": "t"}}, "gpupool")
    assert "no nvidia.com/gpu" in problem


async def test_a_suspended_job_that_fits_is_admitted_bound_and_succeeds(
        api: Any, namespace: str, batch: Any, core_on_nodes: Any) -> None:
    core, nodes = await core_on_nodes(2, projects={"vision": {"train_guarantee": 8}})
    with Kubelet(api, namespace) as kubelet:
        body = job_body("train", parallelism=2, gpus=4)
        body["spec"]["template"]["spec"]["schedulingGates"] = [{"name": "gpupool.io/admission"}]  # removed, then bound
        batch.create_namespaced_job(namespace, body)
        (job,) = await wait_for(lambda: [j for j in jobs_of(core, namespace, "train") if j["state"] == "running"],
                                what="the Job's gpupool job running")
        assert (job["project"], job["kind"], job["name"]) == ("vision", "train", f"{namespace}/train")
        assert job["request"]["replicas"] == 2 and job["request"]["gpus"] == 4
        (row,) = [line for line in jobs_table(core.list_jobs(ADMIN)).splitlines() if job["id"] in line]
        assert f"{namespace}/train" in row and "running" in row
        await wait_for(lambda: batch.read_namespaced_job("train", namespace).spec.suspend is False,
                       what="the Job unsuspended")
        pods = await wait_for(lambda: len(p := job_pods(api, namespace, "train")) == 2 and all(
            x.spec.node_name for x in p) and p, what="both pods bound")
        placed = sorted(r["node"] for r in job["assignment"]["replicas"])
        assert sorted(p.spec.node_name for p in pods) == placed and set(placed) <= set(nodes)
        for p in pods:
            assert p.metadata.annotations["gpupool.io/resume"] == "0"  # a first attempt
            assert not p.spec.scheduling_gates
        assert not [j for j in core.list_jobs(ADMIN) if j["labels"].get("gpupool.io/pod")]  # not kubectl pods
        await wait_for(lambda: all(p.metadata.name in kubelet.started for p in pods), what="both pods running")
        # a node agent's per-pod GPU report names pods by UID: the Job's pods are the job's
        assert {p.metadata.uid: job["id"] for p in pods}.items() <= core.backend.pod_jobs().items()
        for replica in (None, 0, 1):  # its output is its pods' own (kubectl logs): gpupool answers, with nothing
            assert core.read_log(ADMIN, job["id"], replica=replica)["data"] == ""
        for p in pods:
            kubelet.finish(p.metadata.name, 0)
        done = await wait_for(lambda: (j := core.get_job(ADMIN, job["id"]))["state"] != "running" and j,
                              what="the job settled")
        assert done["state"] == "succeeded" and done["exit_code"] == 0, done
    assert [e for e in job_events(api, namespace, "train") if e.reason == "GpupoolAdmitted"]


async def test_a_job_over_its_quota_stays_suspended_and_queued_until_room_frees(
        api: Any, namespace: str, batch: Any, core_on_nodes: Any) -> None:
    core, _ = await core_on_nodes(projects={"vision": {"train_guarantee": 0, "train_limit": 4}})
    with Kubelet(api, namespace):
        first, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 3, "command": ["python", "a.py"]})
        await wait_for(lambda: core.get_job(ADMIN, first["id"])["state"] == "running", what="the first job running")
        batch.create_namespaced_job(namespace, job_body("wide", parallelism=2, gpus=1))
        (job,) = await wait_for(lambda: [j for j in jobs_of(core, namespace, "wide") if "limit" in j["reason"]
                                         and j["state"] == "queued"], what="the Job queued, and why")
        assert "at its training limit" in job["reason"] and "2 × 1 GPU" in job["reason"], job["reason"]
        await asyncio.sleep(0.5)
        assert batch.read_namespaced_job("wide", namespace).spec.suspend is True
        assert not job_pods(api, namespace, "wide")
        await core.cancel(ADMIN, first["id"])
        await wait_for(lambda: core.get_job(ADMIN, job["id"])["state"] == "running", what="the Job admitted")
        await wait_for(lambda: len(p := job_pods(api, namespace, "wide")) == 2 and all(x.spec.node_name for x in p),
                       what="its pods bound")


async def test_a_reclaimed_job_is_suspended_then_resumed_with_the_resume_signal(
        api: Any, namespace: str, batch: Any, core_on_nodes: Any) -> None:
    core, _ = await core_on_nodes(projects={"scrappy": {"train_guarantee": 0}, "owner": {"train_guarantee": 8}})
    with Kubelet(api, namespace) as kubelet:
        batch.create_namespaced_job(namespace, job_body("borrow", project="scrappy", parallelism=2, gpus=4))
        first = await wait_for(lambda: len(p := job_pods(api, namespace, "borrow")) == 2 and all(
            x.metadata.name in kubelet.started for x in p) and p, what="the borrowing Job running")
        (victim,) = jobs_of(core, namespace, "borrow")
        claim, _ = await core.submit(ADMIN, {"project": "owner", "gpus": 4, "command": ["python", "train.py"]})
        await wait_for(lambda: all(p.metadata.name in kubelet.stopped for p in first), what="its pods stopped")
        await wait_for(lambda: core.get_job(ADMIN, victim["id"])["state"] == "paused", what="the Job's job paused")
        (told,) = [e for e in job_events(api, namespace, "borrow") if e.reason == "GpupoolStopped"]
        assert "project owner" in told.message and told.message.endswith("the Job is suspended"), told.message
        assert batch.read_namespaced_job("borrow", namespace).spec.suspend is True
        await wait_for(lambda: not job_pods(api, namespace, "borrow"), what="its pods deleted")
        await wait_for(lambda: core.get_job(ADMIN, claim["id"])["state"] == "running", what="the owner's job running")
        await core.cancel(ADMIN, claim["id"])  # the owner is done: the Job resumes
        second = await wait_for(lambda: len(p := job_pods(api, namespace, "borrow")) == 2 and all(
            x.spec.node_name for x in p) and p, what="the Job resumed, its new pods bound")
        assert not {p.metadata.name for p in second} & {p.metadata.name for p in first}
        for p in second:
            assert p.metadata.annotations["gpupool.io/resume"] == "1"  # GPUPOOL_RESUME=1 in the container
        resumed = core.get_job(ADMIN, victim["id"])
        assert resumed["state"] == "running" and resumed["attempts"] == 2


async def test_cancel_deletes_the_job_and_a_job_created_running_is_suspended(
        api: Any, namespace: str, batch: Any, core_on_nodes: Any) -> None:
    core, _ = await core_on_nodes(projects={"vision": {"train_guarantee": 8}})
    with Kubelet(api, namespace):
        batch.create_namespaced_job(namespace, job_body("eager", suspend=False, parallelism=1, gpus=2))
        await wait_for(lambda: [e for e in job_events(api, namespace, "eager") if e.reason == "GpupoolSuspended"],
                       what="the Job told it was suspended")
        (job,) = await wait_for(lambda: [j for j in jobs_of(core, namespace, "eager") if j["state"] == "running"],
                                what="the Job admitted")
        assert not [j for j in core.list_jobs(ADMIN) if j["labels"].get("gpupool.io/pod")]  # its pods: not kubectl's
        await wait_for(lambda: (p := job_pods(api, namespace, "eager")) and all(x.spec.node_name for x in p),
                       what="its pod bound")
        await core.cancel(ADMIN, job["id"])
        assert core.get_job(ADMIN, job["id"])["state"] == "cancelled"
        await wait_for(lambda: "eager" not in {j.metadata.name for j in batch.list_namespaced_job(namespace).items},
                       what="the Job deleted")
        await wait_for(lambda: not api.list_namespaced_pod(namespace).items, what="its pods deleted")


async def test_a_restart_finds_the_admitted_job_again_and_runs_nothing_twice(
        api: Any, namespace: str, gpu_nodes: Any, kubeconfig: Path, batch: Any, tmp_path: Path) -> None:
    gpu_nodes(1, gpus=8)
    cfg = kube_config(tmp_path / "state", kubeconfig, namespace)
    core = build_core(cfg)
    await core.start()
    try:
        await wait_for(lambda: core.pool()["nodes"], what="the node in the pool")
        core.set_project(ADMIN, "vision", {"train_guarantee": 8})
        with Kubelet(api, namespace) as kubelet:
            batch.create_namespaced_job(namespace, job_body("long", parallelism=2, gpus=2))
            batch.create_namespaced_job(namespace, job_body("short", parallelism=1, gpus=2))
            batch.create_namespaced_job(namespace, job_body("doomed", parallelism=1, gpus=2))
            pods = await wait_for(lambda: len(p := job_pods(api, namespace, "long")) == 2 and all(
                x.metadata.name in kubelet.started for x in p) and p, what="the Job running")
            (short_pod,) = await wait_for(lambda: [p for p in job_pods(api, namespace, "short")
                                                   if p.metadata.name in kubelet.started], what="the short Job running")
            (job,) = jobs_of(core, namespace, "long")
            (short,) = jobs_of(core, namespace, "short")
            (doomed,) = await wait_for(lambda: [j for j in jobs_of(core, namespace, "doomed")
                                                if j["state"] == "running"], what="the third Job running")
            await core.stop()
            batch.delete_namespaced_job("doomed", namespace, propagation_policy="Background")  # while away
            kubelet.finish(short_pod.metadata.name, 0)  # it ends while gpupool is away
            await wait_for(lambda: batch.read_namespaced_job("short", namespace).status.succeeded == 1,
                           what="the short Job complete")
            core = build_core(cfg)
            await core.start()
            await wait_for(lambda: core.get_job(ADMIN, job["id"])["state"] == "running", what="found again")
            ended = await wait_for(lambda: (j := core.get_job(ADMIN, short["id"]))["state"] != "running" and j,
                                   what="the Job that ended meanwhile settled")
            assert ended["state"] == "succeeded" and ended["attempts"] == 1, ended
            gone = await wait_for(lambda: (j := core.get_job(ADMIN, doomed["id"]))["state"] == "cancelled" and j,
                                  what="the Job deleted meanwhile: its job cancelled")
            assert gone["reason"] == f"its Job {namespace}/doomed was deleted outside gpupool" and \
                gone["attempts"] == 1, gone
            await asyncio.sleep(1.0)
            assert len(jobs_of(core, namespace, "long")) == 1
            again = job_pods(api, namespace, "long")
            assert {p.metadata.uid for p in again} == {p.metadata.uid for p in pods}  # the same pods run on
            assert core.get_job(ADMIN, job["id"])["attempts"] == 1
            for p in pods:
                kubelet.finish(p.metadata.name, 0)
            done = await wait_for(lambda: (j := core.get_job(ADMIN, job["id"]))["state"] != "running" and j,
                                  what="the job settled")
            assert done["state"] == "succeeded"
    finally:
        await core.stop()


JOBSET = ("jobset.x-k8s.io", "v1alpha2")


def jobset_body(name: str, *, project: str = "vision", workers: int = 2, gpus: int = 4) -> dict[str, Any]:
    """A suspended JobSet: a leader Job of one pod and ``workers`` worker Jobs of one pod, ``gpus`` each."""
    def replicated(rj: str, replicas: int) -> dict[str, Any]:
        return {"name": rj, "replicas": replicas, "template": {"spec": {
            "parallelism": 1, "completions": 1, "backoffLimit": 0,
            "template": job_body("x", gpus=gpus)["spec"]["template"]}}}

    return {"apiVersion": "jobset.x-k8s.io/v1alpha2", "kind": "JobSet",
            "metadata": {"name": name, "labels": {"gpupool.io/project": project}},
            "spec": {"suspend": True, "replicatedJobs": [replicated("leader", 1), replicated("worker", workers)]}}


def jobset_pods(api: Any, ns: str, name: str) -> list[Any]:
    return [p for p in api.list_namespaced_pod(ns, label_selector=f"jobset.sigs.k8s.io/jobset-name={name}").items
            if p.metadata.deletion_timestamp is None]


async def test_a_jobset_is_one_gang_suspended_on_reclaim_resumed_and_succeeds(
        api: Any, namespace: str, kubeconfig: Path, core_on_nodes: Any) -> None:
    start_components(kubeconfig, "jobset")  # the JobSet CRD, controller and webhooks (before the core starts)
    custom = client.CustomObjectsApi(config.new_client_from_config(config_file=str(kubeconfig)))
    core, _ = await core_on_nodes(2, projects={"scrappy": {"train_guarantee": 0}, "owner": {"train_guarantee": 16}})
    with Kubelet(api, namespace) as kubelet:
        custom.create_namespaced_custom_object(*JOBSET, namespace, "jobsets", jobset_body("ring", project="scrappy"))
        (job,) = await wait_for(lambda: [j for j in core.list_jobs(ADMIN)
                                         if j["labels"].get("gpupool.io/jobset") == f"{namespace}/ring"
                                         and j["state"] == "running"], what="the JobSet admitted")
        assert (job["name"], job["request"]["replicas"], job["request"]["gpus"]) == (f"{namespace}/ring", 3, 4)
        first = await wait_for(lambda: len(p := jobset_pods(api, namespace, "ring")) == 3 and all(
            x.metadata.name in kubelet.started for x in p) and p, what="its 3 pods bound and running")
        placed = sorted(r["node"] for r in job["assignment"]["replicas"])
        assert sorted(p.spec.node_name for p in first) == placed
        assert all(p.metadata.annotations["gpupool.io/resume"] == "0" for p in first)
        assert not [j for j in core.list_jobs(ADMIN) if j["labels"].get("gpupool.io/pod")
                    or j["labels"].get("gpupool.io/batch-job")]  # its Jobs and pods are not queued on their own

        claim, _ = await core.submit(ADMIN, {"project": "owner", "gpus": 8, "command": ["python", "train.py"]})
        await wait_for(lambda: core.get_job(ADMIN, job["id"])["state"] == "paused", what="the JobSet reclaimed")
        assert custom.get_namespaced_custom_object(*JOBSET, namespace, "jobsets", "ring")["spec"]["suspend"] is True
        await wait_for(lambda: not jobset_pods(api, namespace, "ring"), what="its pods deleted")
        assert all(p.metadata.name in kubelet.stopped for p in first)  # each got the checkpoint signal
        await wait_for(lambda: core.get_job(ADMIN, claim["id"])["state"] == "running", what="the owner running")
        await core.cancel(ADMIN, claim["id"])

        second = await wait_for(lambda: len(p := jobset_pods(api, namespace, "ring")) == 3 and all(
            x.metadata.name in kubelet.started for x in p) and p, what="the JobSet resumed")
        assert all(p.metadata.annotations["gpupool.io/resume"] == "1" for p in second)  # GPUPOOL_RESUME=1
        for p in second:
            kubelet.finish(p.metadata.name, 0)
        done = await wait_for(lambda: (j := core.get_job(ADMIN, job["id"]))["state"] not in ("running", "paused")
                              and j, 60, what="the JobSet's job settled")
        assert done["state"] == "succeeded" and done["attempts"] == 2, done


async def test_a_job_whose_pod_fails_fails_its_job(api: Any, namespace: str, batch: Any,
                                                   core_on_nodes: Any) -> None:
    core, _ = await core_on_nodes(projects={"vision": {"train_guarantee": 8}})
    with Kubelet(api, namespace) as kubelet:
        batch.create_namespaced_job(namespace, job_body("flaky", parallelism=1, gpus=1))  # backoffLimit 0
        (pod,) = await wait_for(lambda: [p for p in job_pods(api, namespace, "flaky")
                                         if p.metadata.name in kubelet.started], what="its pod running")
        (job,) = jobs_of(core, namespace, "flaky")
        kubelet.finish(pod.metadata.name, 2)
        done = await wait_for(lambda: (j := core.get_job(ADMIN, job["id"]))["state"] != "running" and j,
                              what="the job settled")
        assert done["state"] == "failed" and done["exit_code"] == 2, done  # Failed, with its pod's exit code
        assert done["reason"] == "exited with code 2", done


async def test_the_deploy_rbac_is_enough_to_admit_suspend_and_cancel_a_job(
        api: Any, gpu_nodes: Any, batch: Any, make_account_core: Any) -> None:
    """As the ServiceAccount of deploy/kubernetes/rbac.yaml (its own namespace): watch Jobs (and JobSets, where
    an earlier test of this file started their controller), unsuspend, suspend and delete one; nothing fails."""
    gpu_nodes(1, gpus=8)
    name = f"sa-{uuid.uuid4().hex[:6]}"
    core = await make_account_core()
    await wait_for(lambda: core.pool()["nodes"], what="nodes listed with the service account")
    core.set_project(ADMIN, "vision", {"train_guarantee": 8})
    with Kubelet(api, "gpupool") as kubelet:
        batch.create_namespaced_job("gpupool", job_body(name, parallelism=1, gpus=2))
        (pod,) = await wait_for(lambda: [p for p in job_pods(api, "gpupool", name)
                                         if p.metadata.name in kubelet.started], what="admitted and bound as the SA")
        (job,) = jobs_of(core, "gpupool", name)
        await core.pause(ADMIN, job["id"])
        await wait_for(lambda: core.get_job(ADMIN, job["id"])["state"] == "paused", what="paused: suspended")
        assert batch.read_namespaced_job(name, "gpupool").spec.suspend is True
        assert pod.metadata.name in kubelet.stopped
        await core.cancel(ADMIN, job["id"])
        await wait_for(lambda: name not in {j.metadata.name for j in batch.list_namespaced_job("gpupool").items},
                       what="the Job deleted as the SA")
    assert core.status(ADMIN)["backend"]["ok"] is True, core.status(ADMIN)["backend"]


def test_a_jobset_is_read_as_one_gang_of_every_replicated_jobs_pods() -> None:
    body = jobset_body("ring", workers=3, gpus=2)
    body["metadata"].update(namespace="team", uid="u2")
    spec, user, problem = read_jobset(body, "gpupool")
    assert problem == "" and user == "kubectl:team"
    assert (spec["name"], spec["gpus"], spec["replicas"], spec["labels"]["gpupool.io/jobset"]) == (
        "team/ring", 2, 4, "team/ring")  # 1 leader + 3 workers, one pod each
    body["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]["resources"] = {}
    _, _, problem = read_jobset(body, "gpupool")
    assert "the same number of whole nvidia.com/gpu" in problem and "[0, 2]" in problem


async def test_a_jobset_over_its_limit_is_told_why_and_a_queued_one_cancelled_is_deleted(
        api: Any, namespace: str, kubeconfig: Path, core_on_nodes: Any) -> None:
    start_components(kubeconfig, "jobset")
    custom = client.CustomObjectsApi(config.new_client_from_config(config_file=str(kubeconfig)))
    core, _ = await core_on_nodes(projects={"vision": {"train_guarantee": 0, "train_limit": 8}})

    def jobset_jobs(name: str) -> list[dict[str, Any]]:
        return [j for j in core.list_jobs(ADMIN) if j["labels"].get("gpupool.io/jobset") == f"{namespace}/{name}"]

    custom.create_namespaced_custom_object(*JOBSET, namespace, "jobsets", jobset_body("huge", workers=2, gpus=4))
    (huge,) = await wait_for(lambda: [j for j in jobset_jobs("huge") if j["state"] == "rejected"],
                             what="3 x 4 GPUs rejected under a limit of 8")
    (told,) = await wait_for(lambda: [e for e in job_events(api, namespace, "huge", "JobSet")
                                      if e.reason == "GpupoolRejected"], what="the JobSet told why")
    assert huge["id"] in told.message and told.type == "Warning"

    first, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 4, "command": ["python", "a.py"]})
    await wait_for(lambda: core.get_job(ADMIN, first["id"])["state"] == "running", what="the first job running")
    custom.create_namespaced_custom_object(*JOBSET, namespace, "jobsets", jobset_body("pair", workers=1, gpus=4))
    (pair,) = await wait_for(lambda: [j for j in jobset_jobs("pair") if "limit" in j["reason"]],
                             what="the JobSet queued at the limit")
    assert pair["state"] == "queued"
    await core.cancel(ADMIN, pair["id"])
    await wait_for(lambda: "pair" not in {o["metadata"]["name"] for o in custom.list_namespaced_custom_object(
        *JOBSET, namespace, "jobsets")["items"]}, what="the JobSet deleted")


async def test_a_running_job_deleted_outside_gpupool_ends_its_job_cancelled(
        api: Any, namespace: str, batch: Any, core_on_nodes: Any) -> None:
    core, _ = await core_on_nodes(projects={"vision": {"train_guarantee": 8}})
    with Kubelet(api, namespace) as kubelet:
        batch.create_namespaced_job(namespace, job_body("gone", parallelism=1, gpus=2))
        await wait_for(lambda: [p for p in job_pods(api, namespace, "gone") if p.metadata.name in kubelet.started],
                       what="its pod running")
        (job,) = jobs_of(core, namespace, "gone")
        batch.delete_namespaced_job("gone", namespace, propagation_policy="Background")
        done = await wait_for(lambda: (j := core.get_job(ADMIN, job["id"]))["state"] not in ("running", "paused",
                                                                                           "queued") and j,
                              what="its job ended")
        assert done["state"] == "cancelled", done
        assert done["reason"] == f"its Job {namespace}/gone was deleted outside gpupool", done
        await asyncio.sleep(0.5)
        assert core.get_job(ADMIN, job["id"])["attempts"] == 1  # never started again
