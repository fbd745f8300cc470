"""A restarted scheduler finds its pods by label: none started twice, none lost, none left unaccounted."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from kubernetes import client, config

from gpupool.app.backend import build_core, kube_settings
from gpupool.backends.kubernetes.backend import KubeBackend
from gpupool.service.actor import Actor
from tests.kube.cluster import Kubelet, wait
from tests.kube.conftest import kube_config
from tests.service.helpers import wait_for

ADMIN = Actor("admin", True)


def pod_names(api: Any, ns: str) -> set[str]:
    return {p.metadata.name for p in api.list_namespaced_pod(ns).items}


async def test_restart_recovers_pods_by_label_with_no_duplicates(api: Any, namespace: str, gpu_nodes: Any,
                                                                 kubeconfig: Path, tmp_path: Path) -> None:
    gpu_nodes(2, gpus=8)
    cfg = kube_config(tmp_path / "state", kubeconfig, namespace)
    core = build_core(cfg)
    await core.start()
    core.set_project(ADMIN, "vision", {"train_guarantee": 16})
    ids = []
    for _ in range(4):
        j, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 4, "command": ["python", "train.py"]})
        ids.append(j["id"])
    with Kubelet(api, namespace) as kubelet:
        await wait_for(lambda: len(kubelet.started) == 4, what="4 pods running")
        await core.stop()  # gpupool serve's on_shutdown=leave: the pods keep running
        assert pod_names(api, namespace) == {f"gpupool-{j}-1" for j in ids}
        # While the scheduler is away: one job finishes, one pod is deleted from outside, one is orphaned.
        kubelet.finish(f"gpupool-{ids[0]}-1", 0)
        wait(lambda: api.read_namespaced_pod(f"gpupool-{ids[0]}-1", namespace).status.phase == "Succeeded",
             what="the finished pod")
        api.delete_namespaced_pod(f"gpupool-{ids[1]}-1", namespace, grace_period_seconds=0)
        orphan = f"gpupool-{ids[3].lower()}-7"
        api.create_namespaced_pod(namespace, {"metadata": {"name": orphan, "labels": {
            "app.kubernetes.io/managed-by": "gpupool", "gpupool.io/job": ids[3], "gpupool.io/attempt": "7"}},
            "spec": {"schedulerName": "gpupool", "containers": [{"name": "job", "image": "busybox"}]}})
        started_before = list(kubelet.started)

        core = build_core(cfg)
        await core.start()
        try:
            states = {j: core.get_job(ADMIN, j) for j in ids}
            assert states[ids[0]]["state"] == "succeeded" and states[ids[0]]["attempts"] == 1  # not rerun
            assert states[ids[2]]["state"] == "running" and states[ids[2]]["attempts"] == 1  # adopted
            assert states[ids[3]]["state"] == "running" and states[ids[3]]["attempts"] == 1
            # The vanished pod: requeued to resume from its checkpoint, not failed, not lost.
            resumed = await wait_for(lambda: (x := core.get_job(ADMIN, ids[1]))["attempts"] == 2 and x,
                                     what="the lost job resumed")
            assert resumed["state"] == "running"
            await wait_for(lambda: f"gpupool-{ids[1]}-2" in kubelet.started, what="its new pod running")
            await wait_for(lambda: orphan not in pod_names(api, namespace) and
                           f"gpupool-{ids[0]}-1" not in pod_names(api, namespace), what="the sweep")
            assert pod_names(api, namespace) == {f"gpupool-{ids[1]}-2", f"gpupool-{ids[2]}-1", f"gpupool-{ids[3]}-1"}
            # Nothing started twice: the only new pod is the lost job's second attempt.
            assert kubelet.started[len(started_before):] == [f"gpupool-{ids[1]}-2"]
            held = [g["id"] for j in ids for g in (core.get_job(ADMIN, j)["assignment"] or {}).get("gpus", [])]
            assert len(held) == len(set(held)) == 12  # no GPU given twice
            kubelet.finish(f"gpupool-{ids[2]}-1", 5)
            done = await wait_for(lambda: (x := core.get_job(ADMIN, ids[2]))["state"] == "failed" and x,
                                  what="the adopted job settled")
            assert done["exit_code"] == 5
        finally:
            await core.stop()


async def test_an_unreachable_api_server_is_reported_not_fatal(tmp_path: Path, namespace: str) -> None:
    bad = tmp_path / "kubeconfig"
    bad.write_text("""apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://127.0.0.1:9", insecure-skip-tls-verify: true}}]
