"""deploy/kubernetes/ holds valid objects (server-side dry run), and its RBAC is enough to run the scheduler."""

from __future__ import annotations

from typing import Any

import yaml
from kubernetes import utils

from gpupool.backends.kubernetes.gang_pods import gang_service_name
from gpupool.service.actor import Actor
from tests.kube.cluster import Kubelet
from tests.kube.scheduler_account import DEPLOY, documents, ensure_namespace, remove_deploy_rbac
from tests.service.helpers import wait_for

ADMIN = Actor("admin", True)


def test_every_manifest_is_a_valid_object_to_the_api_server(api: Any) -> None:
    assert sorted(p.name for p in DEPLOY.glob("*.yaml")) == ["kernel-network-policy.yaml", "namespace.yaml",
                                                             "node-agent-rbac.yaml", "node-agent.yaml", "rbac.yaml",
                                                             "scheduler.yaml"]
    ensure_namespace(api)  # namespaced objects are checked inside an existing namespace
    remove_deploy_rbac(api)  # a test killed mid-way may leave them: a dry run of them would be a 409
    kinds = []
    for name in ("rbac.yaml", "scheduler.yaml", "node-agent-rbac.yaml", "node-agent.yaml",
                 "kernel-network-policy.yaml"):
        for doc in documents(name):
            utils.create_from_dict(api.api_client, doc, dry_run="All")  # raises on an invalid object
            kinds.append(doc["kind"])
    assert kinds == ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding", "ClusterRole",
                     "PersistentVolumeClaim", "Deployment", "Service",
                     "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "DaemonSet", "NetworkPolicy"]
    bad = documents("scheduler.yaml")[1]
    bad["spec"]["template"]["spec"]["containers"][0]["name"] = "Not_A_Name"  # only the server refuses this
    try:
        utils.create_from_dict(api.api_client, bad, dry_run="All")
    except utils.FailToCreateError:
        pass
    else:
        raise AssertionError("the dry run accepted an invalid container name: it checks nothing")


async def test_the_deploy_rbac_is_enough_to_schedule(api: Any, gpu_nodes: Any, make_account_core: Any) -> None:
    """The scheduler runs as the ServiceAccount of rbac.yaml, with only those rights, and binds a job's pod."""
    gpu_nodes(1, gpus=8)
    core = await make_account_core()
    await wait_for(lambda: core.pool()["nodes"], what="nodes listed with the service account")
    core.set_project(ADMIN, "vision", {"train_guarantee": 1})
    j, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 1, "command": ["python", "t.py"]})
    with Kubelet(api, "gpupool") as kubelet:
        name = f"gpupool-{j['id']}-1"
        await wait_for(lambda: name in kubelet.started, what="the pod bound by the service account")
        kubelet.finish(name, 0)
        await wait_for(lambda: core.get_job(ADMIN, j["id"])["state"] == "succeeded", what="success")
        # a gang: one pod per replica and the headless Service through which they find rank 0
        g, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 1, "replicas": 2,
                                         "command": ["python", "t.py"]})
        await wait_for(lambda: sum(p.startswith(f"gpupool-{g['id']}-") for p in kubelet.started) == 2,
                       what="both replica pods bound by the service account")
        services = [s.metadata.name for s in api.list_namespaced_service("gpupool").items]
        assert gang_service_name(g["id"]) in services
    assert core.status(ADMIN)["backend"]["ok"] is True, core.status(ADMIN)["backend"]


_PATHS = {"PersistentVolumeClaim": "/api/v1/namespaces/{ns}/persistentvolumeclaims/{name}",
          "Service": "/api/v1/namespaces/{ns}/services/{name}",
          "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments/{name}",
          "DaemonSet": "/apis/apps/v1/namespaces/{ns}/daemonsets/{name}"}


def test_the_workloads_can_be_applied_server_side(api: Any) -> None:
    """`kubectl apply --server-side` (and GitOps tools that use it) takes every workload manifest as it is.

    Server-side apply merges lists by their keys; a Service port or a container port without
    ``protocol`` has no complete key there, and the API server refuses the whole object (issue 24, item 5).
    """
    ensure_namespace(api)
    for name in ("scheduler.yaml", "node-agent.yaml"):
        for doc in documents(name):
            path = _PATHS[doc["kind"]].format(ns=doc["metadata"]["namespace"], name=doc["metadata"]["name"])
            ac = api.api_client
            params = ac.param_serialize("PATCH", path, body=yaml.safe_dump(doc), auth_settings=["BearerToken"],
                                        header_params={"Content-Type": "application/apply-patch+yaml",
                                                       "Accept": "application/json"},
                                        query_params=[("fieldManager", "gpupool-test"), ("dryRun", "All")])
            reply = ac.call_api(*params)
            body = (reply.read() or b"").decode("utf-8", "replace")
            assert 200 <= reply.status < 300, f"{name}: {doc['kind']} refused by server-side apply: {body}"


