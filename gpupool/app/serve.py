"""Run a scheduler as its own process (`gpupool serve`): settings from flags and a file, hardening, banner, signals.

Why in the app, not the CLI: turning a config file and flags into the
service's settings, choosing the backend's settings, hiding the process from
its own jobs and starting the Hub's group sync are wiring, which the design
puts in one place (:mod:`gpupool.app`); the CLI only reads the command line
and says what went wrong (tests/test_import_contract.py keeps it that way).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
from dataclasses import dataclass
from typing import Any

from gpupool.app import embedded  # looked up at each serve (tests put a recording one in its place)
from gpupool.backends.kubernetes.pod_namespaces import SETTING as POD_NAMESPACES
from gpupool.backends.kubernetes.pod_namespaces import parse_flag
from gpupool.service.config import ServiceConfig, default_state_dir
from gpupool.service.hardening import make_undumpable
from gpupool.service.hub_sync import sync_groups_forever
from gpupool.wire.errors import InvalidRequest

_KUBE_FLAGS = ("kubeconfig", "namespace", "image", "pod_namespaces", "leader_elect", "lease_name")
LOST_LEADERSHIP_EXIT = 3
"""`gpupool serve`'s exit status when it lost the Lease it led with (Kubernetes restarts it, as a standby)."""
EXIT_AFTER_LOSS_S = 20.0
"""A stop after a lost Lease that takes longer than this ends the process at once (its writes are fenced anyway)."""


class BadFlags(ValueError):
    """The flags contradict each other or the config file: the CLI's usage error (exit 2), not the service's."""


@dataclass
class ServeOptions:
    """What `gpupool serve` was given; None: not given (the config file's value, else the default, stays)."""

    state_dir: str | None = None
    config_file: str | None = None
    simulate: str | None = None
    host: str = "127.0.0.1"
    port: int = 0
    hub: bool = False
    hub_api_url: str | None = None
    backend: str | None = None
    kubeconfig: str | None = None
    namespace: str | None = None
    image: str | None = None
    pod_namespaces: str | None = None
    leader_elect: bool | None = None
    lease_name: str | None = None
    admin_token: str | None = None  # read from a file or $GPUPOOL_ADMIN_TOKEN by the caller, never a flag


def service_settings(options: ServeOptions) -> tuple[dict[str, Any], str]:
    """The service's settings and state directory; ``InvalidRequest`` for a bad file, ``BadFlags`` for bad flags."""
    settings: dict[str, Any] = {"on_shutdown": "leave"}  # a restart re-adopts running jobs
    state_dir = options.state_dir
    if options.config_file:
        from_file = ServiceConfig.from_file(options.config_file)  # validates, with a clear message
        with open(options.config_file) as f:
            given = json.load(f)
        settings.update({k: v for k, v in given.items() if k != "state_dir"})
        if state_dir is None and "state_dir" in given:
            state_dir = str(from_file.state_dir)
    if options.hub or options.hub_api_url:
        settings["hub"] = True
    if options.hub_api_url:
        settings["hub_api_url"] = options.hub_api_url
    if options.backend:
        settings["backend"] = options.backend
    for flag in ("kubeconfig", "namespace", "image"):
        if getattr(options, flag):
            settings[flag] = getattr(options, flag)
    if options.pod_namespaces:
        try:
            settings[POD_NAMESPACES] = parse_flag(options.pod_namespaces)
        except InvalidRequest as e:
            raise BadFlags(str(e)) from None
    if options.leader_elect is not None:
        settings["kube_leader_election"] = options.leader_elect
    if options.lease_name:
        settings["kube_lease_name"] = options.lease_name
    kube = settings.get("backend") == "kubernetes"
    if not kube and any(getattr(options, flag) not in (None, "") for flag in _KUBE_FLAGS):
        raise BadFlags("--kubeconfig, --namespace, --image, --pod-namespaces, --leader-elect and --lease-name go "
                       "with --backend kubernetes")
    if kube and options.simulate:
        raise BadFlags("--simulate is for the local backend; a cluster's GPUs are its nodes'")
    return settings, state_dir or str(default_state_dir())


def _jobs_run_as(core: Any) -> str:
    """The banner's line on which account runs jobs, and what that means for a shared service."""
    if core.owner_jobs:
        return "jobs run as: their owners' Unix accounts (docs/service.md, Isolation)"
    import pwd

    me = pwd.getpwuid(os.geteuid()).pw_name
    return (f"jobs run as: {me}, this service's own account: every token holder's jobs can read its state "
            "directory; trust them all, or run the service as root to run each job as its owner "
            "(docs/service.md, Isolation)")


