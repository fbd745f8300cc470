"""How a kubectl pod is told which GPU share it holds (pure: builds the objects).

Two carriers of the same variables (``NVIDIA_VISIBLE_DEVICES``,
``GPUPOOL_GPU_FRACTION``, ``GPUPOOL_JOB_ID``, ...):

- **the binding's annotations**, ``env.gpupool.io/<VARIABLE>``: the API
  server copies a Binding's annotations onto the pod in the same write that
  sets ``spec.nodeName``, so they cost no extra write and are there before any
  kubelet sees the pod; a container reads one with the downward API
  (``valueFrom.fieldRef.fieldPath: metadata.annotations['env.gpupool.io/...']``,
  resolved when the container starts). Every binding carries them.
- **the ConfigMap** ``gpupool-<pod name>``, written before the binding only
  for a pod whose container names it in ``envFrom`` (not optional: the kubelet
  cannot start the container before it exists). The pod owns it
  (``ownerReferences``), so the cluster's garbage collector removes it with
  the pod. One more write per pod: kept for pods written that way.
"""

from __future__ import annotations

import re
from typing import Any

from gpupool.backends.kubernetes.foreign import ENV_ANNOTATION_PREFIX, PodRef, config_map_name
from gpupool.backends.kubernetes.names import MANAGED_BY, MANAGED_BY_LABEL

_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?")  # an annotation key's name part


def binding_annotations(env: dict[str, str]) -> dict[str, str]:
    """``env`` as the annotations of the pod's Binding, one ``env.gpupool.io/<VARIABLE>`` each.

    A variable whose name cannot be an annotation's is left out (the API
    server would refuse the whole binding); gpupool's own variables all can.
    """
    return {f"{ENV_ANNOTATION_PREFIX}{k}": v for k, v in sorted(env.items()) if _NAME.fullmatch(k)}


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
