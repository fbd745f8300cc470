"""deploy/jupyterhub/kubespawner_config.py with the real KubeSpawner: the user server pods it makes, as
the API server takes them, and gpupool serve --backend kubernetes binding one with its GPU environment."""

from __future__ import annotations

import asyncio
import runpy
from pathlib import Path
from typing import Any

import kubespawner  # jupyterhub-kubespawner, in the test extra
import pytest
import yaml
from jupyterhub.utils import maybe_future
from traitlets.config import Config

from gpupool.service.hub_projects import HubProjectMap
from tests.kube.cluster import Kubelet, wait
from tests.kube.test_serve_cli import gpupool, serve

CONFIG = Path(__file__).resolve().parents[2] / "deploy" / "jupyterhub" / "kubespawner_config.py"


class Group:
    def __init__(self, name: str) -> None:
        self.name = name


class User:
    """What KubeSpawner reads of a Hub user (jupyterhub.user.User has these)."""

    def __init__(self, name: str, groups: list[str]) -> None:
        self.name = name
        self.id = abs(hash(name)) % 10_000
        self.url = f"/user/{name}/"
        self.groups = [Group(g) for g in groups]
        self.escaped_name = name


@pytest.fixture(autouse=True)
def hub_kubeconfig(kubeconfig: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """KubeSpawner connects as a Hub outside the cluster does: $KUBECONFIG (here the test API server's)."""
    import kubernetes_asyncio.config.kube_config as kube_config_module

    monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
    # kubernetes_asyncio reads $KUBECONFIG once, at its import (before this fixture): point it at the file.
    monkeypatch.setattr(kube_config_module, "KUBE_CONFIG_DEFAULT_LOCATION", str(kubeconfig))


def hub_config(monkeypatch: pytest.MonkeyPatch, namespace: str, **env: str) -> tuple[Config, dict[str, Any]]:
    """The fragment loaded as JupyterHub loads a config file: with ``c`` defined; its module globals."""
    monkeypatch.setenv("GPUPOOL_NAMESPACE", namespace)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    c = Config()
    module = runpy.run_path(str(CONFIG), init_globals={"c": c})
    return c, module


async def server_pod(c: Config, user: User, profile: str) -> Any:
    """The pod KubeSpawner would create for ``user`` choosing ``profile`` (hook, profile, then manifest)."""
    spawner = kubespawner.KubeSpawner(config=c, user=user, _mock=True)
    spawner.user_options = {"profile": profile}
    await maybe_future(spawner.run_pre_spawn_hook())  # as JupyterHub's User.spawn calls it
    await spawner.load_user_options()
    return spawner, await spawner.get_pod_manifest()


def env_of(pod: Any) -> dict[str, str]:
    return {e.name: e.value for e in pod.spec.containers[0].env or []}


async def test_a_quarter_gpu_server_is_a_gpupool_build_pod_of_the_users_first_group(
        api: Any, namespace: str, monkeypatch: pytest.MonkeyPatch) -> None:
    c, _ = hub_config(monkeypatch, namespace)
    spawner, pod = await server_pod(c, User("alice", ["vision", "nlp"]), "quarter-gpu")
    assert pod.spec.scheduler_name == "gpupool"
    assert pod.metadata.labels["gpupool.io/project"] == "vision"
    assert pod.metadata.labels["gpupool.io/user"] == "alice"
    assert pod.metadata.annotations["gpupool.io/kind"] == "build"
    assert pod.metadata.annotations["gpupool.io/gpu-fraction"] == "0.25"
    container = pod.spec.containers[0]
    assert container.env_from == [{"configMapRef": {"name": f"gpupool-{spawner.pod_name}"}}]
    env = env_of(pod)
    assert env["GPUPOOL_URL"] == f"http://gpupool-scheduler.{namespace}.svc:8765"
    assert "JUPYTERHUB_API_TOKEN" in env  # the user's server token: the scheduler checks it (gpupool serve --hub)
    assert "nvidia.com/gpu" not in ((container.resources.limits or {}) if container.resources else {})
    assert ("nvidia.com/gpu", "Exists", "NoSchedule") in [(t.key, t.operator, t.effect) for t in pod.spec.tolerations]

    # The API server takes it as is (server-side validation and defaulting, nothing stored).
    body = api.api_client.sanitize_for_serialization(pod)
    made = api.create_namespaced_pod(spawner.namespace, body, dry_run="All")
    assert spawner.namespace == namespace and made.spec.scheduler_name == "gpupool"
    assert made.spec.containers[0].env_from[0].config_map_ref.name == f"gpupool-{spawner.pod_name}"
    assert not api.list_namespaced_pod(namespace).items


async def test_the_profiles_cpu_and_one_gpu_and_a_user_in_no_group(api: Any, namespace: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    c, _ = hub_config(monkeypatch, namespace, GPUPOOL_URL="http://pool.example:8765")
    _, whole = await server_pod(c, User("bob", ["nlp"]), "one-gpu")
    assert whole.spec.containers[0].resources.limits["nvidia.com/gpu"] == "1"
    assert "gpupool.io/gpu-fraction" not in whole.metadata.annotations
    assert whole.metadata.labels["gpupool.io/project"] == "nlp"
    assert env_of(whole)["GPUPOOL_URL"] == "http://pool.example:8765"
    _, cpu = await server_pod(c, User("carol", []), "cpu")
    assert cpu.metadata.labels["gpupool.io/project"] == "carol"  # her personal project
    assert {k: v for k, v in cpu.metadata.annotations.items() if k.startswith("gpupool.io/")} == {
        "gpupool.io/kind": "build"}  # no GPU asked: CPU-only work, still placed by gpupool
    assert "nvidia.com/gpu" not in (cpu.spec.containers[0].resources.limits or {})
    for pod in (whole, cpu):
        api.create_namespaced_pod(namespace, api.api_client.sanitize_for_serialization(pod), dry_run="All")


def test_the_project_rule_is_gpupool_serves_own(monkeypatch: pytest.MonkeyPatch) -> None:
    _, module = hub_config(monkeypatch, "gpupool")
    rule = module["gpupool_project"]
    for prefix, user, groups in [("", "alice", ["vision", "nlp"]), ("", "dan", []),
                                 ("gpu-", "erin", ["staff", "gpu-nlp", "gpu-vision"]),
                                 ("gpu-", "frank", ["staff"]), ("", "gus", ["bad name!", "ok"])]:
        want = HubProjectMap(prefix, personal_fields={}).default_project(user, groups)
        assert rule(user, groups, prefix) == want, (prefix, user, groups)


async def test_an_existing_pre_spawn_hook_still_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GPUPOOL_NAMESPACE", "gpupool")
    c = Config()
    ran: list[str] = []
    c.KubeSpawner.pre_spawn_hook = lambda spawner: ran.append(spawner.user.name)
    runpy.run_path(str(CONFIG), init_globals={"c": c})
    spawner = kubespawner.KubeSpawner(config=c, user=User("alice", ["vision"]), _mock=True)
    await maybe_future(spawner.run_pre_spawn_hook())
    assert ran == ["alice"] and spawner.extra_labels["gpupool.io/project"] == "vision"


async def test_gpupool_binds_the_server_pod_and_writes_its_gpu_environment(
        api: Any, namespace: str, gpu_nodes: Any, kubeconfig: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """End to end: the manifest KubeSpawner makes, created in the API server, bound by gpupool serve."""
    (node,) = gpu_nodes(1, gpus=4)
    proc, url = serve(tmp_path, "--backend", "kubernetes", "--kubeconfig", str(kubeconfig), "--namespace", namespace)
    try:
        wait(lambda: gpupool(url, "status")["pool"]["nodes"], what="the node in the pool")
        gpupool(url, "projects", "set", "vision", "--build-quota", "1")
        c, _ = hub_config(monkeypatch, namespace)
        spawner, pod = await server_pod(c, User("alice", ["vision"]), "quarter-gpu")
        api.create_namespaced_pod(namespace, api.api_client.sanitize_for_serialization(pod))
        bound = wait(lambda: (p := api.read_namespaced_pod(spawner.pod_name, namespace)).spec.node_name and p,
                     what="the server pod bound by gpupool")
        assert bound.spec.node_name == node
        cm = api.read_namespaced_config_map(f"gpupool-{spawner.pod_name}", namespace)
        jobs = gpupool(url, "list")
        (job,) = [j for j in jobs if j["name"] == spawner.pod_name]
        assert (job["kind"], job["project"], job["user"], job["state"]) == ("build", "vision", "alice", "running")
        (share,) = job["assignment"]["gpus"]
        assert share["milli"] == 250
        assert cm.data["NVIDIA_VISIBLE_DEVICES"] == str(share["index"])
        assert cm.data["GPUPOOL_JOB_ID"] == job["id"]
        assert float(cm.data["GPUPOOL_GPU_FRACTION"]) == 0.25
        gpus = {g["id"]: g for n in gpupool(url, "status")["pool"]["nodes"] for g in n["gpus"]}
        held = gpus[share["id"]]["allocations"]  # the quarter shows as alice's in the pool
        assert [(a["job_id"], a["user"], a["kind"], a["fraction"]) for a in held] == [
            (job["id"], "alice", "build", 0.25)]
    finally:
        proc.terminate()
        proc.wait(30)


def test_the_hub_rbac_and_the_values_are_valid(api: Any) -> None:
    """hub-rbac.yaml: valid objects to the API server (dry run); values.yaml mounts the fragment for z2jh."""
    from kubernetes import utils

    from tests.kube.test_deploy import ensure_namespace

    ensure_namespace(api)
    docs = [d for d in yaml.safe_load_all((CONFIG.parent / "hub-rbac.yaml").read_text()) if d]
    for doc in docs:
        utils.create_from_dict(api.api_client, doc, dry_run="All")
    assert [d["kind"] for d in docs] == ["Role", "RoleBinding"]
    rules = {r: set(rule["verbs"]) for rule in docs[0]["rules"] for r in rule["resources"]}
    assert rules["pods"] == {"get", "watch", "list", "create", "delete"}  # what KubeSpawner does with them
    values = yaml.safe_load((CONFIG.parent / "values.yaml").read_text())
    assert values["hub"]["extraFiles"]["gpupool"]["mountPath"].startswith(
        "/usr/local/etc/jupyterhub/jupyterhub_config.d/")
    assert values["scheduling"]["userScheduler"]["enabled"] is False


async def test_kubespawner_starts_a_server_that_gpupool_places_and_stops_it(
        api: Any, namespace: str, gpu_nodes: Any, kubeconfig: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """KubeSpawner.start() itself: its pod waits for gpupool, which binds it; stop() deletes it, the job ends."""
    (node,) = gpu_nodes(1, gpus=4)
    proc, url = serve(tmp_path, "--backend", "kubernetes", "--kubeconfig", str(kubeconfig), "--namespace", namespace)
    try:
        wait(lambda: gpupool(url, "status")["pool"]["nodes"], what="the node in the pool")
        gpupool(url, "projects", "set", "nlp", "--build-quota", "2")
        c, _ = hub_config(monkeypatch, namespace)
        c.KubeSpawner.start_timeout = 60
        spawner = kubespawner.KubeSpawner(config=c, user=User("bob", ["nlp"]), _mock=True)
        spawner.user_options = {"profile": "one-gpu"}
        await maybe_future(spawner.run_pre_spawn_hook())
        with Kubelet(api, namespace) as kubelet:
            started = await asyncio.wait_for(spawner.start(), 90)
            assert "127.0.0.1" in str(started)  # the pod's IP, reported by its (stand-in) kubelet
            assert spawner.pod_name in kubelet.started
            pod = api.read_namespaced_pod(spawner.pod_name, namespace)
            assert pod.spec.node_name == node and pod.spec.scheduler_name == "gpupool"
            (job,) = [j for j in gpupool(url, "list") if j["name"] == spawner.pod_name]
            assert (job["kind"], job["project"], job["user"], job["state"]) == ("build", "nlp", "bob", "running")
            assert [g["milli"] for g in job["assignment"]["gpus"]] == [1000]
            cm = api.read_namespaced_config_map(f"gpupool-{spawner.pod_name}", namespace)
            assert cm.data["NVIDIA_VISIBLE_DEVICES"] == str(job["assignment"]["gpus"][0]["index"])
            await asyncio.wait_for(spawner.stop(), 60)
            done = wait(lambda: (j := gpupool(url, "describe", job["id"]))["state"] != "running" and j,
                        what="the job ended with its pod")
        assert done["state"] == "cancelled"
        assert not gpupool(url, "list", "--state", "running")  # the GPU is free again
    finally:
        proc.terminate()
        proc.wait(30)


async def test_the_hub_rbac_is_enough_for_what_kubespawner_does(api: Any, namespace: str, kubeconfig: Path,
                                                                tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """As the Hub's service account with only hub-rbac.yaml's rights: create, list, watch and delete a server."""
    from kubernetes import client, config, utils

    from tests.kube.test_node_agent import kubeconfig_as

    hub_ns = f"{namespace}-hub"
    api.create_namespace({"metadata": {"name": hub_ns}})
    api.create_namespaced_service_account(hub_ns, {"metadata": {"name": "hub"}})
    for doc in yaml.safe_load_all((CONFIG.parent / "hub-rbac.yaml").read_text()):
        doc["metadata"]["namespace"] = namespace  # gpupool's namespace here: the test's
        for s in doc.get("subjects", []):
            s["namespace"] = hub_ns
        utils.create_from_dict(api.api_client, doc)
    token = api.create_namespaced_service_account_token("hub", hub_ns, client.AuthenticationV1TokenRequest(
        spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600))).status.token
    as_hub = client.CoreV1Api(config.new_client_from_config(
        config_file=str(kubeconfig_as(kubeconfig, tmp_path, token=token))))

    def in_effect() -> bool:  # the API server's RBAC cache takes a moment to see new roles
        try:
            as_hub.list_namespaced_pod(namespace)
        except client.ApiException:
            return False
        return True

    wait(in_effect, what="the Hub's role in effect")
    c, _ = hub_config(monkeypatch, namespace)
    spawner, pod = await server_pod(c, User("alice", ["vision"]), "quarter-gpu")
    as_hub.create_namespaced_pod(namespace, api.api_client.sanitize_for_serialization(pod))
    listed = as_hub.list_namespaced_pod(namespace, label_selector="component=singleuser-server").items
    assert [p.metadata.name for p in listed] == [spawner.pod_name]
    as_hub.list_namespaced_event(namespace)
    as_hub.list_namespaced_pod(namespace, watch=True, timeout_seconds=1, _preload_content=False).release_conn()
    as_hub.delete_namespaced_pod(spawner.pod_name, namespace)
    with pytest.raises(client.ApiException) as refused:  # and no more: gpupool's ConfigMaps are not the Hub's
        as_hub.create_namespaced_config_map(namespace, {"metadata": {"name": f"gpupool-{spawner.pod_name}"}})
    assert refused.value.status == 403
