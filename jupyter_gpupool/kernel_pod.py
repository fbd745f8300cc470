"""The provisioner's kernel-pod path: a GPU kernel that runs in a pod the scheduler makes (docs/kubernetes.md).

When the scheduler runs the Kubernetes backend (``GET /status`` says
``kernel_pods: true``) a GPU kernel does not run next to the Jupyter server:
its build share is submitted with a ``kernel_pod`` request (the kernelspec's
command, the connection the server will use, who to run as), and once the
share is granted the scheduler creates and binds the pod. This module builds
that request, waits for the pod to listen, and answers the provisioner's
questions about it (alive? restarted?) from the share's Job, which carries the
pod's address and state.

The HMAC key travels only in the request body (to the scheduler, which keeps
it in a Secret owned by the pod) and stays in the server's own connection
file (mode 0600, as for every kernel).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

KERNEL_CHANNELS = ("shell", "iopub", "stdin", "control", "hb")
POLL_S = 0.1  # how often a starting or restarting pod is looked at
STATE_MAX_AGE_S = 1.0  # a poll of a running kernel reuses the share's state this long
HEARTBEAT_S = 0.5  # how long a starting kernel's heartbeat may take to echo
CRASH_LOOP = "CrashLoopBackOff"  # the kubelet's reason (the Job's kernel_pod.reason) for a container that keeps exiting
_pod_schedulers: dict[str, bool] = {}  # scheduler URL -> whether it runs kernel pods (asked once per server)


async def runs_kernel_pods(client: Any, url: str) -> bool:
    """Whether the scheduler at ``url`` runs GPU kernels as pods (asked once; an embedded one never does)."""
    if not url:
        return False
    if url not in _pod_schedulers:
        status = await client.status()
        _pod_schedulers[url] = bool(status.get("kernel_pods"))
    return _pod_schedulers[url]


def free_ports(count: int = len(KERNEL_CHANNELS)) -> list[int]:
    """``count`` distinct ports free on this machine.

    In a pod any port would do (it has its own address); picking ones free here
    keeps kernels apart where pods share a network, as in the tests.
    """
    socks = []
    try:
        for _ in range(count):
            s = socket.socket()
            s.bind(("", 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def connection(km: Any, ports: list[int]) -> dict[str, Any]:
    """The kernel's connection (what its pod's connection file says, but the address): the server's own key."""
    key = km.session.key
    return {"key": key.decode() if isinstance(key, bytes) else str(key),
            "signature_scheme": str(km.session.signature_scheme), "transport": "tcp",
            "kernel_name": str(km.kernel_name or ""),
            **{f"{c}_port": p for c, p in zip(KERNEL_CHANNELS, ports, strict=True)}}


def pod_env(launch_env: dict[str, str], spec_env: dict[str, str], pool_env: dict[str, str]) -> tuple[
        dict[str, str], dict[str, str]]:
    """(plain, secret) variables for the kernel's pod.

    Not the server's whole environment (it holds the Hub's token and the
    server's own settings): the kernelspec's variables, what Jupyter tells a
    kernel about its notebook, and what the kernel needs to reach the scheduler,
    whose token goes in the Secret.
    """
    plain = dict(spec_env)
    for k in ("JPY_SESSION_NAME", "GPUPOOL_KERNEL_ID", "GPUPOOL_SERVER_ROOT"):
        if launch_env.get(k):
            plain[k] = launch_env[k]
    secret: dict[str, str] = {}
    for k, v in pool_env.items():
        (secret if k == "GPUPOOL_TOKEN" else plain)[k] = v
    return plain, secret


def pod_image(configured: str) -> str | None:
    """The kernel pod's image: the kernelspec's, else the server's own (KubeSpawner says it), else the
    scheduler's default (None)."""
    return configured or os.environ.get("JUPYTER_IMAGE_SPEC") or os.environ.get("JUPYTER_IMAGE") or None


