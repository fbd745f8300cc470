"""`gpupool serve`: its flags to :class:`gpupool.app.serve.ServeOptions` (imported only for that command)."""

from __future__ import annotations

import argparse
import os

from gpupool.cli.parser import UsageError


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


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the scheduler in this process until SIGINT/SIGTERM (:func:`gpupool.app.serve.serve`)."""
    from gpupool.app.serve import BadFlags, ServeOptions, configure_logging, serve

    configure_logging(args.log_level)
    if args.admin_token is not None:
        raise UsageError("--admin-token puts the token on the command line, where every user of this machine "
                         "can read it (/proc/PID/cmdline); use --admin-token-file FILE or $GPUPOOL_ADMIN_TOKEN")
    admin_token = _admin_token_from_file(args.admin_token_file) or os.environ.get("GPUPOOL_ADMIN_TOKEN") or None
    options = ServeOptions(
        state_dir=args.state_dir, config_file=args.config, simulate=args.simulate, host=args.host, port=args.port,
        hub=bool(args.hub), hub_api_url=args.hub_api_url, backend=args.backend, kubeconfig=args.kubeconfig,
        namespace=args.namespace, image=args.image, pod_namespaces=args.pod_namespaces, admin_token=admin_token,
        leader_elect=args.leader_elect, lease_name=args.lease_name)
    try:
        return serve(options)
    except BadFlags as e:
        raise UsageError(str(e)) from None
