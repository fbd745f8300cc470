"""The scheduler's own account (deploy/kubernetes/rbac.yaml) in its namespace ``gpupool``, for tests that run as it.

Those tests share one namespace, the manifests' ``gpupool``, on the session's
cluster, so each must find it as the manifests leave it and leave it so:

- a core started there with ``on_shutdown: leave`` leaves its pods running,
  bound to nodes its test's ``gpu_nodes`` then deletes. The next test's
  stand-in kubelet, its core's stray sweep and its job numbers (a fresh state
  counts from ``j-000001`` again, the same pod names) would meet them;
- test_deploy dry-runs rbac.yaml, which an object already made answers 409.

:func:`scheduler_account` therefore empties the namespace of everything a
scheduler or a test makes there, before and after, and removes what rbac.yaml
made after.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client, config, utils

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
NAMESPACE = "gpupool"


def documents(name: str) -> list[dict[str, Any]]:
    """The objects of one manifest of deploy/kubernetes/."""
    return [d for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]


def ensure_namespace(api: client.CoreV1Api) -> None:
    """namespace.yaml's namespace, made if an earlier test has not made it."""
    if not any(n.metadata.name == NAMESPACE for n in api.list_namespace().items):
        utils.create_from_dict(api.api_client, documents("namespace.yaml")[0])


def remove_deploy_rbac(api: client.CoreV1Api) -> None:
    """Delete what rbac.yaml made, so that a dry run of it is not a 409."""
    rbac = client.RbacAuthorizationV1Api(api.api_client)
    deletes: dict[str, Any] = {"ServiceAccount": api.delete_namespaced_service_account,
                               "ClusterRole": rbac.delete_cluster_role,
                               "ClusterRoleBinding": rbac.delete_cluster_role_binding,
                               "Role": rbac.delete_namespaced_role, "RoleBinding": rbac.delete_namespaced_role_binding}
    for doc in documents("rbac.yaml"):
        meta = doc["metadata"]
        args = (meta["name"], meta["namespace"]) if "namespace" in meta else (meta["name"],)
        try:
            deletes[doc["kind"]](*args)
        except client.ApiException as e:
            if e.status != 404:
                raise


def empty_namespace(api: client.CoreV1Api, timeout: float = 60.0) -> None:
    """Delete from ``gpupool`` what schedulers and tests make there, and wait until no pod is left.

    Pods go without grace (no kubelet may be left to end them), a leader
    election's Lease goes with the rest; a Job's pods
    carry the Job controller's tracking finalizer, which it removes once
    their Job is deleted. The ``default`` ServiceAccount and the API
    server's ``kube-root-ca.crt`` stay.
    """
    batch = client.BatchV1Api(api.api_client)
    net = client.NetworkingV1Api(api.api_client)
    coord = client.CoordinationV1Api(api.api_client)
    ns = NAMESPACE
    for job in batch.list_namespaced_job(ns).items:
        batch.delete_namespaced_job(job.metadata.name, ns, propagation_policy="Background")
    for kind, listed, delete in (
            ("pods", api.list_namespaced_pod, api.delete_namespaced_pod),
            ("services", api.list_namespaced_service, api.delete_namespaced_service),
            ("configmaps", api.list_namespaced_config_map, api.delete_namespaced_config_map),
            ("secrets", api.list_namespaced_secret, api.delete_namespaced_secret),
            ("networkpolicies", net.list_namespaced_network_policy, net.delete_namespaced_network_policy),
            ("leases", coord.list_namespaced_lease, coord.delete_namespaced_lease),
            ("serviceaccounts", api.list_namespaced_service_account, api.delete_namespaced_service_account)):
        for item in listed(ns).items:
            if item.metadata.name in ("kube-root-ca.crt", "default"):
                continue
            try:
                delete(item.metadata.name, ns, grace_period_seconds=0) if kind == "pods" else \
                    delete(item.metadata.name, ns)
            except client.ApiException as e:
                if e.status != 404:
                    raise
    deadline = time.monotonic() + timeout
    while left := [p.metadata.name for p in api.list_namespaced_pod(ns).items]:
        if time.monotonic() > deadline:
            raise AssertionError(f"pods of namespace {ns} still there {timeout:.0f} s after their deletion: {left}")
        time.sleep(0.2)


@dataclass(frozen=True)
class SchedulerAccount:
    """rbac.yaml's ServiceAccount, its rights in effect: a kubeconfig of it and a client that uses it."""

    kubeconfig: Path
    api: client.CoreV1Api


def account_kubeconfig(api: client.CoreV1Api, kubeconfig: Path, out: Path) -> Path:
    """A copy of ``kubeconfig`` that authenticates with a token of the scheduler's ServiceAccount (an hour)."""
    token = api.create_namespaced_service_account_token(
        "gpupool-scheduler", NAMESPACE, client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=3600))).status.token
    sa = yaml.safe_load(kubeconfig.read_text())
    sa["users"] = [{"name": "sa", "user": {"token": token}}]
    sa["contexts"] = [{"name": "sa", "context": {"cluster": sa["contexts"][0]["context"]["cluster"], "user": "sa"}}]
    sa["current-context"] = "sa"
    out.write_text(yaml.safe_dump(sa))
    return out


def rights_in_effect(as_sa: client.CoreV1Api, timeout: float = 20.0) -> None:
    """Wait until the API server's RBAC cache grants the account one right of each of rbac.yaml's bindings.

    Nodes and every namespace's Jobs (the ClusterRoleBinding), Services of its
    namespace (the RoleBinding, which alone grants them).
    """
    batch = client.BatchV1Api(as_sa.api_client)
    deadline = time.monotonic() + timeout
    while True:
        try:
            as_sa.list_node(limit=1)
            batch.list_job_for_all_namespaces(limit=1)
            as_sa.list_namespaced_service(NAMESPACE, limit=1)
            return
        except client.ApiException as e:
            if e.status != 403 or time.monotonic() > deadline:
                raise
        time.sleep(0.05)


@contextmanager
def scheduler_account(api: client.CoreV1Api, kubeconfig: Path, tmp_path: Path) -> Iterator[SchedulerAccount]:
    """The namespace emptied, rbac.yaml applied and in effect; after: the namespace emptied, rbac.yaml's objects gone."""
    ensure_namespace(api)
    empty_namespace(api)
    remove_deploy_rbac(api)  # a test killed mid-way may have left them
    for doc in documents("rbac.yaml"):
        utils.create_from_dict(api.api_client, doc)
    try:
        sa_config = account_kubeconfig(api, kubeconfig, tmp_path / "sa.kubeconfig")
        as_sa = client.CoreV1Api(config.new_client_from_config(config_file=str(sa_config)))
        rights_in_effect(as_sa)
        yield SchedulerAccount(sa_config, as_sa)
    finally:
        empty_namespace(api)
        remove_deploy_rbac(api)