# What the scheduler's code calls (gpupool/backends/kubernetes: lists and watches of nodes and of pods everywhere; in its
# namespace: pods created, listed, watched and deleted, bound, their logs read; ConfigMaps of kubectl pods; a
# gang's headless Service; events; the leader election's Lease). Nothing more: no `get` of a pod or a node, which it
# never reads one by one.
SCHEDULER_RIGHTS = {
    "gpupool-scheduler-nodes": {("", "nodes"): {"list", "watch"}, ("", "pods"): {"list", "watch"},
                                ("batch", "jobs"): {"list", "watch"}, ("jobset.x-k8s.io", "jobsets"): {"list", "watch"},
                                ("scheduling.k8s.io", "podgroups"): {"list", "watch"},
                                **{("resource.k8s.io", r): {"list", "watch"}
                                   for r in ("resourceslices", "deviceclasses", "resourceclaims",
                                             "resourceclaimtemplates")},
                                ("resource.k8s.io", "resourceclaims/binding"): {"update"},
                                ("authentication.k8s.io", "tokenreviews"): {"create"}},
    "gpupool-scheduler-pods": {("", "pods"): {"create", "list", "watch", "delete", "patch"},
                               ("", "pods/binding"): {"create"}, ("batch", "jobs"): {"patch", "delete"},
                               ("jobset.x-k8s.io", "jobsets"): {"patch", "delete"},
                               ("", "pods/log"): {"get"}, ("", "configmaps"): {"create", "delete"},
                               ("", "services"): {"create", "list", "delete"}, ("", "events"): {"create"},
                               ("", "secrets"): {"create", "delete"},
                               ("networking.k8s.io", "networkpolicies"): {"create", "delete"},
                               ("coordination.k8s.io", "leases"): {"create", "get", "update"},
                               ("resource.k8s.io", "resourceclaims"): {"get", "create", "delete"},
                               ("resource.k8s.io", "resourceclaims/status"): {"update"}},
    "gpupool-kubectl-pods": {("", "pods"): {"delete", "patch"}, ("", "pods/binding"): {"create"},
                             ("batch", "jobs"): {"patch", "delete"}, ("jobset.x-k8s.io", "jobsets"): {"patch", "delete"},
                             ("", "pods/log"): {"get"},
                             ("", "configmaps"): {"create", "delete"}, ("", "events"): {"create"},
                             ("resource.k8s.io", "resourceclaims"): {"get"},
                             ("resource.k8s.io", "resourceclaims/status"): {"update"}},
}


def test_the_scheduler_is_granted_exactly_what_it_uses_and_the_docs_say_so() -> None:
    """rbac.yaml grants the least (issue 24, item 5); docs/kubernetes.md lists the same rights.

    That the rights are enough is test_the_deploy_rbac_is_enough_to_schedule's (and the kubectl-pod
    tests', which run as this account).
    """
    granted: dict[str, dict[tuple[str, str], set[str]]] = {}
    named: dict[tuple[str, str], set[str]] = {}  # verbs granted only on named objects
    for doc in documents("rbac.yaml"):
        if doc["kind"] in ("Role", "ClusterRole"):
            rights = granted.setdefault(doc["metadata"]["name"], {})
            for rule in doc["rules"]:
                for group in rule["apiGroups"]:
                    for resource in rule["resources"]:
                        rights.setdefault((group, resource), set()).update(rule["verbs"])
                        if rule.get("resourceNames"):
                            named.setdefault((group, resource), set()).update(rule["verbs"])
    assert granted == SCHEDULER_RIGHTS
    # the leader election's Lease: read and renewed by its name only (create cannot be narrowed so)
    assert named == {("coordination.k8s.io", "leases"): {"get", "update"}}
    docs = " ".join((DEPLOY.parents[1] / "docs" / "kubernetes.md").read_text().split())
    least = docs[docs.index("What the scheduler's account needs"):]
    least = least[:least.index("## ")]
    for resource, verbs in (("`nodes`", "list, watch"), ("`pods` in every namespace", "list, watch"),
                            ("`jobs` in every namespace", "list, watch"), ("`jobs`", "patch, delete"),
                            ("`jobsets` in every namespace", "list, watch"), ("`jobsets`", "patch, delete"),
                            ("`podgroups` in every namespace", "list, watch"),
                            ("`pods`", "create, list, watch, delete, patch"), ("`pods/binding`", "create"),
                            ("`pods/log`", "get"), ("`configmaps`", "create, delete"),
                            ("`services`", "create, list, delete"), ("`events`", "create"),
                            ("`secrets`", "create, delete"), ("`networkpolicies`", "create, delete"),
                            ("`leases`", "get, create, update"), ("`tokenreviews`", "create"),
                            ("`resourceslices`", "list, watch"), ("`deviceclasses`", "list, watch"),
                            ("`resourceclaims` in every namespace", "list, watch"), ("`resourceclaims`", "get"),
                            ("`resourceclaimtemplates` in every namespace", "list, watch"),
                            ("`resourceclaims/status`", "update"), ("`resourceclaims/binding`", "update")):
        assert f"{resource}: {verbs}" in least, (resource, verbs, least)
