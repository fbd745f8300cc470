"""The Jupyter server extension: settings (``c.GPUPool``), wiring and background work.

At load it registers the scheduler connection (for the provisioner and the
handlers), writes the GPU kernelspecs and puts them on the server's kernelspec
path, and adds the /gpupool/api handlers. Once the loop runs it connects to
the scheduler (starting the embedded one when no URL is set) and keeps two
periodic tasks: renewing the GPU-share leases of live kernels, and shutting
down GPU kernels whose share is idle so it goes back to the pool: by use (the
scheduler flags a share its project's idle rule counts idle; the kernel is
told, then shut down unless a cell runs: jupyter_gpupool.idle_cull), and,
when ``idle_timeout`` is set, by Jupyter activity as before.
"""

from __future__ import annotations

import asyncio
import datetime
import os
import signal
import threading
from typing import Any

from jupyter_core.paths import jupyter_data_dir
from jupyter_server.extension.application import ExtensionApp
from traitlets import Bool, Dict, Float, List, Unicode, default, validate

from jupyter_gpupool import connection as connection_mod
from jupyter_gpupool import leases
from jupyter_gpupool.cli_path import put_cli_on_path
from jupyter_gpupool.connection import PoolConnection, PoolSettings
from jupyter_gpupool.handlers import handlers as gpupool_handlers
from jupyter_gpupool.hub import shared_scheduler_token, shared_scheduler_url
from jupyter_gpupool.idle_cull import IdleCuller
from jupyter_gpupool.kernel_share import share_request
from jupyter_gpupool.kernelspecs import register_kernel_dir, write_kernelspecs
from jupyter_gpupool.provisioner import make_plain_kernels_gpu_free
from jupyter_gpupool.sessions import session_handlers


