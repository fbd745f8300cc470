"""Multi-node gangs as pods on a real API server: a pod per replica on its own node, found by DNS name.

The kubelet is the stand-in of tests/kube/cluster.py: it runs bound pods,
ends them when told, and answers a graceful deletion with the checkpoint
signal's exit code.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gpupool.app.backend import build_core
from gpupool.backends.kubernetes.gang_pods import MASTER_PORT, gang_service_name
from gpupool.service.actor import Actor
from gpupool.service.core import SchedulerCore
from tests.kube.cluster import Kubelet, pod_env
from tests.kube.conftest import kube_config
from tests.service.helpers import wait_for

ADMIN = Actor("admin", True)
GANG = {"project": "vision", "gpus": 8, "replicas": 2, "command": ["torchrun", "train.py"]}


def pods(api: Any, ns: str) -> dict[str, Any]:
    return {p.metadata.name: p for p in api.list_namespaced_pod(ns).items}


def services(api: Any, ns: str) -> dict[str, Any]:
    return {s.metadata.name: s for s in api.list_namespaced_service(ns).items}


async def _core(tmp_path: Path, kubeconfig: Path, namespace: str) -> SchedulerCore:
    core = build_core(kube_config(tmp_path / "state", kubeconfig, namespace))
    await core.start()
    await wait_for(lambda: len(core.pool()["nodes"]) == 2, what="2 nodes in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 16})
    return core


async def test_a_gang_is_a_pod_per_replica_on_its_node_and_one_failure_fails_it(
        api: Any, namespace: str, gpu_nodes: Any, kubeconfig: Path, tmp_path: Path) -> None:
    nodes = gpu_nodes(2, gpus=8)
    core = await _core(tmp_path, kubeconfig, namespace)
    try:
        job, _ = await core.submit(ADMIN, GANG)
        jid = job["id"]
        r0, r1 = f"gpupool-{jid}-1-r0", f"gpupool-{jid}-1-r1"
        with Kubelet(api, namespace) as kubelet:
            await wait_for(lambda: r0 in kubelet.started and r1 in kubelet.started, what="both replicas running")
            got = pods(api, namespace)
            assert set(got) == {r0, r1}
            placed = {r["rank"]: r for r in core.get_job(ADMIN, jid)["assignment"]["replicas"]}
            assert {got[r0].spec.node_name, got[r1].spec.node_name} == set(nodes)
            svc = gang_service_name(jid)
            for rank, name in enumerate((r0, r1)):
                pod = got[name]
                assert pod.spec.node_name == placed[rank]["node"]  # bound to its own replica's node
                assert pod.metadata.labels["gpupool.io/replica"] == str(rank)
                assert pod.metadata.labels["gpupool.io/job"] == jid
                assert (pod.spec.hostname, pod.spec.subdomain) == (name, svc)
                env = pod_env(pod)
                assert (env["RANK"], env["NODE_RANK"], env["GPUPOOL_REPLICA"]) == (str(rank),) * 3
                assert (env["WORLD_SIZE"], env["GPUPOOL_REPLICAS"]) == ("2", "2")
                assert env["MASTER_ADDR"] == f"{r0}.{svc}.{namespace}.svc"
                assert env["MASTER_PORT"] == str(MASTER_PORT)
                assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(str(g["index"]) for g in placed[rank]["gpus"])
            service = services(api, namespace)[svc]
            assert service.spec.cluster_ip == "None"  # headless: the pods' own names, no proxy
            assert service.spec.selector == {"gpupool.io/job": jid, "app.kubernetes.io/managed-by": "gpupool"}
            assert service.spec.publish_not_ready_addresses

            kubelet.finish(r1, 3)  # replica 1 fails on its own
            done = await wait_for(lambda: (j := core.get_job(ADMIN, jid))["state"] != "running" and j,
                                  what="the gang to end")
            assert done["state"] == "failed" and done["exit_code"] == 3, done
            assert r0 in kubelet.stopped  # the other replica was stopped (deleted with the grace)
            await wait_for(lambda: not pods(api, namespace), what="both pods deleted")
            await wait_for(lambda: svc not in services(api, namespace), what="the Service deleted")
        for k, name in enumerate((r0, r1)):
            own = core.read_log(ADMIN, jid, replica=k)["data"]
            assert f"attempt 1 of {jid} (pod {name})" in own
            assert f"(pod {(r0, r1)[1 - k]})" not in own
        whole = core.read_log(ADMIN, jid)["data"]
        assert f"(pod {r0})" in whole and f"(pod {r1})" in whole
    finally:
        await core.stop()


async def test_pause_deletes_every_replica_resume_and_restart_keep_one_pod_each(
        api: Any, namespace: str, gpu_nodes: Any, kubeconfig: Path, tmp_path: Path) -> None:
    gpu_nodes(2, gpus=8)
    core = await _core(tmp_path, kubeconfig, namespace)
    try:
        job, _ = await core.submit(ADMIN, GANG)
        jid = job["id"]
        first = {f"gpupool-{jid}-1-r0", f"gpupool-{jid}-1-r1"}
        second = {f"gpupool-{jid}-2-r0", f"gpupool-{jid}-2-r1"}
        with Kubelet(api, namespace) as kubelet:
            await wait_for(lambda: first <= set(kubelet.started), what="both replicas running")
            await core.pause(ADMIN, jid)
            await wait_for(lambda: core.get_job(ADMIN, jid)["state"] == "paused", what="the pause")
            assert first <= set(kubelet.stopped)
            await wait_for(lambda: not pods(api, namespace), what="every replica deleted")
            await core.resume(ADMIN, jid)
            await wait_for(lambda: second <= set(kubelet.started), what="both replicas resumed")
            got = pods(api, namespace)
            assert set(got) == second
            for name in second:
                env = pod_env(got[name])
                assert env["GPUPOOL_RESUME"] == "1" and env["GPUPOOL_ATTEMPT"] == "2"
                assert env["MASTER_ADDR"].startswith(f"gpupool-{jid}-2-r0.")
            assert gang_service_name(jid) in services(api, namespace)

            await core.stop()  # on_shutdown=leave: the pods keep running while the scheduler is away
            started = list(kubelet.started)
            core = build_core(kube_config(tmp_path / "state", kubeconfig, namespace))
            await core.start()
            again = core.get_job(ADMIN, jid)
            assert again["state"] == "running" and again["attempts"] == 2  # adopted, not restarted
            for name in second:
                kubelet.finish(name, 0)
            done = await wait_for(lambda: (j := core.get_job(ADMIN, jid))["state"] != "running" and j,
                                  what="the gang to end")
            assert done["state"] == "succeeded" and done["exit_code"] == 0, done
            assert kubelet.started == started  # no replica was started twice
            await wait_for(lambda: not pods(api, namespace), what="the finished pods deleted")
            await wait_for(lambda: gang_service_name(jid) not in services(api, namespace), what="the Service gone")
    finally:
        await core.stop()


async def test_a_replica_deleted_while_the_scheduler_was_away_requeues_the_whole_gang(
        api: Any, namespace: str, gpu_nodes: Any, kubeconfig: Path, tmp_path: Path) -> None:
    gpu_nodes(2, gpus=8)
    core = await _core(tmp_path, kubeconfig, namespace)
    try:
        job, _ = await core.submit(ADMIN, GANG)
        jid = job["id"]
        r0, r1 = f"gpupool-{jid}-1-r0", f"gpupool-{jid}-1-r1"
        with Kubelet(api, namespace) as kubelet:
            await wait_for(lambda: r0 in kubelet.started and r1 in kubelet.started, what="both replicas running")
            await core.stop()  # on_shutdown=leave
            api.delete_namespaced_pod(r1, namespace, grace_period_seconds=0)  # replica 1 vanishes meanwhile
            await wait_for(lambda: r1 not in pods(api, namespace), what="replica 1 gone")
            core = build_core(kube_config(tmp_path / "state", kubeconfig, namespace))
            await core.start()
            # A gang never runs partly: replica 0 is stopped too, and the job resumes whole (not failed).
            second = {f"gpupool-{jid}-2-r0", f"gpupool-{jid}-2-r1"}
            await wait_for(lambda: second <= set(kubelet.started), what="the whole gang resumed")
            assert r0 in kubelet.stopped
            again = core.get_job(ADMIN, jid)
            assert again["state"] == "running" and again["attempts"] == 2
            assert set(pods(api, namespace)) == second
    finally:
        await core.stop()


async def test_one_replica_refused_takes_the_whole_gang_back_to_the_queue_uncounted(
        api: Any, namespace: str, gpu_nodes: Any, kubeconfig: Path, tmp_path: Path) -> None:
    """Replica 1's pod cannot be made (its name is taken): replica 0's pod goes too, the attempt is not counted."""
    gpu_nodes(2, gpus=8)
    core = await _core(tmp_path, kubeconfig, namespace)
    blocker = "gpupool-j-000001-1-r1"  # the first job's id in a fresh store
    api.create_namespaced_pod(namespace, {"metadata": {"name": blocker}, "spec": {
        "schedulerName": "nobody", "containers": [{"name": "c", "image": "busybox"}]}})
    try:
        job, _ = await core.submit(ADMIN, GANG)
        jid = job["id"]
        assert f"gpupool-{jid}-1-r1" == blocker

        def refusals() -> list[dict[str, Any]]:
            return [e for e in core.events_since(0) if e.get("job_id") == jid and e.get("state") == "queued"
                    and "replica 1" in (e.get("reason") or "")]

        with Kubelet(api, namespace) as kubelet:
            (back, *_) = await wait_for(refusals, what="the gang sent back to the queue")
            assert "requeued" in back["reason"]
            assert core.get_job(ADMIN, jid)["attempts"] <= 1  # never counted: each try is attempt 1 again
            r0 = f"gpupool-{jid}-1-r0"

            def r0_uid() -> str | None:
                p = pods(api, namespace).get(r0)
                return p.metadata.uid if p is not None else None

            first = await wait_for(r0_uid, what="replica 0's pod made")
            await wait_for(lambda: r0_uid() != first, what="replica 0's pod deleted (the gang never runs partly)")
            api.delete_namespaced_pod(blocker, namespace, grace_period_seconds=0)
            both = {f"gpupool-{jid}-1-r0", f"gpupool-{jid}-1-r1"}
            await wait_for(lambda: both <= set(kubelet.started) and
                           {p.metadata.name for p in api.list_namespaced_pod(namespace).items
                            if p.spec.node_name} == both, 60, what="the whole gang running once its name is free")
            got = core.get_job(ADMIN, jid)
            assert got["state"] == "running" and got["attempts"] == 1
            states = {e["state"] for e in core.events_since(0) if e.get("job_id") == jid and e.get("state")}
            assert states <= {"queued", "running"}, states  # never paused, failed or lost on the way
    finally:
        await core.stop()
