"""Leader election as the app wires it: wait for the Lease before the core exists, then start it fenced.

Why here: leader election is a capability of the Kubernetes backend
(gpupool/backends/kubernetes/leader.py), but what a standby does is the
app's business. A standby must not open the store: on Kubernetes the leader's
SQLite database sits on a volume both instances may mount, and the state-dir
lock is only the second line of defence. So the core (store, backend, HTTP
API) is built only once this instance holds the Lease. Meanwhile the HTTP
port answers as a standby (gpupool/api/standby.py), behind a :class:`Switch`
that hands the same listening socket to the real app at takeover.

The local backend has none of this: one machine, one state directory, its lock.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tornado import httputil

from gpupool.service.config import ServiceConfig
from gpupool.wire.errors import Unavailable

log = logging.getLogger("gpupool.leading")

FIRST_ROUND_S = 1.0
"""How long the first try for the Lease may take before this instance says it is a standby."""
LOCK_RETRY_S = 0.5
"""A new leader whose state directory is still locked (the old leader stopping) tries again this often."""


class Switch(httputil.HTTPServerConnectionDelegate):
    """The HTTP server's request handler, switchable: the standby app first, the real app once leading."""

    def __init__(self, target: httputil.HTTPServerConnectionDelegate) -> None:
        self.target = target

    def start_request(self, server_conn: object,
                      request_conn: httputil.HTTPConnection) -> httputil.HTTPMessageDelegate:
        return self.target.start_request(server_conn, request_conn)

    def on_close(self, server_conn: object) -> None:
        self.target.on_close(server_conn)


def wants_election(cfg: ServiceConfig) -> bool:
    """Leader election is on for the Kubernetes backend unless ``kube_leader_election`` is off."""
    return cfg.backend == "kubernetes" and bool(cfg.kube_leader_election)


class Election:
    """The Lease for one scheduler: its elector thread, its :class:`Leadership`, the waits the app needs."""

    def __init__(self, cfg: ServiceConfig, on_lost: Callable[[str], None]) -> None:
        from gpupool.backends.kubernetes.connect import api_client  # the kubernetes client loads only here
        from gpupool.backends.kubernetes.leader import LeaderElector, Leadership, LeaseSettings

        settings = LeaseSettings(namespace=cfg.kube_lease_namespace or cfg.namespace, name=cfg.kube_lease_name,
                                 identity=cfg.kube_leader_identity or "", duration_s=cfg.kube_lease_duration_s,
                                 renew_deadline_s=cfg.kube_renew_deadline_s, retry_period_s=cfg.kube_retry_period_s)
        self.leadership = Leadership(settings, on_lost)
        self.elector = LeaderElector(self.leadership, api_client(cfg.kubeconfig, pool_size=2))
        self.settings = settings

    def start(self) -> None:
        self.elector.start()

    def leading(self) -> bool:
        return self.leadership.may_write()

    async def wait_to_lead(self, timeout_s: float | None = None) -> bool:
        """Wait (polling, the loop free) until this instance leads; False when ``timeout_s`` passed first."""
        loop = asyncio.get_running_loop()
        deadline = None if timeout_s is None else loop.time() + timeout_s
        while not self.leadership.acquired.is_set():
            if self.leadership.lost.is_set():
                return False
            if deadline is not None and loop.time() >= deadline:
                return False
            await asyncio.sleep(0.05)
        return True

    def describe(self) -> dict[str, Any]:
        return self.leadership.describe()

    def stop(self, release: bool = True) -> None:
        """Stop renewing; with ``release`` (a clean stop, the core already stopped) hand the Lease back."""
        self.elector.stop(release=release)


async def build_core_when_free(build: Callable[[], Any], election: Election, state_dir: Path) -> Any:
    """``build()`` (the core), retried while the state directory is still locked by the instance that led before.

    A new leader on a shared volume may get there while the old one is still
    stopping (it stops writing at once but may take a moment to exit); its
    lock is gone when its process is. Given up only when this instance no
    longer leads.
    """
    said = False
    while True:
        try:
            return build()
        except Unavailable as e:
            if not election.leading():
                raise
            if not said:
                log.warning("leading, but %s; waiting for it to stop", e)
                said = True
        await asyncio.sleep(LOCK_RETRY_S)


def admin_token_on_disk(state_dir: Path) -> str | None:
    """The admin token a leader generated into the state directory, if readable (never created here)."""
    try:
        return (state_dir / "admin_token").read_text().strip() or None
    except OSError:
        return None
