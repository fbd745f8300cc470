"""Real GPUs through NVML (``pynvml`` from ``nvidia-ml-py``).

Reads, once at start, each GPU's UUID, model and memory and the topology
between GPUs (NVLink peers, or a common PCIe switch per
``nvmlDeviceGetTopologyCommonAncestor``) turned into topology groups; and, on
every :meth:`NvmlInventory.sample`, utilization, memory in use, the
memory each process holds and each process's SM utilisation
(``nvmlDeviceGetProcessUtilization``): what the watchdog, the history and
the allocated-vs-used figures need.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from gpupool.inventory import GpuInfo, GpuSample
from gpupool.inventory.simulated import ALIASES, GIB, MODEL_MEMORY_GIB

log = logging.getLogger(__name__)

UTIL_MIN_INTERVAL_S = 3.0
"""A per-process utilisation read is reused this long (see :meth:`NvmlInventory._process_util`)."""


def _nvml() -> Any:
    import pynvml

    return pynvml


def nvml_usable() -> bool:
    """True when NVML loads and initialises (a driver is present); never raises."""
    try:
        nv = _nvml()
        nv.nvmlInit()
    except Exception:  # library missing, no driver, no permission: all mean "no NVML"
        return False
    try:
        nv.nvmlShutdown()
    except Exception:
        pass
    return True


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def normalize_model(nvml_name: str, memory_bytes: int) -> str:
    """``"NVIDIA A100-SXM4-80GB"`` -> ``"A100-80GB"``: the names the simulated table uses, when one fits."""
    name = re.sub(r"^(NVIDIA|Tesla|GeForce|Quadro)\s+", "", nvml_name.strip(), flags=re.I)
    name = re.sub(r"^(NVIDIA|Tesla|GeForce|Quadro)\s+", "", name, flags=re.I)
    compact = name.replace(" ", "").upper()
    for model in MODEL_MEMORY_GIB:
        if model.upper() == compact:
            return model
    gib = memory_bytes / GIB
    families = sorted({m.split("-")[0] for m in MODEL_MEMORY_GIB} | set(ALIASES), key=len, reverse=True)
    for fam in families:
        if re.search(rf"(^|[^A-Z0-9]){re.escape(fam)}([^0-9]|$)", name.upper().replace(" ", "-")):
            variants = [m for m in MODEL_MEMORY_GIB if m.split("-")[0] == fam]
            if not variants:
                return ALIASES.get(fam, fam)
            return min(variants, key=lambda m: abs(MODEL_MEMORY_GIB[m] - gib))
    return name.replace(" ", "-")


class NvmlInventory:
    """GPUs of this machine as NVML reports them."""

    simulated = False

    def __init__(self) -> None:
        self._nv = _nvml()
        self._nv.nvmlInit()
        self._handles: list[Any] = []
        self._gpus: list[GpuInfo] = []
        self._util_seen: dict[str, int] = {}  # per GPU: the newest per-process sample read (NVML microseconds)
        self._util_cache: dict[str, tuple[float, dict[int, float] | None]] = {}  # per GPU: (monotonic t, reading)
        self._load()

    def _load(self) -> None:
        nv = self._nv
        count = nv.nvmlDeviceGetCount()
        raw = []
        for i in range(count):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            self._handles.append(h)
            mem = int(nv.nvmlDeviceGetMemoryInfo(h).total)
            raw.append((i, _text(nv.nvmlDeviceGetUUID(h)), normalize_model(_text(nv.nvmlDeviceGetName(h)), mem), mem))
        groups = self._topology_groups()
        self._gpus = [GpuInfo(uid, i, model, mem, groups[i]) for i, uid, model, mem in raw]

    def _nvlink_peers(self, i: int, bus_ids: list[str]) -> set[int]:
        nv = self._nv
        peers: set[int] = set()
        for link in range(getattr(nv, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                if nv.nvmlDeviceGetNvLinkState(self._handles[i], link) != nv.NVML_FEATURE_ENABLED:
                    continue
                remote = _text(nv.nvmlDeviceGetNvLinkRemotePciInfo(self._handles[i], link).busId).lower()
            except Exception:  # link absent or not supported on this GPU
                continue
            for j, bus in enumerate(bus_ids):
                if j != i and bus[-12:] == remote[-12:]:
                    peers.add(j)
        return peers

    def _topology_groups(self) -> list[str]:
        """Union GPUs joined by NVLink, else by a shared PCIe switch; name each island."""
        nv = self._nv
        n = len(self._handles)
        parent = list(range(n))

        def find(x: int) -> int:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        bus_ids = []
        for h in self._handles:
            try:
                bus_ids.append(_text(nv.nvmlDeviceGetPciInfo(h).busId).lower())
            except Exception:
                bus_ids.append("")
        nvlinked = [False] * n
        for i in range(n):
            for j in self._nvlink_peers(i, bus_ids):
                nvlinked[i] = nvlinked[j] = True
                parent[find(i)] = find(j)
        close = getattr(nv, "NVML_TOPOLOGY_MULTIPLE", 20)
        for i in range(n):
            for j in range(i + 1, n):
                if nvlinked[i] or nvlinked[j]:
                    continue
                try:
                    level = nv.nvmlDeviceGetTopologyCommonAncestor(self._handles[i], self._handles[j])
                except Exception:
                    continue
                if level <= close:
                    parent[find(i)] = find(j)
        names: dict[int, str] = {}
        out = []
        for i in range(n):
            root = find(i)
            if root not in names:
                names[root] = f"{'nvlink' if nvlinked[i] else 'pcie'}{len(names)}"
            out.append(names[root])
        return out

    def gpus(self) -> list[GpuInfo]:
        return list(self._gpus)

    def sample(self) -> dict[str, GpuSample]:
        nv = self._nv
        out: dict[str, GpuSample] = {}
        for gpu, h in zip(self._gpus, self._handles, strict=True):
            util = used = None
            procs: dict[int, int] = {}
            try:
                util = float(nv.nvmlDeviceGetUtilizationRates(h).gpu)
            except Exception:
                pass
            try:
                used = int(nv.nvmlDeviceGetMemoryInfo(h).used)
            except Exception:
                pass
            for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                try:
                    for p in getattr(nv, getter)(h):
                        mem = getattr(p, "usedGpuMemory", None)
                        procs[int(p.pid)] = procs.get(int(p.pid), 0) + int(mem or 0)
                except Exception:
                    pass
            out[gpu.id] = GpuSample(util, used, procs, self._process_util(gpu.id, h))
        return out

    def _process_util(self, gpu_id: str, handle: Any) -> dict[int, float] | None:
        """Each process's SM use (percent of the GPU) since the last read; None when NVML cannot say.

        NVML keeps a ring of per-process samples; asking for those newer than
        the last one seen gives the period since the previous read. A process
        with several samples in it gets their mean. "No sample since" (NVML's
        NOT_FOUND, or SUCCESS with nothing) means nobody was busy: ``{}``.
        Why a read is reused for ``UTIL_MIN_INTERVAL_S``: the Pool view samples
        too, between two ticks; a fresh read then would take the samples the
        tick's reading needs, leaving the tick "nobody busy".
        """
        now = time.monotonic()
        cached = self._util_cache.get(gpu_id)
        if cached is not None and now - cached[0] < UTIL_MIN_INTERVAL_S:
            return cached[1]
        result = self._read_process_util(gpu_id, handle)
        self._util_cache[gpu_id] = (now, result)
        return result

    def _read_process_util(self, gpu_id: str, handle: Any) -> dict[int, float] | None:
        nv = self._nv
        since = self._util_seen.get(gpu_id, 0)
        try:
            rows = nv.nvmlDeviceGetProcessUtilization(handle, since)
        except Exception as e:  # NVMLError: NOT_FOUND (no samples) is a reading; anything else is not
            code = getattr(e, "value", None)
            return {} if code in (0, getattr(nv, "NVML_ERROR_NOT_FOUND", 6)) else None
        sums: dict[int, list[float]] = {}
        for r in rows:
            ts = int(getattr(r, "timeStamp", 0) or 0)
            if ts > since:
                self._util_seen[gpu_id] = max(self._util_seen.get(gpu_id, 0), ts)
            acc = sums.setdefault(int(r.pid), [0.0, 0.0])
            acc[0] += float(r.smUtil)
            acc[1] += 1.0
        return {pid: min(100.0, total / n) for pid, (total, n) in sums.items()}

    def close(self) -> None:
        try:
            self._nv.nvmlShutdown()
        except Exception:
            log.debug("nvmlShutdown failed", exc_info=True)
