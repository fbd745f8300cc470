"""A real JupyterHub on loopback, with `gpupool serve --hub` as its managed service.

The Hub is the `jupyterhub` package run as a process, with its
configurable-http-proxy from npm (``scripts/test`` installs it into
``.venv/chp``), the dummy authenticator and the simple local process spawner.
Its ``jupyterhub_config.py`` (:mod:`tests.hub.hubconfig`) has the shape
docs/jupyterhub.md gives: gpupool registered as a managed service, users
granted access to it, their servers pointed at it. A test-only service,
``driver``, holds a token with the rights to make users' tokens and change
groups: what the tests do as the Hub's admin would.

Without the proxy the tests fail, saying how to install it (CI must not pass
by skipping them); ``GPUPOOL_SKIP_HUB=1`` skips them on purpose.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.api.servers import ROOT, http, wait_until
from tests.hub.hubconfig import hub_config_text

CHP = ROOT / ".venv" / "chp" / "node_modules" / ".bin" / "configurable-http-proxy"


def proxy_command() -> str:
    """The configurable-http-proxy to run: the project's (scripts/test), else one on PATH; else fail loudly."""
    if CHP.exists():
        return str(CHP)
    found = shutil.which("configurable-http-proxy")
    if found:
        return found
    if os.environ.get("GPUPOOL_SKIP_HUB"):
        pytest.skip("GPUPOOL_SKIP_HUB is set: the JupyterHub tests are skipped on purpose")
    pytest.fail("configurable-http-proxy (JupyterHub's proxy, from npm) is missing: run scripts/test, or "
                "npm install --prefix .venv/chp configurable-http-proxy (GPUPOOL_SKIP_HUB=1 skips these tests)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Hub:
    """A running Hub: its public URL, its API, the gpupool service's URL and the driver's token."""

    url: str
    api: str
    gpupool: str
    driver_token: str
    gpupool_admin_token: str
    dir: Path
    proc: subprocess.Popen[bytes]
    tokens: dict[str, str] = field(default_factory=dict)

    def call(self, method: str, path: str, body: Any = None, token: str | None = None) -> tuple[int, Any]:
        """A Hub API request as the driver (the test's admin), or with ``token``."""
        return http(method, self.api + path, token or self.driver_token, body)

    def token(self, user: str, scopes: list[str] | None = None) -> str:
        """A new Hub API token of ``user`` (by default with all of the user's own permissions)."""
        body: dict[str, Any] = {"note": "gpupool test"}
        if scopes is not None:
            body["scopes"] = scopes
        status, reply = self.call("POST", f"/users/{user}/tokens", body)
        assert status == 201, (status, reply)
        return str(reply["token"])

    def user_token(self, user: str) -> str:
        """One token per user for the whole module (tokens are cheap, but so is reusing them)."""
        if user not in self.tokens:
            self.tokens[user] = self.token(user)
        return self.tokens[user]

    def gp(self, method: str, path: str, user: str | None = None, body: Any = None,
           token: str | None = None) -> tuple[int, Any]:
        """A gpupool API request as ``user`` (with their Hub token) or with ``token``."""
        return http(method, self.gpupool + "/api/v1" + path, token or self.user_token(str(user)), body)

    def log(self) -> str:
        path = self.dir / "hub.log"
        return path.read_text(errors="replace")[-6000:] if path.exists() else ""


def runtime_dir(tmp: Path) -> Path:
    """The runtime folder of a Hub's gpupool service (where it publishes its URL and token): the test's own."""
    return tmp / "gpupool-runtime"


def start_hub(tmp: Path, settings: dict[str, Any], *, run_jobs_as: str | None = None, users: list[str] | None = None,
              groups: dict[str, list[str]] | None = None, gpupool_port: int = 0, external_token: str = "",
              hub_port: int = 0) -> Hub:
    """Start a Hub in ``tmp`` with gpupool as its managed service (``settings``: its --config file).

    ``run_jobs_as`` None: the suite's $GPUPOOL_RUN_JOBS_AS; "": the service's default (owner, as root).
    ``external_token``: gpupool is an external service with that token instead, already listening on
    ``gpupool_port`` and told the Hub's API is on ``hub_port``.
    """
    chp = proxy_command()
    port, proxy_api = free_port(), free_port()
    hub_port = hub_port or free_port()
    gp_port = gpupool_port or free_port()
    driver = secrets.token_hex(24)
    gp_admin = "gpa_" + secrets.token_hex(16)
    settings_file = tmp / "gpupool-settings.json"
    settings_file.write_text(json.dumps(settings))
    (tmp / "jupyterhub_config.py").write_text(hub_config_text(
        port=port, hub_port=hub_port, proxy_api_port=proxy_api, gpupool_port=gp_port, chp=chp,
        python=sys.executable, state_dir=str(tmp / "gpupool-state"), settings_file=str(settings_file),
        driver_token=driver, gpupool_admin_token=gp_admin, users=users, groups=groups, external_token=external_token,
        run_jobs_as=os.environ.get("GPUPOOL_RUN_JOBS_AS", "") if run_jobs_as is None else run_jobs_as,
        runtime_dir=str(runtime_dir(tmp))))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_", "JUPYTERHUB_", "JPY_"))}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    log = open(tmp / "hub.log", "wb")
    # stdin not a terminal, as for a Hub that systemd runs: the servers it spawns inherit it, and a server
    # without one handles SIGINT (the Hub's way of stopping it) unlike one run in a terminal
    proc = subprocess.Popen([sys.executable, "-m", "jupyterhub", "-f", str(tmp / "jupyterhub_config.py")],
                            cwd=tmp, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    log.close()
    hub = Hub(url=f"http://127.0.0.1:{port}", api=f"http://127.0.0.1:{port}/hub/api",
              gpupool=f"http://127.0.0.1:{gp_port}", driver_token=driver, gpupool_admin_token=gp_admin,
              dir=tmp, proc=proc)

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"jupyterhub exited ({proc.returncode}):\n{hub.log()}")
        try:
            return http("GET", hub.gpupool + "/healthz", timeout=2)[0] == 200 and \
                hub.call("GET", "/users/hubadmin")[0] == 200
        except OSError:
            return False

    try:
        wait_until(up, timeout=90, interval=0.3, what="the Hub and its gpupool service")
    except BaseException:
        stop_hub(hub)
        raise
    return hub


def stop_hub(hub: Hub) -> None:
    """SIGTERM to the Hub's whole session (proxy, service, servers), then SIGKILL what is left."""
    if hub.proc.poll() is None:
        os.killpg(hub.proc.pid, signal.SIGTERM)
        try:
            hub.proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(hub.proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    time.sleep(0.2)


HUB_SETTINGS: dict[str, Any] = {
    "hub_cache_s": 1,  # group changes on the Hub are seen within a second
    "hub_personal_project": {"build_quota": 0.25},
    "tick_s": 0.5,
}


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    """One Hub (and one gpupool service) for a module's tests."""
    tmp = tmp_path_factory.mktemp("hub")
    os.chmod(tmp, 0o755)
    running = start_hub(tmp, HUB_SETTINGS)
    try:
        yield running
    finally:
        stop_hub(running)
