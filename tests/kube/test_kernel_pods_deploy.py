"""deploy/ for GPU kernels as pods: the Hub's default profile, the labels that let a server reach its kernels
(and nobody else's), the deny-by-default NetworkPolicy, and the scheduler's RBAC being enough to make them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from gpupool.backends.base import Launch
from gpupool.backends.kubernetes.kernel_pods import KernelHome, kernel_network_policy, kernel_pod_manifest
from gpupool.backends.kubernetes.pods import PodSettings
from gpupool.service.actor import Actor
from tests.kube.scheduler_account import documents
from tests.kube.test_kubespawner import User, hub_config, hub_kubeconfig, server_pod  # noqa: F401 (autouse)
from tests.service.helpers import wait_for

ADMIN = Actor("admin", True)
REQUEST = {"argv": ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
           "connection": {"key": "k" * 64, "shell_port": 50001, "iopub_port": 50002, "stdin_port": 50003,
                          "control_port": 50004, "hb_port": 50005},
           "secret_env": {"GPUPOOL_TOKEN": "user-token"}, "uid": 1000, "gid": 100}


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


async def test_the_default_profile_is_a_cpu_server_that_only_its_own_kernel_pods_admit(
        api: Any, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    c, _ = hub_config(monkeypatch, namespace)
    profiles = c.KubeSpawner.profile_list
    default = [p for p in profiles if p.get("default")]
    assert [p["display_name"] for p in default] == ["CPU server + GPU kernels from the pool"]
    assert "kubespawner_override" not in default[0]  # the server itself asks for no GPU
    assert {p["slug"] for p in profiles} == {"cpu", "quarter-gpu", "one-gpu"}  # whole-server GPUs stay

    pods = {}
    for name in ("alice", "erin@example.com"):
        _, pod = await server_pod(c, User(name, ["vision"]), "cpu")
        pods[name] = pod
        api.create_namespaced_pod(namespace, api.api_client.sanitize_for_serialization(pod), dry_run="All")
        assert "nvidia.com/gpu" not in (pod.spec.containers[0].resources.limits or {})
    kernel = {"metadata": {"name": "gpupool-j-000001-1", "namespace": namespace, "uid": "u1",
                           "labels": {"gpupool.io/job": "j-000001"}}}
    for owner in pods:
        policy = kernel_network_policy(kernel, owner, REQUEST)
        admitted = policy["spec"]["ingress"][0]["from"][0]["podSelector"]["matchLabels"]
        assert [u for u, pod in pods.items() if matches(admitted, pod.metadata.labels)] == [owner]
        assert sorted(p["port"] for p in policy["spec"]["ingress"][0]["ports"]) == list(range(50001, 50006))
        created = client.NetworkingV1Api(api.api_client).create_namespaced_network_policy(
            namespace, {**policy, "metadata": {**policy["metadata"], "ownerReferences": []}}, dry_run="All")
        assert created.spec.pod_selector.match_labels == policy["spec"]["podSelector"]["matchLabels"]


def test_the_deny_by_default_policy_selects_every_kernel_pod_and_admits_nothing() -> None:
    (deny,) = documents("kernel-network-policy.yaml")
    launch = Launch("j-000007", 1, [], "", "alice", "vision", assignment={"node": "n1", "gpus": []})
    pod = kernel_pod_manifest(launch, "alice", REQUEST, PodSettings("gpupool", "python:3.12-slim"))
    assert deny["metadata"]["namespace"] == pod["metadata"]["namespace"] == "gpupool"
    assert matches(deny["spec"]["podSelector"]["matchLabels"], pod["metadata"]["labels"])
    assert deny["spec"]["policyTypes"] == ["Ingress"] and deny["spec"]["ingress"] == []
    spec = pod["spec"]
    assert spec["automountServiceAccountToken"] is False
    assert spec["securityContext"] == {"runAsUser": 1000, "runAsNonRoot": True, "runAsGroup": 100, "fsGroup": 100}
    text = str(pod)
    assert "k" * 64 not in text and "user-token" not in text  # the secrets are in the Secret only


async def test_the_deploy_rbac_is_enough_to_make_a_kernel_pod(api: Any, gpu_nodes: Any,
                                                              make_account_core: Any) -> None:
    """The scheduler as rbac.yaml's ServiceAccount makes a kernel's pod, its Secret and its NetworkPolicy."""
    gpu_nodes(1, gpus=4)
    core = await make_account_core()
    await wait_for(lambda: core.pool()["nodes"], what="nodes listed with the service account")
    core.set_project(ADMIN, "vision", {"build_quota": 1})
    share, _ = await core.submit(ADMIN, {"project": "vision", "kind": "build", "gpu_fraction": 0.25,
                                         "kernel_pod": REQUEST})
    assert share["state"] == "running", share
    name = await wait_for(lambda: (core.get_job(ADMIN, share["id"]).get("kernel_pod") or {}).get("name"),
                          what="the kernel pod")
    pod = await wait_for(lambda: next((p for p in api.list_namespaced_pod("gpupool").items
                                       if p.metadata.name == name and p.spec.node_name), None),
                         what="the kernel pod bound by the service account")
    secret = api.read_namespaced_secret(f"{name}-kernel", "gpupool")
    assert secret.metadata.owner_references[0].uid == pod.metadata.uid
    policy = client.NetworkingV1Api(api.api_client).read_namespaced_network_policy(f"{name}-kernel", "gpupool")
    assert policy.metadata.owner_references[0].uid == pod.metadata.uid
    await core.cancel(ADMIN, share["id"])
    await wait_for(lambda: all(p.metadata.deletion_timestamp is not None
                               for p in api.list_namespaced_pod("gpupool").items if p.metadata.name == name),
                   what="the kernel pod's deletion by the service account")


def test_the_users_home_claim_is_mounted_in_the_kernel_pod_when_the_admin_names_one(api: Any,
                                                                                    namespace: str) -> None:
    launch = Launch("j-000008", 1, [], "", "alice", "vision", assignment={"node": "n1", "gpus": []})
    settings = PodSettings(namespace, "python:3.12-slim")
    pod = kernel_pod_manifest(launch, "alice", {**REQUEST, "workdir": "/home/jovyan/work"}, settings,
                              KernelHome.of("home-{user}", "/home/jovyan"))
    spec, container = pod["spec"], pod["spec"]["containers"][0]
    assert {"name": "home", "persistentVolumeClaim": {"claimName": "home-alice"}} in spec["volumes"]
    assert {"name": "home", "mountPath": "/home/jovyan"} in container["volumeMounts"]
    assert container["workingDir"] == "/home/jovyan/work"
    made = api.create_namespaced_pod(namespace, pod, dry_run="All")  # the API server takes it as is
    assert made.spec.volumes[-1].persistent_volume_claim.claim_name == "home-alice"
    assert KernelHome.of(None, "/home/jovyan") is None
    plain = kernel_pod_manifest(launch, "alice", REQUEST, settings)
    assert [v["name"] for v in plain["spec"]["volumes"]] == ["kernel-connection"]


@pytest.mark.parametrize("claim, path, why", [
    ("claim-{username}", "/home/jovyan", "may hold {user} and nothing else"),
    ("Claim_{user}", "/home/jovyan", "must name a PersistentVolumeClaim"),
    ("home-{user}", "home", "must be an absolute path"),
])
def test_a_bad_home_claim_setting_is_refused_saying_why(tmp_path: Path, claim: str, path: str, why: str) -> None:
    from gpupool.service.config import ServiceConfig
    from gpupool.wire.errors import InvalidRequest

    with pytest.raises(InvalidRequest, match=why):
        ServiceConfig(state_dir=tmp_path, backend="kubernetes", kube_kernel_home_claim=claim,
                      kube_kernel_home_path=path)
    with pytest.raises(InvalidRequest, match="for the kubernetes backend"):
        ServiceConfig(state_dir=tmp_path, kube_kernel_home_claim="home-{user}")


def test_z2jh_values_let_a_server_reach_its_kernel_pods_and_the_scheduler() -> None:
    """Where z2jh's user-server policy applies (it allows no private address), values.yaml's extra egress
    rules select the kernel pods gpupool makes and the scheduler's pods on its port."""
    import yaml

    values = yaml.safe_load((Path(__file__).resolve().parents[2] / "deploy" / "jupyterhub" / "values.yaml")
                            .read_text())
    egress = values["singleuser"]["networkPolicy"]["egress"]
    launch = Launch("j-000009", 1, [], "", "alice", "vision", assignment={"node": "n1", "gpus": []})
    kernel = kernel_pod_manifest(launch, "alice", REQUEST, PodSettings("gpupool", "python:3.12-slim"))
    (scheduler,) = [d for d in yaml.safe_load_all(
        (Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "scheduler.yaml").read_text())
        if d and d["kind"] == "Deployment"]

    def admitted(labels: dict[str, str], namespace: str) -> list[dict[str, Any]]:
        return [rule for rule in egress for peer in rule["to"]
                if matches(peer["namespaceSelector"]["matchLabels"], {"kubernetes.io/metadata.name": namespace})
                and matches(peer["podSelector"]["matchLabels"], labels)]

    assert admitted(kernel["metadata"]["labels"], kernel["metadata"]["namespace"])
    (rule,) = admitted(scheduler["spec"]["template"]["metadata"]["labels"], scheduler["metadata"]["namespace"])
    assert rule["ports"] == [{"port": 8765, "protocol": "TCP"}]
    assert not admitted({"app.kubernetes.io/name": "something-else"}, "gpupool")
