"""The kernel provisioner that gives a kernel its GPU share before it starts.

``jupyter_client`` creates one provisioner per kernel from the kernelspec's
``kernel_provisioner`` stanza (``gpu_fraction`` comes from its ``config``).
Before launch it takes the kernel's share as a *build job* of the user's
project (``client_key`` = kernel id, so a restart gets the same share back),
waits for it to be granted, and launches the kernel with the job's GPU
environment plus what the kernel needs to reach the scheduler itself.
``cleanup(restart=False)`` gives the share back; a restart keeps it. A kernel
that ends without ``cleanup`` (Jupyter gave up restarting it, or it died with
no restart coming, or it failed to start) gives it back at once as well.
"""

from __future__ import annotations

import asyncio
import os
import time
from typing import Any, cast

from jupyter_client.connect import KernelConnectionInfo
from jupyter_client.provisioning import KernelProvisionerBase, LocalProvisioner
from tornado import web
from traitlets import Float, Unicode

from gpupool.wire.errors import Conflict, GpupoolError, NotFound, QuotaExceeded
from jupyter_gpupool import leases, starting
from jupyter_gpupool.connection import PoolConnection, connection_from_env, current
from jupyter_gpupool.kernel_pod import PodKernel, connection, free_ports, pod_env, pod_image, runs_kernel_pods
from jupyter_gpupool.kernel_pod_provisioner import KernelPodProcess
from jupyter_gpupool.kernel_share import (
    build_job_env,
    kernel_label,
    quota_message,
    share_request,
    with_kernel_pythonpath,
)

WATCH_INTERVAL_S = 1.0  # how often a GPU kernel's process is checked: a dead kernel's share returns this soon


class GpuShareUnavailable(web.HTTPError):
    """The kernel cannot get its GPU share; the message reaches the user as is.

    A ``tornado.web.HTTPError`` so that Jupyter's kernel and session handlers
    answer with this status and message instead of "Unhandled error".
    """

    def __init__(self, status: int, message: str) -> None:
        super().__init__(status, message.replace("%", " percent"), reason="GPU share unavailable")
        self.message = message

    def __str__(self) -> str:
        return self.message


def forget_failed_start(kernel_manager: Any, kernel_id: str) -> None:
    """Drop a kernel whose first start failed from its multi-kernel manager's pending starts.

    ``MultiKernelManager.start_kernel`` files every start under
    ``_pending_kernels`` and removes it only when the start succeeds, so a
    refused kernel stays there for good. ``shutdown_all`` (the server's stop)
    then shuts it down too, and jupyter_server's manager answers that id with
    ``HTTPError(404, "Kernel does not exist")``, which aborts the stop: the
    server stops serving but its process keeps running until a second signal.
    Every over-quota refusal is such a failed start, so the provisioner, which
    sees the failure first, removes the entry. A kernel the manager already
    lists (a failed restart, or a start with ``use_pending_kernels``, which
    jupyter_client itself cleans up) is left as it is.
    """
    multi = getattr(kernel_manager, "parent", None)
    pending = getattr(multi, "_pending_kernels", None)
    running = getattr(multi, "_kernels", None)
    if isinstance(pending, dict) and isinstance(running, dict) and kernel_id not in running:
        pending.pop(kernel_id, None)


def server_root(provisioner: Any) -> str | None:
    """The Jupyter server's root dir (the provisioner's kernel manager's parent knows it)."""
    root = getattr(getattr(provisioner.parent, "parent", None), "root_dir", None)
    return str(root) if root else None


