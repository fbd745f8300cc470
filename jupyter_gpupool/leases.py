"""GPU shares held by this server's kernels, and the renewal that keeps them.

A kernel's GPU share is a scheduler *build job* with a lease. The server renews
the leases of kernels it still runs. A kernel dead for good gives its share
back itself (the provisioner sees it end); when the server cannot (it was
killed), renewal stops and the scheduler takes the share back when the lease
runs out. That bounds how long a lost kernel can hold a GPU without the server
having to notice anything.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any

from gpupool.wire.errors import Conflict, GpupoolError, NotFound

log = logging.getLogger(__name__)


@dataclass
class Share:
    """One kernel's share: its build job and the notebook it serves."""

    kernel_id: str
    job_id: str
    path: str = ""
    lease_s: float | None = None  # the lease length the scheduler granted (seen at take or renew)


def lease_length(job: dict[str, Any]) -> float | None:
    """Seconds of lease the scheduler gave with this Job reply (None when it has no lease)."""
    expires = job.get("lease_expires_at")
    if not expires:
        return None
    return max(float(expires) - time.time(), 0.0)


def shortest_lease() -> float | None:
    """The shortest lease among held shares: renewals must come well within it."""
    known = [s.lease_s for s in _shares.values() if s.lease_s]
    return min(known) if known else None


_shares: dict[str, Share] = {}


def hold(share: Share) -> None:
    """Record that a kernel of this server holds a share (renewed from now on)."""
    _shares[share.kernel_id] = share


def release(kernel_id: str) -> Share | None:
    """Stop renewing a kernel's share; returns it if it was held."""
    return _shares.pop(kernel_id, None)


def held() -> dict[str, Share]:
    """A copy of the kernel id -> share map (for the handlers and tests)."""
    return dict(_shares)


async def kernel_is_live(kernel_manager: Any, kernel_id: str) -> bool:
    """Whether the server still runs this kernel (alive, starting or restarting).

    A kernel the server no longer lists, or whose process is gone with no
    restart under way, is not live: its lease must be left to expire.
    """
    if kernel_manager is None or kernel_id not in kernel_manager:
        return False
    km = kernel_manager.get_kernel(kernel_id)
    if getattr(km, "_restarter", None) is not None and getattr(km, "autorestart", False):
        restarter = km._restarter
        if getattr(restarter, "_restarting", False):
            return True
    if not getattr(km, "ready", None) or not km.ready.done():
        return True  # still starting
    try:
        return bool(await km.is_alive())
    except Exception:
        return False


@dataclass
class Renewal:
    """What one renewal round did: job ids renewed, and shares found ended under a live kernel."""

    renewed: list[str] = field(default_factory=list)
    lost: list[tuple[Share, str]] = field(default_factory=list)  # (share, why)


async def renew_live_shares(client: Any, kernel_manager: Any) -> Renewal:
    """Renew the leases of live kernels; report shares that ended while their kernel runs.

    Kernels that are not live are *not* renewed (their lease runs out), but stay
    recorded so a later restart can keep them. A share that ended under a live
    kernel (cancelled from a queue view, or its lease ran out while the server
    was suspended) is forgotten and reported, so the caller can stop the kernel.
    """
    result = Renewal()
    for share in list(_shares.values()):
        if not await kernel_is_live(kernel_manager, share.kernel_id):
            continue
        try:
            job = await client.renew(share.job_id)
        except NotFound:
            release(share.kernel_id)
            result.lost.append((share, f"job {share.job_id} no longer exists"))
            continue
        except Conflict:
            try:  # renewing an ended job is refused: see how it ended
                job = await client.job(share.job_id)
            except GpupoolError as err:
                log.warning("gpupool: cannot renew share %s of kernel %s: %s", share.job_id, share.kernel_id, err)
                continue
        except GpupoolError as err:
            log.warning("gpupool: cannot renew share %s of kernel %s: %s", share.job_id, share.kernel_id, err)
            continue
        if job.get("state") not in ("queued", "running"):
            release(share.kernel_id)
            result.lost.append((share, f"share {job['id']} {job.get('state')}: {job.get('reason') or ''}".strip()))
            continue
        share.lease_s = lease_length(job) or share.lease_s
        result.renewed.append(share.job_id)
    return result