users: [{name: u, user: {token: nope}}]
contexts: [{name: x, context: {cluster: c, user: u}}]
current-context: x
""")
    cfg = kube_config(tmp_path / "state", bad, namespace)
    core = build_core(cfg, backend=KubeBackend(kube_settings(cfg), initial_sync_s=0.5))
    await core.start()
    try:
        health = await wait_for(lambda: (h := core.status(ADMIN)["backend"]) and not h["ok"] and h,
                                what="the backend reported unhealthy")
        assert {e["source"] for e in health["errors"]} >= {"nodes", "pods"}
        assert core.pool()["nodes"] == []
        core.set_project(ADMIN, "vision", {})
        j, _ = await core.submit(ADMIN, {"project": "vision", "command": ["true"]})  # CPU-only: no GPU needed
        assert j["state"] == "queued"
    finally:
        await core.stop()


async def test_a_refused_bind_returns_the_job_to_the_queue(api: Any, namespace: str, gpu_nodes: Any,
                                                           kubeconfig: Path, tmp_path: Path) -> None:
    """The scheduler's account may create pods but not bind them: each try is undone, the job stays queued."""
    gpu_nodes(1, gpus=8)
    rbac = client.RbacAuthorizationV1Api(api.api_client)
    rbac.create_namespaced_role(namespace, {"metadata": {"name": "no-bind"}, "rules": [
        {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list", "watch", "delete"]},
        {"apiGroups": [""], "resources": ["pods/log"], "verbs": ["get"]}]})
    rbac.create_namespaced_role_binding(namespace, {"metadata": {"name": "no-bind"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "no-bind"},
        "subjects": [{"kind": "User", "name": "limited", "apiGroup": "rbac.authorization.k8s.io"}]})
    name = f"{namespace}-nodes"
    rbac.create_cluster_role({"metadata": {"name": name}, "rules": [
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]})
    rbac.create_cluster_role_binding({"metadata": {"name": name},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
        "subjects": [{"kind": "User", "name": "limited", "apiGroup": "rbac.authorization.k8s.io"}]})
    limited = tmp_path / "limited.kubeconfig"
    limited.write_text(kubeconfig.read_text().replace("current-context: admin", "current-context: limited"))
    as_limited = client.CoreV1Api(config.new_client_from_config(config_file=str(limited)))

    def rbac_in_effect() -> bool:  # the API server's RBAC cache takes a moment to see new roles
        try:
            as_limited.list_namespaced_pod(namespace)
            as_limited.list_node()
        except client.ApiException:
            return False
        return True

    wait(rbac_in_effect, what="the roles in effect")
    cfg = kube_config(tmp_path / "state", limited, namespace)
    core = build_core(cfg)
    await core.start()
    try:
        await wait_for(lambda: len(core.pool()["nodes"]) == 1, what="the node in the pool")
        core.set_project(ADMIN, "vision", {"train_guarantee": 8})
        j, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 1, "command": ["python", "train.py"]})
        def refusals() -> list[dict[str, Any]]:
            return [e for e in core.events_since(0) if e.get("job_id") == j["id"]
                    and "could not bind" in (e.get("reason") or "")]

        (back, *_) = await wait_for(refusals, what="the bind refused")
        assert back["state"] == "queued" and "403" in back["reason"]  # back in the queue, never ran
        # Each try reuses the pod name; the earlier pod's late deletion must not end the next try's.
        await asyncio.sleep(3.0)
        seen = [e for e in core.events_since(0) if e.get("job_id") == j["id"]]
        assert len(refusals()) >= 2
        assert {e["state"] for e in seen} <= {"queued", "running"}, seen
        assert core.get_job(ADMIN, j["id"])["attempts"] <= 1
    finally:
        await core.stop()
        rbac.delete_cluster_role_binding(name)
        rbac.delete_cluster_role(name)
    wait(lambda: not pod_names(api, namespace), what="no pod left: each unbound one deleted")
