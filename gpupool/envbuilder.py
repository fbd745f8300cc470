"""The one place that turns a GPU share into environment variables.

The local executor uses it for training jobs and the Jupyter kernel
provisioner for kernels, so a kernel and a job holding the same share see the
same limits. The variables are the contract in docs/design.md ("GPU
environment"): CUDA_VISIBLE_DEVICES, GPUPOOL_*, framework memory caps (JAX,
TensorFlow, PyTorch through a sitecustomize hook) and, when an MPS daemon
runs, the MPS limits that the driver itself enforces.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from gpupool.policy.model import MILLI

TORCH_HOOK_DIR = str(Path(__file__).resolve().parent / "_torch_hook")
"""Directory holding the ``sitecustomize`` that caps PyTorch's memory fraction."""

_DEFAULT_MPS_PIPE = "/tmp/nvidia-mps"


def _fraction_text(fraction: float) -> str:
    """``0.25`` -> ``"0.25"``, ``1.0`` -> ``"1"``: short, exact enough for every consumer."""
    text = f"{fraction:.4f}".rstrip("0").rstrip(".")
    return text or "0"


def mps_running(environ: dict[str, str] | None = None) -> bool:
    """Whether an NVIDIA MPS control daemon is running for this user.

    Looks for the daemon's control pipe (``$CUDA_MPS_PIPE_DIRECTORY`` or the
    default ``/tmp/nvidia-mps``) and for a ``nvidia-cuda-mps-control``
    process; either one is taken as "MPS is on".
    """
    env = os.environ if environ is None else environ
    pipe_dir = env.get("CUDA_MPS_PIPE_DIRECTORY") or _DEFAULT_MPS_PIPE
    if os.path.exists(os.path.join(pipe_dir, "control")):
        return True
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return False
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().strip().startswith("nvidia-cuda-mps"):
                    return True
        except OSError:
            continue
    return False


def gpu_environment(
    job_id: str,
    project: str,
    gpus: Sequence[tuple[str, int, int]],
    attempt: int,
    resume: bool,
    simulated: bool,
    mps: bool | None = None,
    pythonpath: str | None = None,
) -> dict[str, str]:
    """The environment a process holding ``gpus`` must run with.

    ``gpus`` is a list of ``(uuid, milli, memory_limit_bytes)``: the GPU's id,
    the milli-GPU held on it (1000 = whole) and the bytes of its memory the
    holder may use (the assignment's ``memory_limit``). An empty list means
    CPU-only work: ``CUDA_VISIBLE_DEVICES`` is empty and no framework cap is set.

    ``mps``: ``None`` detects a running MPS daemon; ``True``/``False`` force it.
    ``pythonpath``: the PYTHONPATH to keep after the torch hook directory
    (default: this process's ``PYTHONPATH``).
    """
    fraction = min((m for _, m, _ in gpus), default=0) / MILLI
    memory_limit = min((b for _, _, b in gpus), default=0)
    env = {
        "CUDA_VISIBLE_DEVICES": ",".join(uid for uid, _, _ in gpus),
        "GPUPOOL_JOB_ID": job_id,
        "GPUPOOL_PROJECT": project,
        "GPUPOOL_ATTEMPT": str(int(attempt)),
        "GPUPOOL_RESUME": "1" if resume else "0",
        "GPUPOOL_GPU_FRACTION": _fraction_text(fraction),
        "GPUPOOL_GPU_MEMORY_LIMIT": str(int(memory_limit)),
        "GPUPOOL_SIMULATED": "1" if simulated else "0",
    }
    if not gpus:
        return env
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = _fraction_text(fraction)
    env["TF_FORCE_GPU_ALLOW_GROWTH"] = "true"
    # The async allocator returns freed memory to the driver, so a TF process
    # does not keep more of a shared GPU than it is using.
    env["TF_GPU_ALLOCATOR"] = "cuda_malloc_async"
    rest = os.environ.get("PYTHONPATH", "") if pythonpath is None else pythonpath
    parts = [TORCH_HOOK_DIR] + [p for p in rest.split(os.pathsep) if p and p != TORCH_HOOK_DIR]
    env["PYTHONPATH"] = os.pathsep.join(parts)
    if mps is None:
        mps = mps_running()
    if mps and fraction < 1:
        mib = memory_limit // (1024 * 1024)
        env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(f"{i}={mib}M" for i in range(len(gpus)))
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, round(fraction * 100)))
    return env
