"""How the Jupyter server reaches the scheduler: shared service or embedded one.

The server extension, the kernel provisioner and the REST handlers all run in
the Jupyter server process and must talk to the *same* scheduler with the
*same* identity. :class:`PoolConnection` is that one place: it knows the
scheduler URL and the user's token, starts the embedded scheduler on first use
when no URL is configured, and hands out an :class:`AsyncGpupoolClient`.

The provisioner is created by ``jupyter_client`` (an entry point), not by the
extension, so it cannot be handed the connection; the extension registers it
here with :func:`set_current` and the provisioner looks it up with
:func:`current`.
"""

from __future__ import annotations

import asyncio
import getpass
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from gpupool.wire.errors import GpupoolError, Unavailable
from jupyter_gpupool.hub import shared_scheduler_token

log = logging.getLogger(__name__)

DEFAULT_SIMULATION = "4xA100-80GB"
"""Simulated GPUs for the embedded scheduler on a machine without NVML GPUs."""


def nvml_gpu_count() -> int:
    """Number of GPUs NVML sees here; 0 when NVML is missing or has no GPU.

    Used to pick real GPUs over simulated ones for the embedded scheduler and to
    size the default training guarantee.
    """
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            return int(pynvml.nvmlDeviceGetCount())
        finally:
            pynvml.nvmlShutdown()
    except Exception:
        return 0


def simulated_gpu_count(spec: str) -> int:
    """GPUs in a simulation string like ``"4xA100-80GB"`` or ``"2xA100-80GB,1xV100"``.

    Read with the embedded scheduler's own parser, so the count is the pool it will simulate.
    """
    from gpupool.inventory.simulated import parse_spec

    return sum(count for count, _model in parse_spec(spec))


@dataclass
class PoolSettings:
    """What the extension was configured with (a plain copy of the traitlets)."""

    scheduler_url: str = ""
    scheduler_token: str = ""
    project: str = ""
    state_dir: str = ""
    simulate: str = ""
    build_quota: float = 1.0
    train_guarantee: float | None = None
    lease_seconds: float = 120.0
    kernel_start_timeout: float = 30.0
    extra: dict[str, Any] = field(default_factory=dict)


