"""Kernel start time through the GPU-share provisioner versus a plain kernel (target: <= 1.1x).

Run from the project root::

    python -m bench.kernel_start --rounds 6

Starts an embedded scheduler (simulated GPUs) in this process, as the Jupyter
extension does, then alternates plain ``python3`` kernels and ``¼ GPU`` kernels
made by :mod:`jupyter_gpupool.kernelspecs`, timing each from ``start_kernel``
to the kernel answering ``kernel_info`` (what a user waits for). Alternating
spreads machine noise over both kinds. It also times the provisioner's own
work (taking the share) on its own, and prints one table; ``--json`` prints
the numbers only.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any

from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.manager import AsyncKernelManager

from jupyter_gpupool import connection as connection_mod
from jupyter_gpupool.connection import PoolConnection, PoolSettings
from jupyter_gpupool.kernelspecs import register_kernel_dir, write_kernelspecs


async def time_kernel(ksm: KernelSpecManager, name: str) -> float:
    """Seconds from start_kernel to a kernel_info reply; the kernel is shut down afterwards."""
    km = AsyncKernelManager(kernel_name=name, kernel_spec_manager=ksm)
    start = time.perf_counter()
    await km.start_kernel()
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=120)
        elapsed = time.perf_counter() - start
    finally:
        kc.stop_channels()
        await km.shutdown_kernel(now=True)
    return elapsed


async def time_share(conn: PoolConnection, rounds: int) -> list[float]:
    """Seconds to take and give back a ¼ GPU share (the provisioner's round trip to the scheduler)."""
    client = await conn.client()
    out = []
    for i in range(rounds):
        start = time.perf_counter()
        job = await client.submit({"project": conn.project, "kind": "build", "gpu_fraction": 0.25,
                                   "client_key": f"bench-{i}", "labels": {"kernel_id": f"bench-{i}"}})
        out.append(time.perf_counter() - start)
        await client.cancel(job["id"])
    return out


async def run(rounds: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        conn = PoolConnection(PoolSettings(state_dir=os.path.join(tmp, "state"), simulate="4xA100-80GB",
                                           build_quota=4.0))
        connection_mod.set_current(conn)
        await conn.client()
        ksm = KernelSpecManager()
        kernels_dir = os.path.join(tmp, "kernels")
        (gpu_name,) = write_kernelspecs(kernels_dir, [0.25], ksm)
        register_kernel_dir(ksm, kernels_dir)
        try:
            await time_kernel(ksm, "python3")  # warm caches (imports, bytecode) before measuring
            plain, gpu = [], []
            for _ in range(rounds):
                plain.append(await time_kernel(ksm, "python3"))
                gpu.append(await time_kernel(ksm, gpu_name))
            share = await time_share(conn, rounds * 3)
        finally:
            connection_mod.set_current(None)
            await conn.close()
    return {"plain_s": plain, "gpu_s": gpu, "share_s": share}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6, help="kernels of each kind (default 6)")
    parser.add_argument("--json", action="store_true", help="print the raw numbers as JSON")
    args = parser.parse_args(argv)
    result = asyncio.run(run(args.rounds))
    plain, gpu, share = (statistics.median(result[k]) for k in ("plain_s", "gpu_s", "share_s"))
    ratio = gpu / plain
    # each GPU kernel against the plain kernel started just before it: less sensitive to load drifting
    paired = statistics.median(g / p for p, g in zip(result["plain_s"], result["gpu_s"], strict=True))
    if args.json:
        print(json.dumps({**result, "ratio": ratio, "paired_ratio": paired}))
        return 0
    print(f"# kernel start, {args.rounds} kernels each, {platform.node()} ({os.cpu_count()} CPU), "
          f"Python {platform.python_version()}")
    print(f"{'kernel':<26} {'median s':>9} {'min s':>7} {'max s':>7}")
    for label, key in (("python3 (plain)", "plain_s"), ("Python 3 (¼ GPU) provisioner", "gpu_s")):
        values = result[key]
        print(f"{label:<26} {statistics.median(values):9.3f} {min(values):7.3f} {max(values):7.3f}")
    print(f"{'share take (submit build)':<26} {share:9.4f} {min(result['share_s']):7.4f} {max(result['share_s']):7.4f}")
    verdict = "OK" if ratio <= 1.1 else "OVER TARGET"
    print(f"ratio GPU/plain: {ratio:.3f} (target <= 1.1: {verdict}); median of paired ratios {paired:.3f}")
    return 0 if ratio <= 1.1 else 1


if __name__ == "__main__":
    sys.exit(main())
