"""GPU kernels of this server that are still starting, and what each waits for.

Why: while a kernel waits for room (its share queued behind other work) or for
its pod (on Kubernetes), Jupyter's own answer to the front end is simply late:
``POST /api/sessions`` returns only once the kernel runs, and Lab shows
"Starting" with no reason. The provisioner records here what the wait is for;
``GET /gpupool/api/kernels`` lists these kernels by notebook path (Lab does not
know their kernel id yet), and the status bar of that notebook says
"GPU ¼ · waiting for a share" with the scheduler's reason and the time left
before the start gives up (``c.GPUPool.kernel_start_timeout``).

A module-level registry like :mod:`jupyter_gpupool.leases`: one Jupyter server
per process, and a kernel's provisioner lives in that server.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Starting:
    """One starting kernel: its notebook, since when, until when, and why it is not running yet."""

    kernel_id: str
    path: str
    timeout_s: float
    since: float = field(default_factory=time.time)
    what: str = "share"  # "share": the share is queued; "pod": the share runs, its kernel pod does not yet
    reason: str = ""
    job: dict[str, Any] | None = None  # the scheduler's Job of the share, as last read

    def wire(self) -> dict[str, Any]:
        """How the kernels endpoint shows it (times in Unix seconds, as the scheduler's Jobs do)."""
        return {"what": self.what, "reason": self.reason, "since": self.since,
                "gives_up_at": self.since + self.timeout_s}


_starting: dict[str, Starting] = {}


def note(kernel_id: str, path: str, timeout_s: float, what: str, reason: str,
         job: dict[str, Any] | None = None) -> Starting:
    """Record (or update) what a starting kernel waits for; its ``since`` stays that of the first note."""
    entry = _starting.get(kernel_id)
    if entry is None:
        entry = _starting[kernel_id] = Starting(kernel_id, path, timeout_s)
    entry.what, entry.reason = what, reason
    if job is not None:
        entry.job = job
    return entry


def done(kernel_id: str) -> None:
    """The kernel started, or its start failed: it waits for nothing any more."""
    _starting.pop(kernel_id, None)


def waiting() -> list[Starting]:
    """The kernels still starting, oldest first."""
    return sorted(_starting.values(), key=lambda s: s.since)