@dataclass
class PodKernel:
    """One kernel's pod as its provisioner follows it (through the share's Job)."""

    job_id: str
    connection: dict[str, Any]
    ip: str = ""
    restarts: int = 0
    ended: str = ""  # why the kernel is gone for good ("" while its share and pod live)
    checked: float = 0.0
    state: dict[str, Any] = field(default_factory=dict)

    async def refresh(self, client: Any, max_age_s: float = 0.0) -> dict[str, Any]:
        """The share's Job (at most ``max_age_s`` old); notes when the share or pod is gone."""
        if self.state and time.monotonic() - self.checked < max_age_s:
            return self.state
        from gpupool.wire.errors import NotFound

        try:
            job = await client.job(self.job_id)
        except NotFound:
            job = {"id": self.job_id, "state": "cancelled", "reason": "the share no longer exists"}
        self.state, self.checked = job, time.monotonic()
        if job.get("state") != "running":
            self.ended = self.ended or f"its share {self.job_id} is {job.get('state')}: {job.get('reason') or ''}"
        elif job.get("kernel_pod") is None:
            self.ended = self.ended or "its pod is gone"
        return job

    async def wait_listening(self, client: Any, deadline: float, after_restarts: int = -1,
                             on_wait: Callable[[str], None] | None = None) -> dict[str, Any]:
        """Wait until the pod runs its kernel (has an address, is ready, restarted more than
        ``after_restarts`` times, and the kernel answers on its heartbeat); the pod as the Job shows it.
        ``TimeoutError`` with the pod's own words; ``RuntimeError`` when the kernel is gone for good (its share
        or pod ended, or its container keeps exiting). ``on_wait(message)``: each new reason the pod gives for
        not running yet (the server's log says it)."""
        pod: dict[str, Any] = {}
        said = ""
        while True:
            job = await self.refresh(client)
            if self.ended:
                raise RuntimeError(self.ended)
            pod = job.get("kernel_pod") or {}
            waiting = str(pod.get("message") or "")
            if pod.get("reason") == CRASH_LOOP and pod.get("last_exit_code"):
                # It failed at start and failed again when the kubelet restarted it: a kernel that cannot start
                # (a kernel asked to end, by a restart, exits 0: its kubelet may back off, and this waits).
                raise RuntimeError(f"its container keeps exiting ({waiting})")
            if pod.get("ip") and pod.get("ready") and int(pod.get("restarts") or 0) > after_restarts:
                # A running container is not yet a kernel: one that fails at start (an image without ipykernel)
                # runs for a moment too, and is then restarted until the kubelet backs off (CrashLoopBackOff).
                if await self.answers(str(pod["ip"])):
                    self.ip, self.restarts = str(pod["ip"]), int(pod.get("restarts") or 0)
                    return pod
                waiting = "the kernel's container runs; waiting for the kernel to answer"
            if time.monotonic() > deadline:
                raise TimeoutError(waiting or "its pod did not start")
            if on_wait is not None and waiting and waiting != said:
                said = waiting
                on_wait(said)
            await asyncio.sleep(POLL_S)

    async def answers(self, ip: str, timeout_s: float = HEARTBEAT_S) -> bool:
        """Whether the kernel at ``ip`` answers on its heartbeat channel (a kernel echoes what it gets there)."""
        import zmq
        import zmq.asyncio

        sock = zmq.asyncio.Context.instance().socket(zmq.REQ)
        sock.linger = 0
        try:
            sock.connect(f"tcp://{ip}:{self.connection['hb_port']}")
            await sock.send(b"gpupool")
            if not await sock.poll(int(timeout_s * 1000)):
                return False
            await sock.recv()
            return True
        finally:
            sock.close()

    async def exited(self, client: Any) -> bool:
        """Whether the kernel process has ended since it was last seen listening (its container restarted, or
        the pod or share is gone)."""
        job = await self.refresh(client)
        pod = job.get("kernel_pod") or {}
        return bool(self.ended) or int(pod.get("restarts") or 0) > self.restarts or not pod.get("ready")

    def connection_info(self) -> dict[str, Any]:
        """What the Jupyter server connects with: the pod's address, the ports and key it was given."""
        info: dict[str, Any] = {k: v for k, v in self.connection.items() if k != "kernel_name"}
        info["key"] = str(self.connection["key"]).encode()
        info["ip"] = self.ip
        return info
