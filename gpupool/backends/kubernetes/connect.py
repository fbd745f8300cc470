"""An API client for the cluster: from a kubeconfig file, else the in-cluster service account."""

from __future__ import annotations

import os

from kubernetes import client, config

from gpupool.backends.kubernetes.calls import WORKERS
from gpupool.wire.errors import InvalidRequest

POOL_SIZE = WORKERS + 4
"""Connections kept open to the API server: one per call thread, plus the node and pod watches, the log
poller and a spare. The client's default (5 x the host's CPUs) is unrelated to the threads that use
it: below their number, every call over it opens a new TLS connection and drops it afterwards."""


def api_client(kubeconfig: str | None, pool_size: int = POOL_SIZE) -> client.ApiClient:
    """The client for ``kubeconfig`` (a path), else the pod's service account, else $KUBECONFIG/~/.kube/config.

    A missing or unreadable kubeconfig is a clear configuration error at
    start (``gpupool serve`` prints it), not a crash later.
    """
    cfg = type.__call__(client.Configuration)  # a fresh one, as new_client_from_config makes (not a default's copy)
    cfg.connection_pool_maxsize = max(pool_size, 1)  # read when the client's pool manager is made: set it first
    try:
        if kubeconfig:
            return config.new_client_from_config(config_file=os.path.expanduser(kubeconfig), client_configuration=cfg)
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=cfg)
            return client.ApiClient(cfg)
        return config.new_client_from_config(client_configuration=cfg)
    except (config.ConfigException, OSError, TypeError, ValueError) as e:
        where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise InvalidRequest(f"cannot load the Kubernetes configuration ({where}): {e}") from e