def stop_cleanly_on_sigint(serverapp: Any, log: Any) -> bool:
    """Make SIGINT stop the server as SIGTERM does (shutdown hooks, extensions, kernels); True if it now does.

    Why: JupyterHub stops a server (Stop My Server, the idle culler, deleting a
    user) with SIGINT. Jupyter Server only handles SIGINT when its stdin is a
    terminal (to ask "Shut down this server?"); a Hub started by systemd gives
    it none, so SIGINT stays Python's KeyboardInterrupt, which ends the event
    loop at once: no extension's stop runs, kernel shares are not given back
    and stay held until their lease runs out (two minutes by default).

    Only done where the server installed its own stop signals (its SIGTERM
    handler is there) and left SIGINT to Python: an interactive server keeps
    its confirmation prompt, and a server run inside another program (tests,
    embedding) keeps that program's signal handling.
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    server_stop = getattr(serverapp, "_signal_stop", None)
    if server_stop is None or signal.getsignal(signal.SIGTERM) != server_stop:
        return False
    current = signal.getsignal(signal.SIGINT)
    if current == server_stop:
        return True  # JupyterHub's single-user server with a terminal already does this
    if current is not signal.default_int_handler:
        return False  # the interactive prompt, or someone else's handler
    signal.signal(signal.SIGINT, server_stop)
    log.debug("gpupool: SIGINT stops this server cleanly (as SIGTERM), giving GPU shares back")
    return True


class GPUPool(ExtensionApp):
    """GPU-share kernels, a fair training queue and promote-to-training for Jupyter."""

    name = "jupyter_gpupool"
    load_other_extensions = True

    scheduler_url = Unicode(
        config=True,
        help="URL of a shared gpupool scheduler (default: $GPUPOOL_URL, which a JupyterHub sets for the servers "
        "it spawns). Empty: run an embedded scheduler in this server.",
    )
    scheduler_token = Unicode(
        config=True,
        help="This user's token for the shared scheduler (unused with the embedded one). Default: "
        "$GPUPOOL_TOKEN, else, in a server JupyterHub spawned, its $JUPYTERHUB_API_TOKEN: the user's own.",
    )
    project = Unicode("", config=True, help="Project charged for kernels and promoted jobs ('' = the one the "
                      "scheduler names for this user, e.g. their first JupyterHub group's, else the user name).")
    kernel_fractions = List(
        Float(),
        default_value=[0.25, 0.5, 1.0],
        config=True,
        help="GPU shares offered as kernels in the Launcher: fractions below 1, whole GPUs from 1.",
    )
    base_kernel = Unicode("python3", config=True, help="Kernelspec the GPU kernels are made from.")
    gpu_free_default = Bool(
        True,
        config=True,
        help="Kernels that ask for no GPU (plain Python...) run with CUDA_VISIBLE_DEVICES='' so they see none.",
    )
    lease_seconds = Float(
        120.0,
        config=True,
        help="Lease of a kernel's GPU share: a kernel the server stops renewing loses its share after this long.",
    )
    renew_interval = Float(
        0.0, config=True, help="Seconds between lease renewals (0 = a third of lease_seconds)."
    )
    cull_idle_by_use = Bool(
        True,
        config=True,
        help="Shut down GPU kernels whose share the scheduler flags idle by use (their project's idle rule, "
        "action cull: e.g. below 5 % of the share for 30 min), after a notice in the kernel and in Lab, and "
        "never while a cell runs; their shares go back to the pool.",
    )
    idle_notice = Float(
        120.0, config=True, help="Seconds between the idle notice and the shutdown of a GPU kernel idle by use."
    )
    idle_check_interval = Float(
        15.0, config=True, help="Seconds between two reads of the scheduler's idle flags of this server's kernels."
    )
    idle_timeout = Float(
        0.0,
        config=True,
        help="Also shut down GPU kernels idle by Jupyter activity (no execution, no connection activity) this "
        "many seconds, whatever their GPU use; 0 = never (the default: cull_idle_by_use decides).",
    )
    idle_grace = Float(
        300.0, config=True, help="idle_timeout never shuts a GPU kernel down in its first idle_grace seconds."
    )
    stop_kernels_without_share = Bool(
        True,
        config=True,
        help="Shut down a GPU kernel whose share ended under it (cancelled from a queue view, or its lease "
        "ran out while the server was suspended): it would otherwise keep using a GPU given to someone else.",
    )
    kernel_start_timeout = Float(
        30.0, config=True, help="How long a GPU kernel waits for a queued share before it fails to start."
    )
    simulate = Unicode(
        "",
        config=True,
        help="Embedded scheduler: GPUs to simulate, e.g. '4xA100-80GB' ('' = real GPUs via NVML, "
        "or 4xA100-80GB when there are none).",
    )
    state_dir = Unicode(config=True, help="Embedded scheduler state (default: <Jupyter data dir>/gpupool).")
    build_quota = Float(1.0, config=True, help="Embedded scheduler: the project's build (kernel) quota in GPUs.")
    train_guarantee = Float(
        -1.0, config=True, help="Embedded scheduler: the project's training guarantee in GPUs (-1 = all GPUs)."
    )
    projects = Dict(
        config=True,
        help="Embedded scheduler: projects created at first start, {name: {build_quota, train_guarantee, "
        "train_limit, weight}} in GPUs (and members, idle: docs/policy.md). Projects that exist keep their "
        "settings (an admin changes them later).",
    )
    scheduler_config = Dict(
        config=True, help="Embedded scheduler: other service settings (gpupool.service.config.ServiceConfig)."
    )

    @default("state_dir")
    def _default_state_dir(self) -> str:
        return os.path.join(jupyter_data_dir(), "gpupool")

    @default("scheduler_url")
    def _default_scheduler_url(self) -> str:
        return shared_scheduler_url(os.environ)

    @default("scheduler_token")
    def _default_scheduler_token(self) -> str:
        return shared_scheduler_token(os.environ)

    @validate("kernel_fractions")
    def _check_fractions(self, proposal: dict[str, Any]) -> list[float]:
        for fraction in proposal["value"]:
            share_request(fraction)
        return list(proposal["value"])

    connection: PoolConnection | None = None
    _previous_provisioner: str | None = None
    _stopping: asyncio.Future[None] | None = None
    _tasks: list[asyncio.Task[Any]]
    idle_culler: IdleCuller | None = None

    def pool_settings(self) -> PoolSettings:
        """The connection's settings from the traits."""
        extra: dict[str, Any] = {}
        if not self.scheduler_url:
            config = {"lease_s": self.lease_seconds, **self.scheduler_config}
            extra["config"] = config
            if self.projects:
                extra["projects"] = {name: dict(fields) for name, fields in self.projects.items()}
        return PoolSettings(
            scheduler_url=self.scheduler_url,
            scheduler_token=self.scheduler_token,
            project=self.project,
            state_dir=self.state_dir,
            simulate=self.simulate,
            build_quota=self.build_quota,
            train_guarantee=None if self.train_guarantee < 0 else self.train_guarantee,
            lease_seconds=self.lease_seconds,
            kernel_start_timeout=self.kernel_start_timeout,
            extra=extra,
        )

    def initialize_settings(self) -> None:
        """Register the connection and install the GPU kernelspecs."""
        self._tasks = []
        self.idle_culler = None
        put_cli_on_path()  # kernels and terminals inherit it: `!gpupool status` works in a notebook
        self.connection = PoolConnection(self.pool_settings())
        self.connection.on_ready = self.start_background
        self.connection.log = self.log
        connection_mod.set_current(self.connection)
        self.settings["gpupool_connection"] = self.connection
        self.settings["gpupool_app"] = self
        ksm = self.serverapp.kernel_spec_manager
        kernels_dir = os.path.join(self.state_dir, "kernels")
        names = write_kernelspecs(kernels_dir, list(self.kernel_fractions), ksm, base=self.base_kernel)
        register_kernel_dir(ksm, kernels_dir)
        if self.gpu_free_default:
            from jupyter_client.provisioning import KernelProvisionerFactory

            self._previous_provisioner = make_plain_kernels_gpu_free(KernelProvisionerFactory.instance())
        self.log.info("gpupool: GPU kernels %s from %s", ", ".join(names), kernels_dir)

    def initialize_handlers(self) -> None:
        """The /gpupool/api handlers, and POST /api/sessions keeping a GPU-share refusal's 409 (see sessions.py)."""
        self.handlers.extend(gpupool_handlers("/"))
        self.handlers.extend(session_handlers())

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        """Connect to the scheduler now (not at the first request) and start the periodic tasks."""
        stop_cleanly_on_sigint(serverapp, self.log)
        self.start_background()
        try:
            assert self.connection is not None
            await self.connection.client()
        except Exception as err:  # the UI reports it; the server must still start
            self.log.error("gpupool: scheduler not available: %s", err)
            return
        embedded = self.connection.embedded
        if embedded is not None and embedded.simulate:  # no NVML GPU here, or c.GPUPool.simulate asked for them
            self.log.warning("gpupool: the GPUs are SIMULATED (%s): kernels and jobs get no real GPU",
                             embedded.simulate)

    def start_background(self) -> None:
        """Start lease renewal and idle culling in the running loop (idempotent)."""
        if self._tasks:
            return
        self._tasks.append(asyncio.ensure_future(self._renew_loop()))
        if self.idle_timeout > 0:
            self._tasks.append(asyncio.ensure_future(self._idle_loop()))
        if self.cull_idle_by_use and self.connection is not None:
            self.idle_culler = IdleCuller(self.connection, self.serverapp.kernel_manager, self.idle_notice, self.log)
            self._tasks.append(asyncio.ensure_future(self._idle_use_loop()))

    @property
    def renew_every(self) -> float:
        """Seconds between renewals: as configured, but never more than a third of the lease the
        scheduler actually grants (a shared scheduler may have a shorter lease than ours)."""
        every = self.renew_interval or self.lease_seconds / 3.0
        granted = leases.shortest_lease()
        if granted:
            every = min(every, granted / 3.0)
        return max(every, 0.05)

    async def renew_once(self) -> leases.Renewal:
        """One round of lease renewal (what the periodic task runs); stops kernels whose share ended."""
        if not leases.held() or self.connection is None:
            return leases.Renewal()
        client = await self.connection.client()
        mkm = self.serverapp.kernel_manager
        result = await leases.renew_live_shares(client, mkm)
        for share, why in result.lost:
            if not self.stop_kernels_without_share or share.kernel_id not in mkm:
                self.log.warning("gpupool: kernel %s lost its GPU share (%s)", share.kernel_id, why)
                continue
            self.log.warning("gpupool: kernel %s lost its GPU share (%s); shutting it down so it stops using "
                             "a GPU that may now be someone else's", share.kernel_id, why)
            await mkm.shutdown_kernel(share.kernel_id)
        return result

    async def _renew_loop(self) -> None:
        while True:
            await asyncio.sleep(self.renew_every)
            try:
                await self.renew_once()
            except Exception as err:
                self.log.warning("gpupool: lease renewal failed: %s", err)

    async def cull_idle_once(self) -> list[str]:
        """Shut down GPU kernels idle longer than idle_timeout (past their grace); returns their ids."""
        mkm = self.serverapp.kernel_manager
        now = datetime.datetime.now(datetime.timezone.utc)
        culled = []
        for kernel_id in list(leases.held()):
            if kernel_id not in mkm:
                continue
            km = mkm.get_kernel(kernel_id)
            started = getattr(km, "_gpupool_started", None)
            if started is None:
                km._gpupool_started = now
                continue
            if getattr(km, "execution_state", "") == "busy":
                continue
            last = getattr(km, "last_activity", None) or started
            idle = (now - last).total_seconds()
            age = (now - started).total_seconds()
            if idle >= self.idle_timeout and age >= self.idle_grace:
                self.log.info("gpupool: shutting down kernel %s, idle %.0f s, to free its GPU share", kernel_id, idle)
                await mkm.shutdown_kernel(kernel_id)
                culled.append(kernel_id)
        return culled

    async def _idle_loop(self) -> None:
        while True:
            await asyncio.sleep(max(min(self.idle_timeout / 4.0, 60.0), 0.5))
            try:
                await self.cull_idle_once()
            except Exception as err:
                self.log.warning("gpupool: idle culling failed: %s", err)

    async def cull_idle_by_use_once(self) -> list[str]:
        """One look at the scheduler's idle flags: notices given, kernels shut down (their ids returned)."""
        if self.idle_culler is None:
            return []
        return await self.idle_culler.check()

    async def _idle_use_loop(self) -> None:
        while True:
            await asyncio.sleep(max(self.idle_check_interval, 0.1))
            try:
                await self.cull_idle_by_use_once()
            except Exception as err:
                self.log.warning("gpupool: culling idle kernels by use failed: %s", err)

    async def release_all_shares(self) -> None:
        """Give back every kernel share: the server stops, its kernels go with it.

        The server stops extensions *before* kernels; done here, while the
        scheduler (embedded or not) is still reachable.
        """
        if self.connection is None or not self.connection.ready:
            return
        client = await self.connection.client()
        for share in list(leases.held().values()):
            leases.release(share.kernel_id)
            try:
                await client.cancel(share.job_id)
            except Exception as err:
                self.log.warning("gpupool: share %s not released at shutdown: %s", share.job_id, err)

    async def stop_extension(self) -> None:
        """Stop the tasks, give the shares back, stop the embedded scheduler (jobs pause, resume next start).

        Safe to call twice at once (a second stop signal during shutdown):
        both calls wait for the same single stop.
        """
        if self._stopping is None:
            self._stopping = asyncio.ensure_future(self._stop())
        await asyncio.shield(self._stopping)

    async def _stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            try:
                await task
            except (asyncio.CancelledError, Exception):
                pass
        self._tasks = []
        if self._previous_provisioner is not None:
            from jupyter_client.provisioning import KernelProvisionerFactory

            KernelProvisionerFactory.instance().default_provisioner_name = self._previous_provisioner
            self._previous_provisioner = None
        if self.connection is not None:
            await self.release_all_shares()
            await self.connection.close()
            if connection_mod.current() is self.connection:
                connection_mod.set_current(None)