class GPUPoolProvisioner(KernelPodProcess, LocalProvisioner):  # type: ignore[misc]
    """A local kernel that runs on a GPU share granted by the gpupool scheduler (or, where the scheduler runs
    kernels as pods, a kernel pod: :class:`~jupyter_gpupool.kernel_pod_provisioner.KernelPodProcess`)."""

    gpu_fraction = Float(0.25, config=True, help="GPU share of the kernel (below 1), or whole GPUs (1, 2...).")
    gpu_model = Unicode("", config=True, help="GPU model to ask for ('' = any).")
    project = Unicode("", config=True, help="Project charged for the share ('' = the server's project).")
    image = Unicode("", config=True, help="A kernel pod's image, where the scheduler runs kernels as pods "
                    "('' = the Jupyter server's own image, else the scheduler's default).")

    job: dict[str, Any] | None = None
    _watcher: asyncio.Task[None] | None = None
    _release: asyncio.Task[None] | None = None  # a give-back started from a restarter callback (kept referenced)

    def _connection(self) -> PoolConnection:
        conn = current() or connection_from_env()
        if conn is None:
            raise GpuShareUnavailable(
                503, "GPU kernels need the jupyter_gpupool server extension or GPUPOOL_URL to reach a scheduler."
            )
        return conn

    def _notebook_path(self, env: dict[str, str]) -> str:
        """The kernel's notebook relative to the server root (absolute if outside)."""
        path = env.get("JPY_SESSION_NAME", "")
        root = server_root(self)
        if path and root and os.path.isabs(path):
            try:
                rel = os.path.relpath(path, root)
                if not rel.startswith(".."):
                    return rel.replace(os.sep, "/")
            except ValueError:
                pass
        return path

    async def _take_share(self, conn: PoolConnection, notebook: str,
                          kernel_pod: dict[str, Any] | None = None) -> dict[str, Any]:
        client = await conn.client()
        project = self.project or conn.project
        spec: dict[str, Any] = {
            "project": project,
            "kind": "build",
            "name": kernel_label(notebook, str(self.kernel_id)),
            "labels": {"notebook": notebook, "kernel_id": str(self.kernel_id)},
            "client_key": f"kernel-{self.kernel_id}",
            **share_request(self.gpu_fraction),
        }
        if self.gpu_model:
            spec["gpu_model"] = self.gpu_model
        if kernel_pod is not None:
            spec["kernel_pod"] = kernel_pod
        try:
            job = await client.submit(spec)
        except GpupoolError as err:
            if isinstance(err, QuotaExceeded):  # (held_milli None: an older server; give every way out)
                raise GpuShareUnavailable(409, quota_message(err.message, err.held_milli != 0)) from err
            raise GpuShareUnavailable(err.status, f"No GPU share for this kernel: {err.message}") from err
        return await self._wait_granted(client, job, conn.settings.kernel_start_timeout, notebook)

    async def _wait_granted(self, client: Any, job: dict[str, Any], timeout: float, notebook: str) -> dict[str, Any]:
        """Wait for a queued share to be granted; give it back if it takes too long.

        Meanwhile :mod:`jupyter_gpupool.starting` says why, for the notebook's status bar.
        """
        deadline = time.monotonic() + timeout
        delay = 0.05
        if job["state"] == "queued":
            self.log.info("gpupool: kernel %s waits for a GPU share (%s s at most): %s", self.kernel_id,
                          f"{timeout:g}", job.get("reason") or "queued")
        while job["state"] == "queued" and time.monotonic() < deadline:
            starting.note(str(self.kernel_id), notebook, timeout, "share", job.get("reason") or "queued", job)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.5)
            job = await client.job(job["id"])
        if job["state"] == "running":
            return job
        if job["state"] == "queued":
            await self._cancel_quietly(client, job["id"])
            reason = job.get("reason") or "no GPU has a free share"
            raise GpuShareUnavailable(409, f"No GPU share for this kernel after {timeout:g} s: {reason}")
        raise GpuShareUnavailable(409, f"No GPU share for this kernel: {job.get('reason') or job['state']}")

    @staticmethod
    async def _cancel_quietly(client: Any, job_id: str) -> None:
        try:
            await client.cancel(job_id)
        except (NotFound, Conflict):
            pass

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        """Take (or keep, on restart) the kernel's share, then prepare the launch with its env.

        Where the scheduler runs kernels as pods, the share comes with the kernel's pod instead
        (:meth:`_pre_launch_pod`).
        """
        try:
            conn = self._connection()
            if not conn.is_embedded and await self._pods_here(conn):
                return await self._pre_launch_pod(conn, **kwargs)
            env_in = kwargs.get("env") or os.environ
            notebook = self._notebook_path(dict(env_in))
            job = await self._take_share(conn, notebook)
        except BaseException:
            await self._start_failed()
            raise
        finally:
            starting.done(str(self.kernel_id))
        self.job = job
        leases.hold(leases.Share(kernel_id=str(self.kernel_id), job_id=job["id"], path=notebook,
                                 lease_s=leases.lease_length(job)))
        try:
            kwargs = await super().pre_launch(**kwargs)
            simulated = conn.embedded.core.simulated if conn.embedded is not None else None
            own_pythonpath = kwargs["env"].get("PYTHONPATH", "")
            kwargs["env"].update(with_kernel_pythonpath(build_job_env(job, simulated), own_pythonpath))
            kwargs["env"].update(conn.kernel_env())
            kwargs["env"]["GPUPOOL_KERNEL_ID"] = str(self.kernel_id)
            root = server_root(self)
            if root:
                kwargs["env"]["GPUPOOL_SERVER_ROOT"] = root
        except BaseException:
            await self._start_failed(conn)
            raise
        return kwargs

    async def _pods_here(self, conn: PoolConnection) -> bool:
        """Whether this server's scheduler runs GPU kernels as pods (asked once)."""
        try:
            return await runs_kernel_pods(await conn.client(), conn.url)
        except GpupoolError as err:
            raise GpuShareUnavailable(err.status, f"No GPU share for this kernel: {err.message}") from err

    async def _pre_launch_pod(self, conn: PoolConnection, **kwargs: Any) -> dict[str, Any]:
        """The kernel-pod path: a share with a pod (or, on restart, the same one), then its address.

        A first start (or a restart after the pod was lost) submits the share with its ``kernel_pod``
        request; a restart finds the same share (its client_key) and waits for the pod's container to
        have restarted the kernel. Jupyter connects with the server's own key, to the pod's address.
        """
        km = self.parent
        kwargs.pop("extra_arguments", None)
        env_in = dict(kwargs.get("env") or os.environ)
        timeout = conn.settings.kernel_start_timeout
        deadline = time.monotonic() + timeout
        self._pod_starting = True
        try:
            client = await conn.client()
            if self.pod is None or self.pod.ended or self.job is None:
                ports = free_ports()  # (new ones for a new pod: the old one may still be ending)
                root = server_root(self)
                launch_env = {**env_in, "GPUPOOL_KERNEL_ID": str(self.kernel_id)}
                if root:
                    launch_env["GPUPOOL_SERVER_ROOT"] = root
                plain, secret = pod_env(launch_env, dict(self.kernel_spec.env or {}), conn.kernel_env())
                request: dict[str, Any] = {"argv": list(self.kernel_spec.argv), "env": plain, "secret_env": secret,
                           "connection": connection(km, ports), "image": pod_image(self.image),
                           "uid": os.getuid(), "gid": os.getgid(), "workdir": root or os.getcwd()}
                job = await self._take_share(conn, self._notebook_path(env_in), kernel_pod=request)
                self.pod, after = PodKernel(job["id"], request["connection"]), -1
                self.job = job
                leases.hold(leases.Share(kernel_id=str(self.kernel_id), job_id=job["id"],
                                         path=self._notebook_path(env_in), lease_s=leases.lease_length(job)))
            else:
                after = self.pod.restarts  # a restart: the same share and pod, a fresh kernel process
            await self.pod.wait_listening(client, deadline, after, lambda why: self._waits_for_pod(
                self._notebook_path(env_in), timeout, why))
        except TimeoutError as err:
            await self._start_failed(conn)
            raise GpuShareUnavailable(504, f"The kernel's pod did not start within {timeout:g} s: {err}") from err
        except RuntimeError as err:
            await self._start_failed(conn)
            raise GpuShareUnavailable(409, f"The kernel's pod ended before it started: {err}") from err
        except BaseException:
            await self._start_failed(conn)
            raise
        finally:
            self._pod_starting = False
            starting.done(str(self.kernel_id))
        if km is not None:
            km.kernel_spec.interrupt_mode = "message"  # no signal reaches a pod: interrupt_request on control
        self.connection_info = cast(KernelConnectionInfo, self.pod.connection_info())
        return await KernelProvisionerBase.pre_launch(self, cmd=list(self.kernel_spec.argv), **kwargs)

    def _waits_for_pod(self, notebook: str, timeout: float, why: str) -> None:
        """Say in the server's log and in the notebook's status bar why the kernel's pod is not up yet."""
        self.log.info("gpupool: kernel %s waits for its pod (%s s at most): %s", self.kernel_id, f"{timeout:g}", why)
        starting.note(str(self.kernel_id), notebook, timeout, "pod", why, self.job)

    async def launch_kernel(self, cmd: list[str], **kwargs: Any) -> Any:
        """Launch; a kernel that fails to launch gives its share back at once (not at lease expiry).

        A kernel pod is already running: its connection is the launch's result.
        """
        if self.pod is not None:
            return self.connection_info
        try:
            return await super().launch_kernel(cmd, **kwargs)
        except BaseException:
            await self._start_failed()
            raise

    async def post_launch(self, **kwargs: Any) -> None:
        """Watch the new kernel process so that a kernel dead for good gives its share back at once.

        Two ways a kernel ends without ``cleanup``: Jupyter's auto-restarter
        gives up on it (its "dead" callback: the server then merely drops the
        kernel from its map), or it dies where nothing will restart it (auto-
        restart off), which only a poll notices. Both used to leave the share
        to the lease, held for up to ``lease_seconds`` by a kernel gone.
        """
        await super().post_launch(**kwargs)
        km = self.parent
        if km is not None and hasattr(km, "add_restart_callback"):
            km.remove_restart_callback(self._given_up, "dead")  # the restarter outlives restarts: add once
            km.add_restart_callback(self._given_up, "dead")
        if self._watcher is None or self._watcher.done():
            self._watcher = asyncio.ensure_future(self._watch())

    def _given_up(self) -> None:
        """Jupyter's restarter gave up on the kernel ("restart failed"): it will not run again."""
        if self.job is not None:
            self.log.warning("gpupool: kernel %s is dead for good; its GPU share %s goes back to the pool",
                             self.kernel_id, self.job.get("id"))
            self._release = asyncio.ensure_future(self._give_back())

    async def _watch(self) -> None:
        """Poll the kernel process (or pod) while it holds a share (the restarter may be off, or slower)."""
        while self.job is not None and (self.process is not None or self.pod is not None):
            await asyncio.sleep(WATCH_INTERVAL_S)
            await self.poll()

    async def poll(self) -> int | None:
        """As LocalProvisioner's; a process found gone that nothing will restart gives its share back.

        Only an exited process counts: with no process at all (between the
        two halves of a restart) LocalProvisioner answers 0 too.
        """
        if self.pod is not None:
            status = await self._poll_pod(self.pod)
            exited = status is not None
        else:
            status = await super().poll()
            exited = status is not None and self.process is not None
        if exited and self.job is not None and self._dead_for_good():
            self.log.warning("gpupool: kernel %s exited (%s) and will not be restarted; its GPU share %s goes "
                             "back to the pool", self.kernel_id, status, self.job.get("id"))
            await self._give_back()
        return status

    def _dead_for_good(self) -> bool:
        """Whether a kernel whose process is gone stays gone (no shutdown or auto-restart under way).

        During a shutdown or restart the kernel manager says ``shutting_down``
        (and ``cleanup`` decides); with auto-restart on, a running restarter
        will either restart the kernel (it keeps its share) or give up, and
        then ``_given_up`` gives the share back. jupyter_client's restarters
        poll through a ``_pcallback`` that is None once stopped (given up, or
        stopped by hand); a restarter without one counts as stopped, so the
        worst case is a share given back and taken anew by the restart.
        """
        km = self.parent
        if km is None or getattr(km, "shutting_down", False):
            return False
        restarter = getattr(km, "_restarter", None)
        restarting = getattr(km, "autorestart", False) and getattr(restarter, "_pcallback", None) is not None
        return not restarting

    async def _start_failed(self, conn: PoolConnection | None = None) -> None:
        """The kernel did not start (refused share, failed launch, failed restart): leave nothing behind.

        Its share goes back, and a kernel that never ran is dropped from its
        manager's starts (see :func:`forget_failed_start`).
        """
        try:
            await self._give_back(conn)
        finally:
            forget_failed_start(self.parent, str(self.kernel_id))

    async def _give_back(self, conn: PoolConnection | None = None) -> None:
        share = leases.release(str(self.kernel_id))
        job_id = share.job_id if share else (self.job or {}).get("id")
        self.job = None
        if not job_id:
            return
        conn = conn or current() or connection_from_env()
        if conn is None or conn.closed:
            return  # the extension stopped and already gave every share back
        try:
            client = await conn.client()
            await self._cancel_quietly(client, job_id)
        except GpupoolError as err:
            self.log.warning("gpupool: could not release share %s: %s (its lease will expire)", job_id, err)

    async def cleanup(self, restart: bool = False) -> None:
        """Free ports etc.; on a real shutdown (not a restart) give the GPU share back."""
        await super().cleanup(restart=restart)
        if not restart:
            if self._watcher is not None:
                self._watcher.cancel()
                self._watcher = None
            if self.parent is not None and hasattr(self.parent, "remove_restart_callback"):
                self.parent.remove_restart_callback(self._given_up, "dead")
            await self._give_back()
            self.pod = None

    async def get_provisioner_info(self) -> dict[str, Any]:
        """Persist the share's job id with the kernel (for servers that restore kernels)."""
        info = await super().get_provisioner_info()
        info["gpupool_job_id"] = (self.job or {}).get("id")
        return info

    async def load_provisioner_info(self, provisioner_info: dict[str, Any]) -> None:
        """Restore the share's job id and resume renewing it."""
        await super().load_provisioner_info(provisioner_info)
        job_id = provisioner_info.get("gpupool_job_id")
        if job_id:
            self.job = {"id": job_id, "state": "running"}
            leases.hold(leases.Share(kernel_id=str(self.kernel_id), job_id=job_id))