def serve(options: ServeOptions) -> int:
    """Run the scheduler in this process until SIGINT/SIGTERM; raises as :func:`service_settings` before starting."""
    settings, state_dir = service_settings(options)
    make_undumpable()  # our environment (a token in it) and memory: not readable by jobs of our own user
    admin_token = options.admin_token
    stop = asyncio.Event()

    def standby(lease: dict[str, Any]) -> None:
        print(f"gpupool scheduler standby on {scheduler.url}: waiting for the lease {lease['lease']} "
              f"(held by {lease.get('leader') or 'nobody yet'}); this instance is {lease['identity']}", flush=True)

    def lost(why: str) -> None:
        print(f"gpupool scheduler lost the leadership ({why}); no more writes to the cluster; exiting",
              flush=True)
        _exit_if_stuck(EXIT_AFTER_LOSS_S)
        stop.set()

    scheduler = embedded.EmbeddedScheduler(state_dir, simulate=options.simulate, admin_token=admin_token,
                                           host=options.host, port=options.port, config=settings,
                                           on_standby=standby, on_lost_leadership=lost)

    async def run() -> int:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        if not await _started_unless_stopped(scheduler, stop):
            print("gpupool scheduler stopped before it led", flush=True)
            return 0
        tasks: list[asyncio.Future[None]] = []  # the Hub group sync, when on
        try:
            simulated = " with SIMULATED GPUs" if getattr(scheduler.core, "simulated", False) else ""
            where = ("as given (--admin-token-file / $GPUPOOL_ADMIN_TOKEN)" if admin_token
                     else f"in {scheduler.admin_token_path}")
            print(f"gpupool scheduler listening on {scheduler.url}{simulated}", flush=True)
            print(f"state directory: {scheduler.state_dir}", flush=True)
            if options.host not in ("127.0.0.1", "localhost", "::1"):
                print(f"warning: listening on {options.host} over plain HTTP: tokens cross the network "
                      "unencrypted; put a TLS proxy in front", flush=True)
            print(_jobs_run_as(scheduler.core), flush=True)
            hub = getattr(scheduler.core, "hub", None)
            if hub is not None:
                print(f"JupyterHub users' tokens accepted (checked with {hub.auth.api_url}, cached "
                      f"{scheduler.core.config.hub_cache_s:g} s)", flush=True)
                tasks.append(asyncio.ensure_future(sync_groups_forever(hub, scheduler.core.config.hub_sync_s)))
            print(f"admin token: {where}", flush=True)
            print(f"  export GPUPOOL_URL={scheduler.url}", flush=True)
            if not admin_token:
                print(f"  export GPUPOOL_TOKEN=$(cat {scheduler.admin_token_path})", flush=True)
            if scheduler.runtime_path:
                print(f"gpupool commands run here by this user find it with no flags "
                      f"(runtime file {scheduler.runtime_path})", flush=True)
            await stop.wait()
            print("gpupool scheduler stopping", flush=True)
        finally:
            for task in tasks:
                task.cancel()
            await scheduler.stop()
        return LOST_LEADERSHIP_EXIT if scheduler.lost_leadership else 0

    return asyncio.run(run())


async def _started_unless_stopped(scheduler: embedded.EmbeddedScheduler, stop: asyncio.Event) -> bool:
    """``scheduler.start()``, unless SIGTERM comes first (a standby waiting for the Lease): False then."""
    start = asyncio.ensure_future(scheduler.start())
    stopped = asyncio.ensure_future(stop.wait())
    await asyncio.wait([start, stopped], return_when=asyncio.FIRST_COMPLETED)
    stopped.cancel()
    if start.done():
        start.result()  # raises what start raised
        return True
    start.cancel()
    try:
        await start
    except asyncio.CancelledError:
        pass
    return False


def _exit_if_stuck(after_s: float) -> None:
    """End the process ``after_s`` from now if it has not ended by then (a daemon timer).

    A lost Lease must end this instance: its writes are fenced, but a stop
    that hangs (an HTTP client, a slow API call) would keep it up, holding the
    state directory that the new leader waits for.
    """
    import threading

    def end() -> None:
        logging.getLogger("gpupool.serve").error("still stopping %.0f s after the Lease was lost: exiting now",
                                                 after_s)
        os._exit(LOST_LEADERSHIP_EXIT)

    timer = threading.Timer(after_s, end)
    timer.daemon = True
    timer.start()


def configure_logging(level: str) -> None:
    """One line per record, with the logger's name (``gpupool.service``, ``gpupool.api``...)."""
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
