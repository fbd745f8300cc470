"""GPU kernels culled by use: the scheduler says a kernel's share is idle, this server tells the kernel, then stops it.

Why here and not in the scheduler: only the Jupyter server knows whether a
cell is running (the kernel's ``execution_state``), and only it can warn the
notebook and shut the kernel down cleanly. The scheduler knows whether the
share's GPU does anything: it flags a running build job whose measured use
stayed under its project's idle rule for the rule's window (``idle_since``,
``idle_action`` "cull"; gpupool.service.idle). So:

1. each check lists this user's running build jobs (one call) and looks at
   the shares this server's kernels hold (jupyter_gpupool.leases);
2. a kernel whose share is flagged "cull", with no cell running, gets a
   **notice**: the kernel itself writes it to its stderr stream (a silent
   execute from this server), so every client attached to the kernel receives
   it on its iopub channel (in JupyterLab: the notebook's log console; Lab's
   notifications announce it too, from the scheduler's ``idle`` event);
3. ``notice_s`` later, if the share is still flagged and no cell is running,
   the kernel is shut down (one more line first); its provisioner gives the
   share back at once.

A cell running at any check (``execution_state`` busy) is never interrupted
and drops the notice: the next notice, and its full notice period, come
after the cell. Busy GPU again (the flag cleared by the scheduler) drops it
too. The kernel's browser activity plays no part either way.
"""

from __future__ import annotations

import datetime
import time
from dataclasses import dataclass
from typing import Any

from jupyter_gpupool import leases


@dataclass
class Notice:
    """A notice given to one kernel: when (monotonic), and for which idle stretch."""

    at: float
    idle_since: str


def _clock(iso: str) -> str:
    """"10:02:03 UTC" from the scheduler's ISO time (the text as given when it does not parse)."""
    try:
        return datetime.datetime.fromisoformat(iso).astimezone(datetime.timezone.utc).strftime("%H:%M:%S UTC")
    except ValueError:
        return iso


def _share(job: dict[str, Any]) -> str:
    request = job.get("request") or {}
    if request.get("gpus"):
        n = int(request["gpus"])
        return f"{n} GPU{'s' if n > 1 else ''}"
    fraction = request.get("gpu_fraction")
    return f"{float(fraction):g} of a GPU" if fraction else "GPU share"


def _span(seconds: float) -> str:
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


class IdleCuller:
    """The checks of one Jupyter server (jupyter_gpupool.app runs :meth:`check` every ``idle_check_interval``)."""

    def __init__(self, connection: Any, kernel_manager: Any, notice_s: float, log: Any) -> None:
        self.connection = connection
        self.kernels = kernel_manager
        self.notice_s = float(notice_s)
        self.log = log
        self.notices: dict[str, Notice] = {}
        """Kernel id -> the notice it was given (kept until it is culled or no longer idle)."""

    async def check(self) -> list[str]:
        """Give due notices and shut down kernels whose notice ran out; returns the ids shut down."""
        shares = leases.held()
        for kernel_id in [k for k in self.notices if k not in shares]:
            del self.notices[kernel_id]
        if not shares or not self.connection.ready:
            return []
        client = await self.connection.client()
        running = await client.jobs(kind="build", state="running", user=self.connection.user)
        jobs = {j["id"]: j for j in running}
        culled = []
        for kernel_id, share in shares.items():
            job = jobs.get(share.job_id)
            if kernel_id not in self.kernels:
                continue
            if job is None or not job.get("idle_since") or job.get("idle_action") != "cull":
                self.notices.pop(kernel_id, None)  # busy again, unmeasured, or the admin's rule says no
                continue
            km = self.kernels.get_kernel(kernel_id)
            if getattr(km, "execution_state", "") == "busy" or not _ready(km):
                self.notices.pop(kernel_id, None)  # a cell runs: never culled now, and a fresh notice after it
                continue
            notice = self.notices.get(kernel_id)
            if notice is None or notice.idle_since != job["idle_since"]:
                await self._give_notice(kernel_id, km, job)
                continue
            if time.monotonic() - notice.at < self.notice_s:
                continue
            self.log.info("gpupool: shutting down kernel %s: its GPU share (job %s) has been idle since %s; it "
                          "goes back to the pool", kernel_id, job["id"], job["idle_since"])
            await _say(km, f"gpupool: shutting this kernel down now: its {_share(job)} has been idle since "
                           f"{_clock(job['idle_since'])}, and goes back to the pool. Restart the kernel to get a "
                           "GPU share again (your variables are lost; saved files are not).")
            self.notices.pop(kernel_id, None)
            await self.kernels.shutdown_kernel(kernel_id)
            culled.append(kernel_id)
        return culled

    async def _give_notice(self, kernel_id: str, km: Any, job: dict[str, Any]) -> None:
        text = (f"gpupool: this kernel's {_share(job)} has been idle since {_clock(job['idle_since'])} (under its "
                f"project's idle threshold). The kernel will be shut down in {_span(self.notice_s)} to give the "
                "share back to the pool, unless it uses its GPU again or a cell is running then.")
        told = await _say(km, text)
        self.log.warning("gpupool: kernel %s (job %s) idle since %s: shut down in %s unless it is used%s",
                         kernel_id, job["id"], job["idle_since"], _span(self.notice_s),
                         "" if told else " (the kernel could not be told)")
        self.notices[kernel_id] = Notice(time.monotonic(), str(job["idle_since"]))


def _ready(km: Any) -> bool:
    ready = getattr(km, "ready", None)
    return ready is None or ready.done()


async def _say(km: Any, text: str, timeout: float = 10.0) -> bool:
    """Have a Python kernel write ``text`` to its stderr stream (every attached client gets it); True if it did.

    A silent execute: no execution count, nothing in the history, no name
    left in the user's namespace. Kernels of other languages are not asked.
    """
    try:
        language = str(getattr(km.kernel_spec, "language", "") or "").lower()
    except Exception:
        language = ""
    if language != "python":
        return False
    kc = km.client()
    kc.start_channels()
    try:
        await kc.wait_for_ready(timeout=timeout)
        reply = await kc.execute_interactive(f"__import__('sys').stderr.write({text + chr(10)!r})", silent=True,
                                             store_history=False, timeout=timeout, output_hook=lambda _msg: None)
        return bool(reply.get("content", {}).get("status") == "ok")
    except Exception:
        return False
    finally:
        kc.stop_channels()
