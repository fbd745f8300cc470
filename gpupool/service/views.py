"""Read-side views the core serves: Pool JSON, history samples, log chunks, job-list filters.

Pure functions over the core's records (plus one file read for logs), kept
apart from the core so the state machine in core.py stays readable and each
view can be tested on its own.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from gpupool.inventory import GpuInfo, GpuSample
from gpupool.policy.model import Node
from gpupool.service.jobs import gpus_text
from gpupool.service.store import JobRecord
from gpupool.wire.errors import InvalidRequest
from gpupool.wire.states import ALL_STATES

MAX_LOG_CHUNK = 1024 * 1024
DEFAULT_LIST = 200


def shares(rec: JobRecord) -> list[dict[str, Any]]:
    """The per-GPU entries of a running job's assignment (empty otherwise)."""
    return list((rec.assignment or {}).get("gpus", [])) if rec.state == "running" else []


def pool_view(nodes: Iterable[Node], gpus: dict[str, GpuInfo], running: Iterable[JobRecord],
              samples: dict[str, GpuSample], host_memory: int, simulated: bool) -> dict[str, Any]:
    """The Pool JSON of docs/design.md: nodes, GPUs, who holds what, and NVML readings where present."""
    allocations: dict[str, list[dict[str, Any]]] = {gid: [] for gid in gpus}
    for rec in running:
        for share in shares(rec):
            allocations.setdefault(share["id"], []).append({
                "job_id": rec.id, "project": rec.project, "user": rec.user, "kind": rec.kind,
                "fraction": gpus_text(int(share["milli"])),
            })
    out = []
    for node in nodes:
        entries = []
        for g in node.gpus:
            allocs = allocations.get(g.id, [])
            entry: dict[str, Any] = {
                "id": g.id, "index": g.index, "model": g.model, "memory": gpus[g.id].memory,
                "topology_group": g.topology_group,
                "allocated": round(sum(float(a["fraction"]) for a in allocs), 3), "allocations": allocs,
            }
            s = samples.get(g.id)
            if s is not None:
                if s.utilization is not None:
                    entry["utilization"] = s.utilization
                if s.memory_used is not None:
                    entry["memory_used"] = s.memory_used
            entries.append(entry)
        out.append({"name": node.name, "group": node.group, "pools": sorted(node.pools), "cpu": node.cpu_milli / 1000,
                    "memory": host_memory, "gpus": entries})
    return {"simulated": simulated, "nodes": out}


def history_sample(t: float, project_names: Iterable[str], gpu_ids: Iterable[str], running: Iterable[JobRecord],
                   samples: dict[str, GpuSample]) -> dict[str, Any]:
    """One history sample: milli-GPU held per project and per GPU, with NVML readings where present."""
    projects: dict[str, int] = {name: 0 for name in project_names}
    per_gpu: dict[str, dict[str, Any]] = {gid: {"milli": 0} for gid in gpu_ids}
    for rec in running:
        for g in shares(rec):
            projects[rec.project] = projects.get(rec.project, 0) + int(g["milli"])
            if g["id"] in per_gpu:
                per_gpu[g["id"]]["milli"] += int(g["milli"])
    for gid, s in samples.items():
        if gid in per_gpu:
            if s.utilization is not None:
                per_gpu[gid]["util"] = s.utilization
            if s.memory_used is not None:
                per_gpu[gid]["mem_used"] = s.memory_used
    return {"t": t, "projects": projects, "gpus": per_gpu}


def read_log_chunk(path: Path, offset: Any, limit: Any) -> tuple[str, int, int]:
    """``(text, next_offset, file_size)`` from byte ``offset``, never cutting a UTF-8 character in two."""
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise InvalidRequest("offset must be a whole number >= 0")
    if limit is None:
        limit = 64 * 1024
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise InvalidRequest("limit must be a whole number >= 1")
    limit = min(limit, MAX_LOG_CHUNK)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            f.seek(min(offset, size))
            raw = f.read(limit)
    except FileNotFoundError:
        size, raw = 0, b""
    cut = len(raw)
    for back in range(1, min(4, len(raw)) + 1):
        byte = raw[-back]
        if byte & 0xC0 == 0x80:  # a continuation byte: keep looking for the lead byte
            continue
        if byte & 0x80:
            need = 2 if byte & 0xE0 == 0xC0 else 3 if byte & 0xF0 == 0xE0 else 4
            if back < need:
                cut = len(raw) - back  # incomplete character: hold it back for the next read
        break
    if cut > 0:  # a limit smaller than one character still makes progress (with a replacement mark)
        raw = raw[:cut]
    return raw.decode("utf-8", "replace"), min(offset, size) + len(raw), size


def job_filters(filters: dict[str, Any] | None, max_list: int) -> dict[str, Any]:
    """Check list filters (project, user, state as "a,b" or a list, kind, limit) -> store query arguments."""
    f = dict(filters or {})
    unknown = sorted(set(f) - {"project", "user", "state", "kind", "limit"})
    if unknown:
        raise InvalidRequest(f"unknown job filter(s): {', '.join(unknown)}")
    states = f.get("state")
    if isinstance(states, str):
        states = [s for s in states.split(",") if s]
    if states is not None:
        if not isinstance(states, (list, tuple)) or not all(isinstance(s, str) for s in states):
            raise InvalidRequest("state must be a comma-separated list of states")
        bad = [s for s in states if s not in ALL_STATES]
        if bad:
            raise InvalidRequest(f"unknown state(s) {', '.join(bad)}; states are {', '.join(ALL_STATES)}")
    kind = f.get("kind")
    if kind is not None and kind not in ("train", "build"):
        raise InvalidRequest(f"kind must be 'train' or 'build', not {kind!r}")
    limit = f.get("limit", DEFAULT_LIST)
    try:
        limit = int(limit)
    except (TypeError, ValueError):
        raise InvalidRequest(f"limit must be a whole number, not {limit!r}") from None
    if limit < 1:
        raise InvalidRequest("limit must be at least 1")
    for k in ("project", "user"):
        if f.get(k) is not None and not isinstance(f[k], str):
            raise InvalidRequest(f"{k} must be a string")
    return {"states": list(states) if states else None, "project": f.get("project"), "user": f.get("user"),
            "kind": kind, "limit": min(limit, max_list)}