GPU_FREE_PROVISIONER = "gpupool-gpu-free-provisioner"


class GpuFreeProvisioner(LocalProvisioner):  # type: ignore[misc]
    """The server's default for kernels that asked for no GPU: they see none.

    Without it a plain Python kernel on a GPU machine would see every GPU and
    could use memory the scheduler handed to someone else. A kernelspec that
    sets ``CUDA_VISIBLE_DEVICES`` itself keeps its value. The kernel still gets
    the scheduler's URL and the user's token, so ``%gpupool`` and the monitors
    work in it too.
    """

    def _finalize_env(self, env: dict[str, str]) -> None:
        super()._finalize_env(env)
        if "CUDA_VISIBLE_DEVICES" not in (self.kernel_spec.env or {}):
            env["CUDA_VISIBLE_DEVICES"] = ""
        conn = current()
        if conn is not None and conn.token:
            env.update(conn.kernel_env())
        root = server_root(self)
        if root:
            env["GPUPOOL_SERVER_ROOT"] = root


def make_plain_kernels_gpu_free(factory: Any) -> str:
    """Make :class:`GpuFreeProvisioner` the default provisioner of this server's kernel factory.

    The entry point is declared in pyproject; an install made before it was
    added lacks it, so it is registered here too when missing. A default other
    than jupyter_client's own was chosen on purpose and is kept. Returns the
    previous default (to restore at shutdown).
    """
    from importlib.metadata import EntryPoint

    previous = str(factory.default_provisioner_name)
    if previous not in ("local-provisioner", GPU_FREE_PROVISIONER):
        return previous  # someone chose another default on purpose: leave it

    if GPU_FREE_PROVISIONER not in factory.provisioners and not factory._check_availability(GPU_FREE_PROVISIONER):
        factory.provisioners[GPU_FREE_PROVISIONER] = EntryPoint(
            name=GPU_FREE_PROVISIONER,
            value="jupyter_gpupool.provisioner:GpuFreeProvisioner",
            group="jupyter_client.kernel_provisioners",
        )
    factory.default_provisioner_name = GPU_FREE_PROVISIONER
    return previous
