"""The build-quota check at submit, and the message a notebook user reads when it refuses.

A kernel that does not fit its project's build quota is refused in the submit
reply (409), and Jupyter shows that message in its "Error Starting Kernel"
dialog. It must say at a glance what was asked, what the project holds (and
which notebooks hold it) and what is left, in the shares users pick in the
Launcher (¼, ½, 1 GPU), not in milli-GPU.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from gpupool.policy.model import MILLI
from gpupool.service.store import JobRecord, ProjectRecord
from gpupool.wire.errors import QuotaExceeded

_FRACTIONS = {125: "⅛", 250: "¼", 333: "⅓", 375: "⅜", 500: "½", 625: "⅝", 667: "⅔", 750: "¾", 875: "⅞"}


def share_text(milli: int) -> str:
    """A GPU share as users say it: ``1``, ``¼``, ``1½``, else up to three decimals (``0.3``)."""
    whole, part = divmod(int(milli), MILLI)
    if part == 0:
        return str(whole)
    if part in _FRACTIONS:
        return f"{whole or ''}{_FRACTIONS[part]}"
    return f"{milli / MILLI:.3f}".rstrip("0")


def gpus_phrase(milli: int) -> str:
    """``1 GPU``, ``¼ GPU``, ``2 GPUs``: a share with its noun."""
    return f"{share_text(milli)} GPU{'s' if milli > MILLI or milli == 0 else ''}"


def _holder_text(rec: JobRecord, milli: int) -> str:
    """``nb.ipynb ¼ (alice, kernel 1a2b3c4d, j-000001)``: what holds part of the quota, and whose it is."""
    notebook = rec.labels.get("notebook")
    kernel = rec.labels.get("kernel_id")
    what = notebook or (f"kernel {kernel[:8]}" if kernel else rec.id)
    who = [rec.user]
    if notebook and kernel:
        who.append(f"kernel {kernel[:8]}")
    if what != rec.id:
        who.append(rec.id)
    queued = ", waiting" if rec.state == "queued" else ""
    return f"{what} {share_text(milli)} ({', '.join(who)}{queued})"


def check_build_quota(project: ProjectRecord, need: int, holders: Iterable[tuple[JobRecord, int]]) -> None:
    """Raise :class:`QuotaExceeded` unless ``need`` milli-GPU fits beside what ``holders`` hold.

    ``holders`` are the project's live build jobs with the share each holds (or,
    queued, will hold). The message reads like
    "asked for 1 GPU; project 'root' holds ¼ GPU of its build quota of 1 GPU
    (Untitled.ipynb ¼ (alice, kernel 1a2b3c4d, j-000001)); ¾ GPU free".
    """
    held_by = list(holders)
    held = sum(m for _, m in held_by)
    if held + need <= project.build_quota_milli:
        return
    quota = gpus_phrase(project.build_quota_milli)
    asked = f"asked for {gpus_phrase(need)}"
    if not held_by:
        raise QuotaExceeded(f"{asked}; project {project.name!r} has a build quota of only {quota}", held_milli=0)
    free = max(0, project.build_quota_milli - held)
    holders_text = "; ".join(_holder_text(r, m) for r, m in held_by)
    raise QuotaExceeded(f"{asked}; project {project.name!r} holds {gpus_phrase(held)} of its build quota of "
                        f"{quota} ({holders_text}); {gpus_phrase(free) if free else 'nothing'} free", held_milli=held)


def build_holders(records: Iterable[JobRecord], held: Callable[[JobRecord], int],
                  estimate: Callable[[dict[str, Any]], int]) -> list[tuple[JobRecord, int]]:
    """Each live build job with its share: what a running one holds, what a queued one asked for."""
    return [(r, held(r) if r.state == "running" else estimate(r.request)) for r in records]
