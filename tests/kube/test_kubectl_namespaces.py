"""Pods users create with kubectl in their own team's namespace: queued when the admin names that namespace,
only in the projects it may use, and bound by gpupool with the least rights deploy/kubernetes grants there."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from gpupool.backends.kubernetes.pod_namespaces import PodNamespaces, parse_flag
from gpupool.service.actor import Actor
from gpupool.service.config import ServiceConfig
from gpupool.wire.errors import InvalidRequest
from tests.kube.cluster import Kubelet
from tests.kube.test_kubectl_pods import jobs_of, kubectl_pod, pod_events
from tests.service.helpers import wait_for

ADMIN = Actor("admin", True)


def new_namespace(api: Any, prefix: str) -> str:
    name = f"{prefix}-{uuid.uuid4().hex[:8]}"
    api.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return name


def test_the_namespace_rules_read_from_the_setting_and_the_flag() -> None:
    default = PodNamespaces.from_setting("gpupool", None)
    assert default.refusal("gpupool", "any") == ""
    assert not default.takes("team-a")
    rules = PodNamespaces.from_setting("gpupool", parse_flag("team-a=vision; ml=nlp,speech ;gpupool=*"))
    assert rules.describe() == {"gpupool": ["*"], "ml": ["nlp", "speech"], "team-a": ["vision"]}
    assert rules.refusal("team-a", "vision") == "" and rules.refusal("gpupool", "nlp") == ""
    assert rules.refusal("team-a", "nlp") == ("pods in namespace 'team-a' may use the project vision, not 'nlp' "
                                              "(kube_pod_namespaces)")
    assert "the projects nlp, speech, not 'vision'" in rules.refusal("ml", "vision")
    assert not rules.takes("elsewhere") and "ask the administrator" in rules.refusal("elsewhere", "vision")
    anywhere = PodNamespaces.from_setting("gpupool", {"*": ["shared"], "team-a": ["*"]})
    assert anywhere.takes("elsewhere") and anywhere.refusal("elsewhere", "shared") == ""
    assert anywhere.refusal("elsewhere", "vision") != "" and anywhere.refusal("team-a", "vision") == ""


@pytest.mark.parametrize("setting, words", [
    ({}, "must map namespaces"),
    (["team-a"], "must map namespaces"),
    ({"Team_A": ["vision"]}, "is not a namespace name"),
    ({"team-a": []}, "needs a non-empty list"),
    ({"team-a": "vision"}, "needs a non-empty list"),
    ({"team-a": ["vision", ""]}, "needs a non-empty list"),
])
def test_a_bad_setting_is_refused_with_what_is_wrong(tmp_path: Path, setting: Any, words: str) -> None:
    with pytest.raises(InvalidRequest, match=words):
        ServiceConfig(state_dir=tmp_path, backend="kubernetes", kube_pod_namespaces=setting)


def test_the_setting_needs_the_kubernetes_backend(tmp_path: Path) -> None:
    with pytest.raises(InvalidRequest, match="for the kubernetes backend"):
        ServiceConfig(state_dir=tmp_path, kube_pod_namespaces={"team-a": ["vision"]})


@pytest.mark.parametrize("flags, rc, words", [
    (["--backend", "kubernetes", "--pod-namespaces", "team-a"], 2, "is not NAMESPACE=PROJECT"),
    (["--backend", "kubernetes", "--pod-namespaces", "Team=vision"], 1, "is not a namespace name"),
    (["--pod-namespaces", "team-a=vision"], 2, "go with --backend kubernetes"),
])
def test_serve_refuses_a_bad_pod_namespaces_flag(tmp_path: Path, flags: list[str], rc: int, words: str) -> None:
    r = subprocess.run([sys.executable, "-m", "gpupool", "serve", *flags, "--state-dir", str(tmp_path / "s"),
                        "--port", "0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == rc, r.stderr
    assert words in r.stderr and "Traceback" not in r.stderr


async def test_a_team_namespace_s_pods_run_in_its_projects_only(api: Any, namespace: str, gpu_nodes: Any,
                                                                 make_core: Any) -> None:
    gpu_nodes(1, gpus=8)
    team, stranger = new_namespace(api, "team"), new_namespace(api, "other")
    core = await make_core(kube_pod_namespaces={namespace: ["*"], team: ["vision"]})
    await wait_for(lambda: core.pool()["nodes"], what="the node in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 4})
    core.set_project(ADMIN, "nlp", {"train_guarantee": 4})
    assert core.status(ADMIN)["backend"]["pod_namespaces"] == {namespace: ["*"], team: ["vision"]}
    kubectl_pod(api, team, "finetune", gpus=1)
    kubectl_pod(api, team, "borrow", gpus=1, project="nlp")  # a label anyone in the team could write
    kubectl_pod(api, stranger, "nobody-asked", gpus=1)
    kubectl_pod(api, namespace, "admins-own", gpus=1, project="nlp")  # gpupool's namespace: any project
    await wait_for(lambda: api.read_namespaced_pod("finetune", team).spec.node_name, what="the team's pod bound")
    (job,) = jobs_of(core, team, "finetune")
    assert (job["project"], job["user"], job["state"]) == ("vision", f"kubectl:{team}", "running")
    cm = api.read_namespaced_config_map("gpupool-finetune", team)  # its GPUs, in its own namespace
    assert cm.data["GPUPOOL_JOB_ID"] == job["id"] and cm.data["CUDA_VISIBLE_DEVICES"] == "0"
    await wait_for(lambda: api.read_namespaced_pod("admins-own", namespace).spec.node_name, what="the admin's pod")
    (refused,) = await wait_for(lambda: [e for e in pod_events(api, team, "borrow") if e.reason == "GpupoolNotQueued"],
                                what="the refusal on the pod")
    assert refused.type == "Warning"
    assert refused.message == (f"gpupool cannot queue this pod: pods in namespace '{team}' may use the project "
                               "vision, not 'nlp' (kube_pod_namespaces)")
    assert not jobs_of(core, team, "borrow") and not api.read_namespaced_pod("borrow", team).spec.node_name
    # a namespace the admin did not name is none of gpupool's business: no job, no bind, no event there
    assert not jobs_of(core, stranger, "nobody-asked")
    assert not api.read_namespaced_pod("nobody-asked", stranger).spec.node_name
    assert not pod_events(api, stranger, "nobody-asked")
    with Kubelet(api, team) as kubelet:  # the team's pod runs, then `gpupool cancel` deletes it there
        await wait_for(lambda: "finetune" in kubelet.started, what="the team's pod running")
        await core.cancel(ADMIN, job["id"])
        await wait_for(lambda: core.get_job(ADMIN, job["id"])["state"] == "cancelled", what="the job cancelled")
        await wait_for(lambda: "finetune" not in {p.metadata.name for p in api.list_namespaced_pod(team).items},
                       what="the pod deleted")


async def test_a_namespace_taken_out_of_the_setting_keeps_its_running_pod_s_job(api: Any, namespace: str,
                                                                              gpu_nodes: Any,
                                                                              make_core: Any) -> None:
    """Restarted without the team namespace: its running pod's job is followed to its end (its GPUs stay
    held, never given twice); only new pods there go unqueued."""
    gpu_nodes(1, gpus=8)
    team = new_namespace(api, "team")
    core = await make_core(kube_pod_namespaces={namespace: ["*"], team: ["vision"]})
    await wait_for(lambda: core.pool()["nodes"], what="the node in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 8})
    with Kubelet(api, team) as kubelet:
        kubectl_pod(api, team, "long", gpus=8)
        await wait_for(lambda: "long" in kubelet.started, what="the team's 8-GPU pod running")
        (job,) = jobs_of(core, team, "long")
        await core.stop()
        core = await make_core()  # the default again: gpupool's own namespace only
        await wait_for(lambda: core.pool()["nodes"], what="the node in the pool again")
        assert core.get_job(ADMIN, job["id"])["state"] == "running"
        kubectl_pod(api, team, "new-one", gpus=1)
        kubectl_pod(api, namespace, "own", gpus=1)
        (own,) = await wait_for(lambda: jobs_of(core, namespace, "own"), what="the own namespace's pod queued")
        assert own["state"] == "queued"  # the team's pod still holds the node's 8 GPUs
        assert not api.read_namespaced_pod("own", namespace).spec.node_name
        assert not jobs_of(core, team, "new-one")
        kubelet.finish("long", 0)
        done = await wait_for(lambda: (j := core.get_job(ADMIN, job["id"]))["state"] != "running" and j,
                              what="the team pod's job ended")
        assert (done["state"], done["exit_code"]) == ("succeeded", 0)
        await wait_for(lambda: api.read_namespaced_pod("own", namespace).spec.node_name, what="the freed GPUs used")
    assert not jobs_of(core, team, "new-one") and not pod_events(api, team, "new-one")


async def test_the_deploy_rbac_bound_in_a_team_namespace_is_enough(api: Any, gpu_nodes: Any, scheduler_account: Any,
                                                                    make_account_core: Any) -> None:
    """As the scheduler's ServiceAccount, with rbac.yaml's ClusterRole bound in the team namespace only."""
    from kubernetes import client

    from tests.kube.cluster import wait

    gpu_nodes(1, gpus=8)
    team = new_namespace(api, "team")
    as_sa = scheduler_account.api
    client.RbacAuthorizationV1Api(api.api_client).create_namespaced_role_binding(team, {
        "metadata": {"name": "gpupool-kubectl-pods"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "gpupool-kubectl-pods"},
        "subjects": [{"kind": "ServiceAccount", "name": "gpupool-scheduler", "namespace": "gpupool"}]})

    def rbac_in_effect() -> bool:
        try:
            as_sa.list_pod_for_all_namespaces(limit=1)
            as_sa.delete_namespaced_pod("none", team)  # (the role grants delete, not get: gpupool never reads one)
        except client.ApiException as e:
            return e.status == 404  # allowed, and there is no such pod
        return True

    wait(rbac_in_effect, what="the roles in effect")
    core = await make_account_core(kube_pod_namespaces={"gpupool": ["*"], team: ["vision"]})
    await wait_for(lambda: core.pool()["nodes"], what="nodes listed with the service account")
    core.set_project(ADMIN, "vision", {"train_guarantee": 4})
    kubectl_pod(api, team, "as-sa", annotations={"gpupool.io/gpu-fraction": "0.5"})
    await wait_for(lambda: api.read_namespaced_pod("as-sa", team).spec.node_name, what="bound as the SA")
    assert api.read_namespaced_config_map("gpupool-as-sa", team).data["GPUPOOL_GPU_FRACTION"] == "0.5"
    await wait_for(lambda: "Scheduled" in {e.reason for e in pod_events(api, team, "as-sa")},
                   what="the pod's event, recorded by the service account")
    (job,) = jobs_of(core, team, "as-sa")
    await core.cancel(ADMIN, job["id"])  # deleting the pod is granted there too
    await wait_for(lambda: all(p.metadata.deletion_timestamp for p in api.list_namespaced_pod(team).items),
                   what="the pod deleted by the service account")
    assert core.status(ADMIN)["backend"]["ok"] is True, core.status(ADMIN)["backend"]
