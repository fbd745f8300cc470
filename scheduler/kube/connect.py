"""An API client for the cluster: from a kubeconfig file, else the in-cluster service account."""

from __future__ import annotations

import os

from kubernetes import client, config

from scheduler.errors import InvalidRequest


def api_client(kubeconfig: str | None) -> client.ApiClient:
    """The client for ``kubeconfig`` (a path), else the pod's service account, else $KUBECONFIG/~/.kube/config.

    A missing or unreadable kubeconfig is a clear configuration error at
    start (``gpupool serve`` prints it), not a crash later.
    """
    try:
        if kubeconfig:
            return config.new_client_from_config(config_file=os.path.expanduser(kubeconfig))
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            cfg = client.Configuration()
            config.load_incluster_config(client_configuration=cfg)
            return client.ApiClient(cfg)
        return config.new_client_from_config()
    except (config.ConfigException, OSError, TypeError, ValueError) as e:
        where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise InvalidRequest(f"cannot load the Kubernetes configuration ({where}): {e}") from e
