"""The simulation hook: a job or kernel on simulated GPUs says how busy it is, and the pool reads it.

Simulated GPUs measure nothing, and the scheduler never invents a number, so
on a simulated pool the use of the GPUs comes from the work itself: a job or
kernel calls ``gpupool.sim_use(busy=0.7)`` (or :func:`report`) whenever its
load changes. Its numbers then stand until it reports again or its process
ends, exactly as an NVML reading of that process would.

How it travels: the scheduler gives every job and kernel on simulated GPUs
``GPUPOOL_SIM_USE_DIR`` (a folder of the service's state directory). The
hook writes ``<dir>/<pid>.json`` (atomically: a temporary file renamed)::

    {"pid": 4242, "busy": 0.7, "fraction": 0.25, "memory": 2147483648, "gpus": ["GPU-..."]}

``busy`` is the part of the process's *share* that is busy (0..1), so a
kernel on a quarter GPU that is flat out says ``busy=1``; the reader turns it
into the percent of the whole GPU that NVML would report
(``busy * fraction * 100``). ``memory``: bytes it holds on each of its GPUs.
:func:`read` gives the same :class:`GpuSample` shape as the NVML inventory,
so everything above (the pid -> job mapping, the history, the report) runs
the same code on simulated and real GPUs. A file whose process is gone is
removed when read.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

from gpupool.inventory import GpuSample

ENV_DIR = "GPUPOOL_SIM_USE_DIR"


def report(busy: float, memory: int | None = None, pid: int | None = None) -> bool:
    """Say how busy this process's GPU share is now (0..1) and how many bytes it holds per GPU.

    Returns False (and does nothing) outside a simulated pool: on real GPUs
    NVML measures the process and nothing it says is needed; False too when
    the folder cannot be written (never an error that would stop a job). ``pid``: the
    process to report for (default this one; a shell script may report for
    its long-running parent).
    """
    folder = os.environ.get(ENV_DIR)
    if not folder or os.environ.get("GPUPOOL_SIMULATED") != "1":
        return False
    value = float(busy)
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"busy is the busy part of the share, from 0 to 1, not {busy!r}")
    fraction = float(os.environ.get("GPUPOOL_GPU_FRACTION") or 1.0)
    gpus = [g for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g]
    who = int(pid if pid is not None else os.getpid())
    body = {"pid": who, "busy": value, "fraction": fraction, "memory": int(memory or 0), "gpus": gpus}
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{who}.", dir=folder)
        with os.fdopen(fd, "w") as f:
            json.dump(body, f)
        os.replace(tmp, os.path.join(folder, f"{who}.json"))
    except OSError:  # the folder is not here (a pod on another machine) or not ours: a report never fails a job
        return False
    return True


def _alive(pid: int) -> bool:
    return os.path.exists(f"/proc/{pid}")


def read(folder: Path, gpu_ids: Iterable[str]) -> dict[str, GpuSample]:
    """Every GPU's sample from what its processes reported: measured on every GPU (``process_util`` set).

    A GPU no live process reports on reads idle (0 %, ``{}``), as NVML
    would show it. Unreadable or malformed files are skipped, never raised:
    a job's mistake must not stop the service's tick.
    """
    util: dict[str, dict[int, float]] = {gid: {} for gid in gpu_ids}
    mem: dict[str, dict[int, int]] = {gid: {} for gid in util}
    try:
        names = os.listdir(folder)
    except OSError:
        names = []
    for name in names:
        stem, dot, ext = name.partition(".")
        if ext != "json" or not stem.isdigit():
            continue
        pid = int(stem)
        path = os.path.join(folder, name)
        if not _alive(pid):
            try:
                os.unlink(path)
            except OSError:
                pass
            continue
        try:
            with open(path) as f:
                body = json.load(f)
            busy = min(1.0, max(0.0, float(body.get("busy", 0.0))))
            fraction = min(1.0, max(0.0, float(body.get("fraction", 1.0))))
            held = max(0, int(body.get("memory") or 0))
            gpus = [str(g) for g in body.get("gpus", [])]
        except (OSError, ValueError, TypeError, AttributeError):
            continue
        for gid in gpus:
            if gid in util:
                util[gid][pid] = busy * fraction * 100.0
                mem[gid][pid] = held
    return {gid: GpuSample(utilization=min(100.0, sum(u.values())), memory_used=sum(mem[gid].values()),
                           processes=dict(mem[gid]), process_util=u)
            for gid, u in util.items()}
