"""gpupool: the GPU pool's scheduler, knowing nothing of Jupyter.

The layers, each importing only those listed before it (tests/test_import_contract.py):

- :mod:`gpupool.wire`: what crosses the HTTP API (limits, errors, plain text); imports nothing else.
- :mod:`gpupool.policy`: the pure policy, snapshot in and decisions out.
- :mod:`gpupool.inventory`: the GPUs of one machine (NVML, or simulated).
- :mod:`gpupool.backends`: where jobs run, behind one seam (local processes; Kubernetes pods).
- :mod:`gpupool.service`: state (SQLite), the cycle, attempts, users and projects.
- :mod:`gpupool.api`: the HTTP API over the service (tornado, OpenAPI).
- :mod:`gpupool.app`: the one place that picks a backend and wires service, API and runtime file.
- :mod:`gpupool.client` and :mod:`gpupool.cli`: how users and the Jupyter extension talk to it, over HTTP only.
"""


def sim_use(busy: float, memory: int | None = None, pid: int | None = None) -> bool:
    """On simulated GPUs, say how busy this job's or kernel's GPU share is (0..1): the simulation hook.

    A no-op (False) on real GPUs, where NVML measures the process. See
    :mod:`gpupool.inventory.sim_use` and docs/service.md ("Allocated vs used").
    """
    from gpupool.inventory.sim_use import report

    return report(busy, memory, pid)
