"""The labels, annotations and names gpupool reads and writes on Kubernetes objects (docs/kubernetes.md)."""

from __future__ import annotations

GPU_RESOURCE = "nvidia.com/gpu"
"""Allocatable GPUs of a node (the NVIDIA device plugin's resource): a node is in the pool when it has some."""
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"  # GPU Feature Discovery, e.g. NVIDIA-A100-SXM4-80GB
GPU_MEMORY_LABEL = "nvidia.com/gpu.memory"  # GPU Feature Discovery: MiB per GPU
POOL_LABEL = "gpupool.io/pool"  # build | train | both (default both: a label value cannot hold a comma)
RACK_LABEL = "gpupool.io/rack"  # the node's rack or switch: a gang's replicas stay within one when they can
ZONE_LABEL = "topology.kubernetes.io/zone"  # the node group when no rack label is set
GPUS_ANNOTATION = "gpupool.io/gpus"  # JSON list written by `gpupool node-agent`: the node's exact GPUs

JOB_LABEL = "gpupool.io/job"
ATTEMPT_LABEL = "gpupool.io/attempt"
PROJECT_LABEL = "gpupool.io/project"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "gpupool"
MANAGED_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGED_BY}"

CONTAINER = "job"
"""The one container of a job pod: its status carries the attempt's exit code."""


def pod_name(job_id: str, attempt: int) -> str:
    """The pod of one attempt: deterministic, so a restarted service finds it and never makes a second one."""
    return f"gpupool-{job_id.lower()}-{attempt}"
