"""Simulated GPUs from a spec string such as ``"4xA100-80GB"`` or ``"2xA100-80GB,2xT4"``.

Used on machines without NVML or GPUs (laptops, CI, Binder) so the whole
product works end to end; everything built on it is marked simulated
(``core.simulated``, ``Pool.simulated``, ``GPUPOOL_SIMULATED=1``).
GPU ids are stable for a given node name and spec, so a restart with the same
configuration finds the same GPUs that stored assignments refer to.
"""

from __future__ import annotations

import re
import uuid

from scheduler.errors import InvalidRequest
from scheduler.inventory import GpuInfo, GpuSample

GIB = 1024**3

MODEL_MEMORY_GIB: dict[str, int] = {
    "H200-141GB": 141,
    "H100-80GB": 80,
    "H100-94GB": 94,
    "A100-80GB": 80,
    "A100-40GB": 40,
    "A800-80GB": 80,
    "L40S": 48,
    "L40": 48,
    "A6000": 48,
    "A40": 48,
    "L4": 24,
    "A10": 24,
    "A10G": 24,
    "RTX4090": 24,
    "RTX3090": 24,
    "V100-32GB": 32,
    "V100-16GB": 16,
    "T4": 16,
    "P100": 16,
    "K80": 12,
}
"""Nominal memory of the models a spec may name (GiB)."""

ALIASES: dict[str, str] = {
    "H200": "H200-141GB",
    "H100": "H100-80GB",
    "A100": "A100-80GB",
    "V100": "V100-32GB",
    "V100M32": "V100-32GB",
    "V100M16": "V100-16GB",
}

_NAMESPACE = uuid.UUID("6b1c3a52-2f0e-4a55-9d7e-0f5c1f2a9e10")
_ITEM = re.compile(r"^\s*(?:(\d+)\s*[xX*]\s*)?([A-Za-z0-9][A-Za-z0-9_.-]*)\s*$")


def canonical_model(name: str) -> str:
    """The table's spelling of a model name (case-insensitive, aliases allowed); ``InvalidRequest`` if unknown."""
    key = name.strip().upper()
    for model in MODEL_MEMORY_GIB:
        if model.upper() == key:
            return model
    for alias, model in ALIASES.items():
        if alias == key:
            return model
    known = ", ".join(sorted(MODEL_MEMORY_GIB))
    raise InvalidRequest(f"unknown GPU model {name!r} in simulation spec; known models: {known}")


def parse_spec(spec: str) -> list[tuple[int, str]]:
    """``"2xA100-80GB,2xT4"`` -> ``[(2, "A100-80GB"), (2, "T4")]``; a clear error for anything else."""
    if not isinstance(spec, str) or not spec.strip():
        raise InvalidRequest("simulation spec must be a non-empty string like '4xA100-80GB'")
    out: list[tuple[int, str]] = []
    for part in spec.split(","):
        m = _ITEM.match(part)
        if not m:
            raise InvalidRequest(f"bad simulation spec item {part.strip()!r}: expected COUNTxMODEL, e.g. '4xA100-80GB'")
        count = int(m.group(1)) if m.group(1) else 1
        if count < 1 or count > 1024:
            raise InvalidRequest(f"bad GPU count {count} in simulation spec item {part.strip()!r} (1..1024)")
        out.append((count, canonical_model(m.group(2))))
    return out


class SimulatedInventory:
    """GPUs that exist only in configuration; nothing is measured."""

    simulated = True

    def __init__(self, spec: str, node: str = "local") -> None:
        self.spec = spec
        gpus: list[GpuInfo] = []
        index = 0
        for group, (count, model) in enumerate(parse_spec(spec)):
            for k in range(count):
                gid = "GPU-" + str(uuid.uuid5(_NAMESPACE, f"{node}/{index}/{model}"))
                # The GPUs of one spec item form simulated NVLink islands of up to 8.
                topo = f"sim-nvlink{group}.{k // 8}"
                gpus.append(GpuInfo(gid, index, model, MODEL_MEMORY_GIB[model] * GIB, topo))
                index += 1
        self._gpus = gpus

    def gpus(self) -> list[GpuInfo]:
        return list(self._gpus)

    def sample(self) -> dict[str, GpuSample]:
        return {}

    def close(self) -> None:
        return None