class PoolConnection:
    """The server's one link to the scheduler (shared, or embedded on first use)."""

    def __init__(self, settings: PoolSettings) -> None:
        self.settings = settings
        self.user = getpass.getuser()
        self.project = settings.project or self.user
        self.url = settings.scheduler_url.rstrip("/")
        self.token = settings.scheduler_token
        self.admin = False
        self.embedded: Any = None
        self._client: Any = None
        self._admin_client: Any = None
        self._lock = asyncio.Lock()
        self._ready = False
        self.closed = False
        self.log: logging.Logger | logging.LoggerAdapter[Any] = log
        self.on_ready: Callable[[], None] | None = None
        """Called once connected, in the loop: the extension starts its periodic tasks there."""

    @property
    def ready(self) -> bool:
        """Whether a client is connected (no connection is made by asking)."""
        return self._ready

    @property
    def is_embedded(self) -> bool:
        """True when this server runs the scheduler itself (no URL configured)."""
        return not self.settings.scheduler_url

    async def client(self) -> Any:
        """The user's async scheduler client, starting the embedded scheduler if needed."""
        if self.closed:
            raise Unavailable("the gpupool extension has stopped; no scheduler connection")
        if not self._ready:
            async with self._lock:
                if not self._ready:
                    await self._connect()
                    self._ready = True
                    self._fire_ready()
        return self._client

    def _fire_ready(self) -> None:
        if self.on_ready is not None:
            self.on_ready()

    def use_client(self, client: Any, admin_client: Any = None, admin: bool = False) -> None:
        """Use a ready client instead of connecting (another transport, or a test double)."""
        self._client = client
        self._admin_client = admin_client
        self.admin = admin or admin_client is not None
        self.url = getattr(client, "url", self.url)
        self.token = getattr(client, "token", self.token)
        self._ready = True
        self._fire_ready()

    async def admin_client(self) -> Any | None:
        """A client with the admin token (embedded mode), or None when we have none."""
        await self.client()
        return self._admin_client or (self._client if self.admin else None)

    async def _connect(self) -> None:
        from gpupool.client import AsyncGpupoolClient

        if self.is_embedded:
            await self._start_embedded()
            self._admin_client = AsyncGpupoolClient(url=self.url, token=self.embedded.admin_token)
            self.token = await self._user_token(AsyncGpupoolClient)
            self.embedded.publish_token(self.token, user=self.user)  # `gpupool` here acts as this user
            self._client = AsyncGpupoolClient(url=self.url, token=self.token)
            self.admin = True
        else:
            if not self.url:
                raise Unavailable("no scheduler URL configured")
            self._client = AsyncGpupoolClient(url=self.url, token=self.token or None)
            who = await self._client.whoami()
            self.user = who.get("user") or self.user
            self.admin = bool(who.get("admin"))
            if not self.settings.project:  # the scheduler may know better (a Hub user's first group)
                self.project = who.get("project") or self.user

    @property
    def user_token_path(self) -> str:
        """Where the embedded scheduler's token for this user is kept (mode 0600)."""
        return os.path.join(self.settings.state_dir, "jupyter_user_token")

    async def _user_token(self, client_class: Any) -> str:
        """This user's token on the embedded scheduler: the saved one if it still works, else a new one.

        Reusing it keeps one token per user instead of one per server start.
        """
        path = self.user_token_path
        try:
            with open(path) as f:
                saved = f.read().strip()
        except OSError:
            saved = ""
        if saved:
            try:
                who = await client_class(url=self.url, token=saved).whoami()
                if who.get("user") == self.user:
                    return saved
            except GpupoolError:
                pass
        token = (await self._admin_client.create_token(self.user))["token"]
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(token + "\n")
        return str(token)

    def _embedded_pool(self) -> tuple[str | None, int]:
        """(simulate argument, GPU count) for the embedded scheduler."""
        if self.settings.simulate:
            return self.settings.simulate, simulated_gpu_count(self.settings.simulate)
        real = nvml_gpu_count()
        if real:
            return None, real
        return DEFAULT_SIMULATION, simulated_gpu_count(DEFAULT_SIMULATION)

    async def _start_embedded(self) -> None:
        from gpupool.app.embedded import EmbeddedScheduler

        simulate, gpus = self._embedded_pool()
        guarantee = self.settings.train_guarantee
        project = {
            "build_quota": self.settings.build_quota,
            "train_guarantee": float(gpus) if guarantee is None else guarantee,
        }
        state_dir = self.settings.state_dir
        os.makedirs(state_dir, exist_ok=True)
        extra = dict(self.settings.extra)
        # c.GPUPool.projects adds (or, for the user's own project, overrides) projects
        # created at first start; existing projects keep the quotas an admin set since.
        projects = {self.project: project, **extra.pop("projects", {})}
        kwargs: dict[str, Any] = {"simulate": simulate, "projects": projects}
        kwargs.update(extra)
        # One user's server: its jobs are that user's, run as the server's own account (even as root,
        # as in a container), not as an account named after the project's user.
        config = kwargs.get("config")
        if config is None:
            kwargs["config"] = {"run_jobs_as": "service"}
        elif isinstance(config, dict) and "run_jobs_as" not in config:
            kwargs["config"] = {**config, "run_jobs_as": "service"}
        self.embedded = EmbeddedScheduler(state_dir, **kwargs)
        await self.embedded.start()
        self.url = self.embedded.url.rstrip("/")
        self.log.info("gpupool: embedded scheduler at %s (state in %s)", self.url, state_dir)

    def without_url(self, message: str) -> str:
        """``message`` (a client error) with the scheduler's address left out, for replies to the browser.

        The client names the URL it could not reach, which helps in the server's
        log; in the Lab UI it shows an internal host and port (the embedded
        scheduler's loopback port, or a cluster address) that the user cannot use.
        """
        for url in sorted({self.url, self.settings.scheduler_url.rstrip("/")} - {""}, key=len, reverse=True):
            message = message.replace(f" at {url}", "").replace(url, "the scheduler")
        return message

    def kernel_env(self) -> dict[str, str]:
        """What a kernel needs to reach the scheduler as this user (widgets, magics)."""
        env = {"GPUPOOL_URL": self.url, "GPUPOOL_PROJECT_DEFAULT": self.project, "GPUPOOL_USER": self.user}
        if self.token:
            env["GPUPOOL_TOKEN"] = self.token
        return env

    async def close(self) -> None:
        """Stop the embedded scheduler (if ours) and drop the clients; later calls get Unavailable.

        Closed for good: kernels cleaned up after the extension stops must not
        start a new embedded scheduler just to give their share back.
        """
        self.closed = True
        for client in (self._client, self._admin_client):
            closer = getattr(client, "close", None)
            if closer is not None:
                result = closer()
                if asyncio.iscoroutine(result):
                    await result
        self._client = self._admin_client = None
        self._ready = False
        if self.embedded is not None:
            embedded, self.embedded = self.embedded, None
            await embedded.stop()


_current: PoolConnection | None = None


def set_current(connection: PoolConnection | None) -> None:
    """Register the server's connection for the provisioner (None to unregister)."""
    global _current
    _current = connection


def current() -> PoolConnection | None:
    """The connection registered by the server extension in this process, if any."""
    return _current


def connection_from_env() -> PoolConnection | None:
    """A connection built from GPUPOOL_URL / GPUPOOL_TOKEN (provisioner outside the extension)."""
    url = os.environ.get("GPUPOOL_URL", "")
    if not url:
        return None
    return PoolConnection(
        PoolSettings(
            scheduler_url=url,
            scheduler_token=shared_scheduler_token(os.environ),
            project=os.environ.get("GPUPOOL_PROJECT_DEFAULT", ""),
        )
    )
