"""The process side of a GPU kernel that runs in a pod (the provisioner's kernel-pod path; docs/kubernetes.md).

Jupyter drives a kernel through its provisioner as if it were a local
process: is it alive (``poll``), wait for its end (``wait``), signal it,
kill it. For a kernel pod (:mod:`jupyter_gpupool.kernel_pod`) those answers
come from the share's Job, which carries the pod's state: the kernel process
"ends" when the pod's container restarts it (``restartPolicy: Always``: a
Jupyter restart keeps the pod) and is gone for good when the share or the pod
is. :class:`KernelPodProcess` holds those answers for
:class:`~jupyter_gpupool.provisioner.GPUPoolProvisioner`, which mixes it in
before ``LocalProvisioner``: with no pod, every method is the local one.
"""

from __future__ import annotations

import asyncio
from typing import Any

from gpupool.wire.errors import GpupoolError, Unavailable
from jupyter_gpupool.connection import connection_from_env, current
from jupyter_gpupool.kernel_pod import POLL_S, STATE_MAX_AGE_S, PodKernel


class KernelPodProcess:
    """A kernel pod answering for the kernel process (mixed in before ``LocalProvisioner``)."""

    pod: PodKernel | None = None  # the kernel's pod, where the scheduler runs kernels as pods
    _pod_starting = False  # a (re)start of the kernel's pod is under way: no poll judges it meanwhile
    # of the provisioner it is mixed into
    process: Any
    parent: Any
    kernel_id: Any
    log: Any

    async def _give_back(self, conn: Any = None) -> None:
        """The provisioner's: give the share back (its pod is then deleted)."""
        raise NotImplementedError

    @property
    def has_process(self) -> bool:
        """A kernel pod counts as the kernel's process while its share and pod live."""
        if self.pod is not None:
            return not self.pod.ended
        return self.process is not None

    async def _pool_client(self) -> Any:
        conn = current() or connection_from_env()
        if conn is None or conn.closed:
            raise Unavailable("the gpupool extension has stopped; no scheduler connection")
        return await conn.client()

    async def wait(self) -> int | None:
        """A kernel pod: until its kernel process ended (the container restarted it, or the pod is gone)."""
        if self.pod is None:
            return await super().wait()  # type: ignore[misc]
        client = await self._pool_client()
        while not await self.pod.exited(client):
            await asyncio.sleep(POLL_S)
        return 0

    async def send_signal(self, signum: int) -> None:
        """No signal reaches a pod's process from here (interrupts go as messages: ``interrupt_mode``)."""
        if self.pod is None:
            await super().send_signal(signum)  # type: ignore[misc]
        elif signum:
            self.log.info("gpupool: signal %s not sent to kernel %s: it runs in a pod", signum, self.kernel_id)

    async def kill(self, restart: bool = False) -> None:
        """A kernel pod that will not end when asked: its share is given back, so its pod is deleted; a
        restart then makes a fresh pod (with a new share)."""
        if self.pod is None:
            return await super().kill(restart)  # type: ignore[misc]
        self.pod.ended = self.pod.ended or "stopped by the Jupyter server"
        await self._give_back()

    async def terminate(self, restart: bool = False) -> None:
        if self.pod is None:
            return await super().terminate(restart)  # type: ignore[misc]
        await self.kill(restart)

    async def _poll_pod(self, pod: PodKernel) -> int | None:
        """A kernel pod's answer to poll: gone for good (1); during a shutdown or restart, whether the kernel
        process asked to end has ended (0: its container restarted it); else alive (None), even when the
        kubelet has just restarted a crashed kernel in place (that restart is taken as the one seen), and
        while a (re)start of the pod is under way (a restart that takes a new share)."""
        if self._pod_starting:
            return None  # the watcher's poll while Jupyter restarts the kernel: the start decides
        try:
            client = await self._pool_client()
            if getattr(self.parent, "shutting_down", False):
                return 0 if await pod.exited(client) else None
            job = await pod.refresh(client, STATE_MAX_AGE_S)
        except GpupoolError as err:
            self.log.warning("gpupool: cannot see kernel %s's pod: %s", self.kernel_id, err)
            return None
        if pod.ended:
            return 1
        now = job.get("kernel_pod") or {}
        if now.get("ready"):
            pod.restarts = max(pod.restarts, int(now.get("restarts") or 0))
        return None
