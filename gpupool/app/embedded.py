"""EmbeddedScheduler: the scheduler core and its HTTP API inside the current asyncio loop.

The Jupyter extension starts one when no scheduler URL is configured, and
``gpupool serve`` is the same object run as its own process. Either way the
rest of the system talks to it over HTTP through :mod:`gpupool.client`, so
there is exactly one path from a user to the core, with the same
authentication and the same errors, whether the scheduler is shared or not.

Once listening it publishes a runtime file (:mod:`gpupool.client.runtime_file`)
with its URL and a token, so ``gpupool`` run by the same user on this machine
finds it with no flags, though its port is random; the file goes on a clean stop.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from gpupool.api.app import make_app
from gpupool.api.standby import StandbyInfo, make_standby_app
from gpupool.app.leading import (
    FIRST_ROUND_S,
    Election,
    Switch,
    admin_token_on_disk,
    build_core_when_free,
    wants_election,
)
from gpupool.client import runtime_file
from gpupool.service.config import ServiceConfig
from gpupool.service.core import Actor
from gpupool.wire.errors import GpupoolError, InvalidRequest

log = logging.getLogger("gpupool.embedded")

MAX_BODY = 4 * 2**20  # a job spec is a few KiB; anything this big is a mistake
STOP_CONNECTIONS_S = 5.0


class EmbeddedScheduler:
    """Run SchedulerCore plus its HTTP API on ``host`` (default loopback) at a free port.

    ``projects`` maps names to wire fields (``build_quota``, ``train_guarantee``,
    ``train_limit``, ``weight``, in GPUs); missing projects are created at start,
    existing ones are left as the admin last set them. ``config`` holds any other
    :class:`ServiceConfig` field (``tick_s``, ``min_runtime_s``, ...).

    ``publish`` (default on) writes the runtime file at start, with the admin
    token until :meth:`publish_token` names the token a local user should get
    (the Jupyter extension gives its user's own, so jobs from the CLI are theirs).
    """

    def __init__(self, state_dir: str | os.PathLike[str], simulate: str | None = None,
                 projects: Mapping[str, Mapping[str, Any]] | None = None, admin_token: str | None = None,
                 *, host: str = "127.0.0.1", port: int = 0,
                 config: Mapping[str, Any] | ServiceConfig | None = None, publish: bool = True,
                 on_standby: Callable[[dict[str, Any]], None] | None = None,
                 on_lost_leadership: Callable[[str], None] | None = None) -> None:
        self.state_dir = Path(state_dir).expanduser()
        self.simulate = simulate
        self.projects = dict(projects or {})
        self.host = host
        self.port = port
        self._admin_token = admin_token
        self._config = config
        self.url: str | None = None
        self.admin_token: str | None = None
        self.core: Any = None
        self.app: Any = None
        self._server: HTTPServer | None = None
        self.publish = publish
        self.runtime_path: str | None = None
        """The runtime file this scheduler wrote (None before start, after stop, or when not publishing)."""
        self.on_standby = on_standby
        """Kubernetes leader election: called (with the Lease's state) when start() waits as a standby."""
        self.on_lost_leadership = on_lost_leadership
        """Called on the loop when this instance lost the Lease it led with (default: stop the scheduler)."""
        self.election: Election | None = None
        self.lost_leadership: str | None = None
        """Why this instance stopped leading (None while it leads, or with no leader election)."""
        self._loop: asyncio.AbstractEventLoop | None = None

    def service_config(self) -> ServiceConfig:
        """The core's configuration: explicit arguments win over ``config``."""
        overrides: dict[str, Any] = {"state_dir": self.state_dir}
        if self.simulate is not None:
            overrides["simulate"] = self.simulate
        if self._admin_token is not None:
            overrides["admin_token"] = self._admin_token
        if isinstance(self._config, ServiceConfig):
            for key, value in overrides.items():
                setattr(self._config, key, value)
            return self._config
        return ServiceConfig.from_dict({**(self._config or {}), **overrides})

    async def start(self) -> None:
        """Start the core (recovering its state), create missing projects, then listen.

        With the Kubernetes backend and leader election on (the default), the
        port answers as a standby until this instance holds the Lease, and
        only then is the core built (gpupool/app/leading.py).
        """
        from gpupool.app.backend import build_core  # the core and its backend load only when started
        from gpupool.service.core import SchedulerCore

        if self.core is not None:
            raise InvalidRequest("this embedded scheduler is already started")
        cfg = self.service_config()
        # Listen first: a port in use must not cost a core start (recovery, re-adopting jobs) for nothing.
        try:
            sockets = bind_sockets(self.port, self.host, reuse_port=False)
        except OSError as e:
            raise GpupoolError(f"cannot listen on {self.host}:{self.port}: {e.strerror or e}") from None
        self._set_url(sockets[0].getsockname()[1])
        self._loop = asyncio.get_running_loop()
        election = Election(cfg, self._lost_from_any_thread) if wants_election(cfg) else None
        switch: Switch | None = None
        core: SchedulerCore | None = None
        try:
            self.state_dir.mkdir(parents=True, exist_ok=True)
            if election is not None:
                self.election = election
                switch = Switch(make_standby_app(StandbyInfo(cfg.admin_token or admin_token_on_disk(self.state_dir),
                                                             election.leadership.holder, election.leadership.where)))
                self._server = HTTPServer(switch, max_body_size=MAX_BODY, idle_connection_timeout=120)
                self._server.add_sockets(sockets)
                election.start()
                if not await election.wait_to_lead(FIRST_ROUND_S):
                    if self.on_standby is not None:
                        self.on_standby(election.describe())
                    await election.wait_to_lead()
                leadership = election.leadership
                core = await build_core_when_free(lambda: build_core(cfg, leadership=leadership), election,
                                                  self.state_dir)
            else:
                core = build_core(cfg)
            await core.start()
            self.admin_token = self._find_admin_token(core, cfg)
            self._ensure_projects(core, cfg)
            self.app = make_app(core)
            if switch is not None:
                switch.target = self.app  # the same socket: requests from now on reach the core
            else:
                self._server = HTTPServer(self.app, max_body_size=MAX_BODY, idle_connection_timeout=120)
                self._server.add_sockets(sockets)
        except BaseException:
            if self._server is not None:
                self._server.stop()
            else:
                for sock in sockets:
                    sock.close()
            self._server = None
            if core is not None:
                await core.stop()
            if election is not None:
                election.stop(release=True)  # released only while still ours
                self.election = None
            self.url = None
            raise
        self.core = core
        log.info("gpupool scheduler listening on %s (state in %s)", self.url, self.state_dir)
        if self.publish:
            self.publish_token(self.admin_token, user=cfg.admin_user)

    def _set_url(self, port: int) -> None:
        host = self.host if ":" not in self.host else f"[{self.host}]"
        if self.host in ("0.0.0.0", "::", ""):
            host = "127.0.0.1"
        self.port = port
        self.url = f"http://{host}:{port}"

    def _lost_from_any_thread(self, why: str) -> None:
        """The Lease was lost (the elector's thread, or a write's): writes already stopped; act on the loop."""
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._lost, why)

    def _lost(self, why: str) -> None:
        if self.lost_leadership is not None:
            return
        self.lost_leadership = why
        if self.on_lost_leadership is not None:
            self.on_lost_leadership(why)
        else:
            asyncio.ensure_future(self.stop())

    def publish_token(self, token: str | None, user: str | None = None) -> None:
        """(Re)write the runtime file with ``token``: what `gpupool` on this machine will use by default.

        A failure to write it is logged, not raised: the scheduler works without
        it (flags and the environment still reach it).
        """
        if self.url is None:
            raise InvalidRequest("the embedded scheduler is not started")
        try:
            self.runtime_path = runtime_file.write(self.url, token, user=user, state_dir=str(self.state_dir))
        except OSError as e:
            log.warning("could not write the gpupool runtime file in %s: %s", runtime_file.runtime_dir(), e)

    async def stop(self) -> None:
        """Stop listening, end long-polls and streams, then stop the core (jobs as its config says)."""
        if self.core is None:
            return
        if self.runtime_path is not None:  # first, so no new client is sent here while we stop
            runtime_file.remove(self.runtime_path)
            self.runtime_path = None
        if self._server is not None:
            self._server.stop()
            self.app.settings["shutdown_event"].set()
            # Woken long-polls and streams answer and finish; then the rest is closed.
            deadline = asyncio.get_running_loop().time() + STOP_CONNECTIONS_S / 2
            while self.app.settings.get("inflight", 0) and asyncio.get_running_loop().time() < deadline:
                await asyncio.sleep(0.01)
            try:
                await asyncio.wait_for(self._server.close_all_connections(), STOP_CONNECTIONS_S)
            except asyncio.TimeoutError:
                log.warning("some HTTP connections did not close within %.0f s", STOP_CONNECTIONS_S)
            self._server = None
        core, self.core = self.core, None
        await core.stop()
        if self.election is not None:  # after the core: no write of ours can follow the release
            self.election.stop(release=self.lost_leadership is None)
            self.election = None

    async def __aenter__(self) -> EmbeddedScheduler:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    @property
    def admin_token_path(self) -> Path:
        """Where a generated admin token lives (mode 0600)."""
        return self.state_dir / "admin_token"

    def _find_admin_token(self, core: Any, cfg: ServiceConfig) -> str | None:
        token = cfg.admin_token or getattr(core, "admin_token", None)
        if token:
            return str(token)
        try:
            return self.admin_token_path.read_text().strip() or None
        except OSError:
            return None

    def _ensure_projects(self, core: Any, cfg: ServiceConfig) -> None:
        if not self.projects:
            return
        existing = {p["name"] for p in core.list_projects()}
        admin = Actor(cfg.admin_user, admin=True)
        for name, fields in self.projects.items():
            if name not in existing:
                core.set_project(admin, name, dict(fields))
