"""GPU inventory: what GPUs this machine has, and what they are doing.

Two sources share one small interface: :class:`~gpupool.inventory.nvml.NvmlInventory`
(real GPUs through NVML) and :class:`~gpupool.inventory.simulated.SimulatedInventory`
(GPUs described by a spec string, for machines without GPUs and for tests).
:func:`detect` picks one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(frozen=True)
class GpuInfo:
    """One GPU as the service sees it (memory in bytes, unlike the policy's MiB)."""

    id: str  # UUID ("GPU-...")
    index: int  # CUDA ordinal on this machine
    model: str  # canonical model name, e.g. "A100-80GB"
    memory: int  # bytes
    topology_group: str = ""
    node: str = ""  # the (simulated) node it is on; "" for this machine's GPUs read through NVML


@dataclass(frozen=True)
class GpuSample:
    """A live reading of one GPU (from NVML, or from what simulated jobs report of themselves).

    ``process_util``: each process's share of the GPU's SMs in percent (of the
    whole GPU) over the last sampling period; ``None`` when the GPU cannot say
    (NVML without per-process accounting), ``{}`` when it can and no process
    was busy. Why the difference matters: an unmeasured job is never counted
    as idle (the scheduler never invents numbers).
    """

    utilization: float | None = None  # percent
    memory_used: int | None = None  # bytes
    processes: dict[int, int] = field(default_factory=dict)  # pid -> GPU memory bytes
    process_util: dict[int, float] | None = None  # pid -> percent of the GPU's SMs; None: not measured


class Inventory(Protocol):
    """What the service needs from a GPU source."""

    simulated: bool

    def gpus(self) -> list[GpuInfo]:
        """The GPUs, in index order (node by node, for a simulated pool of several nodes)."""
        ...

    def sample(self) -> dict[str, GpuSample]:
        """Live readings by GPU id; empty when nothing is measured (simulated)."""
        ...

    def close(self) -> None:
        """Release the source (NVML shutdown)."""
        ...


def detect(simulate: str | None, default_simulation: str = "2xA100-80GB", node: str = "local") -> Inventory:
    """Real GPUs when NVML works and finds some (and no simulation is asked), else simulated ones."""
    from gpupool.inventory.simulated import SimulatedInventory

    if simulate:
        return SimulatedInventory(simulate, node=node)
    from gpupool.inventory.nvml import NvmlInventory, nvml_usable

    if nvml_usable():
        inv = NvmlInventory()
        if inv.gpus():
            return inv
        inv.close()
    return SimulatedInventory(default_simulation, node=node)


__all__ = ["GpuInfo", "GpuSample", "Inventory", "detect"]
