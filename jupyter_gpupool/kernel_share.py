"""A kernel's GPU share outside the provisioner: its words, its request, its environment.

What a share is called ("½ GPU", "kernel nb.ipynb"), what the scheduler is
asked for, what a refused kernel's dialog says, and the environment a kernel
on a share runs with. The provisioner (:mod:`jupyter_gpupool.provisioner`)
uses all of them; the kernelspecs, the server extension, the ``%gpupool``
magics and the widgets use the words and the request too, and the last two
run inside kernels, so these live in a module that imports neither
jupyter_client's provisioning nor tornado.
"""

from __future__ import annotations

import os
from typing import Any


def fraction_label(fraction: float) -> str:
    """Human words for a share: '¼ GPU', '½ GPU', '1 GPU', '2 GPUs', '0.3 GPU'."""
    symbols = {0.25: "¼", 0.5: "½", 0.75: "¾"}
    if fraction in symbols:
        return f"{symbols[fraction]} GPU"
    if fraction >= 1 and float(fraction).is_integer():
        n = int(fraction)
        return f"{n} GPU" if n == 1 else f"{n} GPUs"
    return f"{fraction:g} GPU"


def share_request(fraction: float) -> dict[str, Any]:
    """The JobSpec amount for a kernel share: a fraction below 1, whole GPUs from 1 up."""
    if fraction <= 0:
        raise ValueError(f"gpu_fraction must be positive, not {fraction}")
    if fraction < 1:
        return {"gpu_fraction": float(fraction)}
    if not float(fraction).is_integer():
        raise ValueError(f"a kernel share of {fraction} GPUs must be a whole number above 1")
    return {"gpus": int(fraction)}


def build_job_env(job: dict[str, Any], simulated: bool | None = None) -> dict[str, str]:
    """The GPU environment a kernel holding ``job`` must run with.

    The scheduler returns it with build jobs (``job["env"]``, built by
    ``gpupool.envbuilder``); when an older scheduler leaves it out we build it
    here with the same builder so kernels and jobs always agree.
    """
    env = job.get("env")
    if env:
        return {str(k): str(v) for k, v in env.items()}
    from gpupool.envbuilder import gpu_environment

    gpus = [
        (str(g["id"]), int(g.get("milli") or 1000), int(g.get("memory_limit") or 0))
        for g in (job.get("assignment") or {}).get("gpus", [])
    ]
    return gpu_environment(
        job["id"],
        job["project"],
        gpus,
        attempt=int(job.get("attempts") or 1),
        resume=False,
        simulated=bool(simulated),
    )


def with_kernel_pythonpath(gpu_env: dict[str, str], kernel_pythonpath: str) -> dict[str, str]:
    """``gpu_env`` with PYTHONPATH = this machine's torch-hook dir + the kernel's own PYTHONPATH.

    The scheduler builds a build job's env with *its* PYTHONPATH (and its own hook
    path, which need not exist here when it runs elsewhere); taken as-is it would
    replace the kernel's. CPU-only envs carry no PYTHONPATH and are left alone.
    """
    if "PYTHONPATH" not in gpu_env:
        return gpu_env
    from gpupool.envbuilder import TORCH_HOOK_DIR

    own = [p for p in kernel_pythonpath.split(os.pathsep) if p and p != TORCH_HOOK_DIR]
    return {**gpu_env, "PYTHONPATH": os.pathsep.join([TORCH_HOOK_DIR, *own])}


def short_id(kernel_id: str) -> str:
    """The first 8 characters of a kernel id: enough to tell a user's kernels apart, short enough to read."""
    return kernel_id[:8]


def kernel_label(notebook: str, kernel_id: str) -> str:
    """What users call a kernel: 'kernel nb.ipynb' for a notebook's, else 'kernel 1a2b3c4d' (never a full UUID).

    Kernels started without a notebook (POST /api/kernels, an API client) have
    only their id; its full 36 characters in the queue view and in quota
    messages read as noise.
    """
    return f"kernel {os.path.basename(notebook) or short_id(kernel_id)}"


def quota_message(scheduler_message: str, held: bool) -> str:
    """What the "Error Starting Kernel" dialog says when the build quota refuses a kernel.

    The scheduler's message already says what was asked, what the project
    holds (by notebook, or 'kernel 1a2b3c4d' for a kernel with none) and what
    is free, in the shares of the Launcher: one wording, made in one place.
    We add only what the user can do about it; ``held``: whether the project's
    kernels hold part of the quota (else the request alone is too big).
    """
    return (f"No GPU share for this kernel: {scheduler_message}. "
            + ("Shut down a GPU kernel of this project, pick a smaller GPU kernel, or ask an admin for more "
               "build quota." if held else "Pick a smaller GPU kernel or ask an admin for more build quota."))
