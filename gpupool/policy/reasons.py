"""Wording of the reasons attached to every decision.

Users read these in Lab, the CLI and the job list, so they name projects,
jobs and amounts in GPUs (not milli-GPU), and say what would change the
outcome. Kept apart from the engine so that the wording can be improved
without touching the rules.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpupool.policy.model import MILLI, Request


def gpus(milli: float) -> str:
    """``1500`` -> ``"1.5 GPUs"``; ``1000`` -> ``"1 GPU"``."""
    value = round(milli / MILLI, 3)
    text = f"{value:.3f}".rstrip("0").rstrip(".")
    return f"{text} GPU" if text == "1" else f"{text} GPUs"


def describe(request: Request) -> str:
    """A short description of what a request asks for."""
    if request.gpus:
        what = f"{request.gpus} whole GPU" + ("s on one node" if request.gpus > 1 else "")
    elif request.gpu_milli:
        what = f"{request.gpu_milli / MILLI:g} of one GPU"
    elif request.gpu_memory_mib:
        what = f"{request.gpu_memory_mib} MiB of GPU memory"
    else:
        what = "no GPU"
    if request.gpu_models:
        what += " (" + "/".join(sorted(request.gpu_models)) + ")"
    extras = []
    if request.cpu_milli:
        extras.append(f"{request.cpu_milli / 1000:g} CPU")
    if request.memory_mib:
        extras.append(f"{request.memory_mib} MiB memory")
    if extras:
        what += " with " + ", ".join(extras)
    return what


def holders(items: Sequence[tuple[str, int]], limit: int = 8) -> str:
    """``[("j1", 500), ...]`` -> ``"j1 (0.5 GPUs), ..."``, shortened past ``limit`` items."""
    if not items:
        return "nothing"
    shown = ", ".join(f"{wid} ({gpus(m)})" for wid, m in items[:limit])
    if len(items) > limit:
        shown += f" and {len(items) - limit} more"
    return shown


def seconds(value: float) -> str:
    return f"{value:.0f} s"
