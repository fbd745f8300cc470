"""`gpupool serve`: run the scheduler service in this process (imported only for that command)."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from gpupool.cli.parser import UsageError


def _jobs_run_as(core: Any) -> str:
    """The banner's line on which account runs jobs, and what that means for a shared service."""
    if core.owner_jobs:
        return "jobs run as: their owners' Unix accounts (docs/service.md, Isolation)"
    import pwd

    me = pwd.getpwuid(os.geteuid()).pw_name
    return (f"jobs run as: {me}, this service's own account: every token holder's jobs can read its state "
            "directory; trust them all, or run the service as root to run each job as its owner "
            "(docs/service.md, Isolation)")


def _admin_token_from_file(path: str | None) -> str | None:
    """The admin token in ``path`` (first line), with a clear error for a missing, empty or open file."""
    if path is None:
        return None
    try:
        with open(path) as f:
            token = f.readline().strip()
        mode = os.stat(path).st_mode
    except OSError as e:
        raise UsageError(f"cannot read the admin token file {path}: {e.strerror}") from None
    if not token:
        raise UsageError(f"the admin token file {path} is empty")
    if mode & 0o077:
        raise UsageError(f"the admin token file {path} may be read by others (mode {mode & 0o777:04o}); "
                         f"chmod 600 {path}")
    return token


def _backend_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The serve flags that choose the backend, as ServiceConfig fields (only those given: the config file's stay)."""
    out: dict[str, Any] = {}
    if args.backend:
        out["backend"] = args.backend
    for flag in ("kubeconfig", "namespace", "image"):
        if getattr(args, flag):
            out[flag] = getattr(args, flag)
    if args.pod_namespaces:
        from gpupool.backends.kubernetes.pod_namespaces import SETTING, parse_flag
        from gpupool.wire.errors import InvalidRequest

        try:
            out[SETTING] = parse_flag(args.pod_namespaces)
        except InvalidRequest as e:
            raise UsageError(str(e)) from None
    return out


def _check_backend(args: argparse.Namespace, settings: dict[str, Any]) -> None:
    """Flags of one backend with the other chosen (by flag or config file) are a usage error, not ignored."""
    kube = settings.get("backend") == "kubernetes"
    if not kube and any(getattr(args, flag) for flag in ("kubeconfig", "namespace", "image", "pod_namespaces")):
        raise UsageError("--kubeconfig, --namespace, --image and --pod-namespaces go with --backend kubernetes")
    if kube and args.simulate:
        raise UsageError("--simulate is for the local backend; a cluster's GPUs are its nodes'")


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the scheduler in this process until SIGINT/SIGTERM."""
    import asyncio
    import logging
    import signal

    from gpupool.app.embedded import EmbeddedScheduler
    from gpupool.service.config import ServiceConfig, default_state_dir

    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings: dict[str, Any] = {"on_shutdown": "leave"}  # a restart re-adopts running jobs
    if args.config:
        from_file = ServiceConfig.from_file(args.config)  # validates, with a clear message
        with open(args.config) as f:
            given = json.load(f)
        settings.update({k: v for k, v in given.items() if k != "state_dir"})
        if args.state_dir is None and "state_dir" in given:
            args.state_dir = str(from_file.state_dir)
    if args.hub or args.hub_api_url:
        settings["hub"] = True
    if args.hub_api_url:
        settings["hub_api_url"] = args.hub_api_url
    if args.admin_token is not None:
        raise UsageError("--admin-token puts the token on the command line, where every user of this machine "
                         "can read it (/proc/PID/cmdline); use --admin-token-file FILE or $GPUPOOL_ADMIN_TOKEN")
    settings.update(_backend_settings(args))
    _check_backend(args, settings)
    state_dir = args.state_dir or str(default_state_dir())
    from gpupool.service.hardening import make_undumpable

    make_undumpable()  # our environment (a token in it) and memory: not readable by jobs of our own user
    admin_token = _admin_token_from_file(args.admin_token_file) or os.environ.get("GPUPOOL_ADMIN_TOKEN") or None
    scheduler = EmbeddedScheduler(state_dir, simulate=args.simulate, admin_token=admin_token,
                                  host=args.host, port=args.port, config=settings)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await scheduler.start()
        tasks: list[asyncio.Future[None]] = []  # the Hub group sync, when on
        try:
            simulated = " with SIMULATED GPUs" if getattr(scheduler.core, "simulated", False) else ""
            where = ("as given (--admin-token-file / $GPUPOOL_ADMIN_TOKEN)" if admin_token
                     else f"in {scheduler.admin_token_path}")
            print(f"gpupool scheduler listening on {scheduler.url}{simulated}", flush=True)
            print(f"state directory: {scheduler.state_dir}", flush=True)
            if args.host not in ("127.0.0.1", "localhost", "::1"):
                print(f"warning: listening on {args.host} over plain HTTP: tokens cross the network "
                      "unencrypted; put a TLS proxy in front", flush=True)
            print(_jobs_run_as(scheduler.core), flush=True)
            hub = getattr(scheduler.core, "hub", None)
            if hub is not None:
                print(f"JupyterHub users' tokens accepted (checked with {hub.auth.api_url}, cached "
                      f"{scheduler.core.config.hub_cache_s:g} s)", flush=True)
                from gpupool.service.hub_sync import sync_groups_forever

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

    asyncio.run(run())
    return 0
