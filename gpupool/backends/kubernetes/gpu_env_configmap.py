"""The ConfigMap that tells a kubectl pod which GPU share it holds (pure: builds the object).

gpupool writes ``gpupool-<pod name>`` before it binds the pod; the pod's
container reads it with ``envFrom: [{configMapRef: {name: gpupool-<pod name>}}]``.
The reference is not optional, so the kubelet cannot start the container
before the ConfigMap exists: the pod cannot run without knowing its GPUs.
The pod owns the ConfigMap (``ownerReferences``), so the cluster's garbage
collector removes it with the pod.
"""

from __future__ import annotations

from typing import Any

from gpupool.backends.kubernetes.foreign import PodRef, config_map_name
from gpupool.backends.kubernetes.names import MANAGED_BY, MANAGED_BY_LABEL


def gpu_config_map(pod: PodRef, env: dict[str, str]) -> dict[str, Any]:
    """The ConfigMap holding ``env`` (the GPU environment of the pod's share), owned by the pod."""
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": config_map_name(pod.name),
            "namespace": pod.namespace,
            "labels": {MANAGED_BY_LABEL: MANAGED_BY},
            "annotations": {"gpupool.io/pod": pod.text},
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": pod.name, "uid": pod.uid}],
        },
        "data": dict(sorted(env.items())),
    }
