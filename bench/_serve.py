"""`gpupool serve` of this checkout in a child process: the service the API and CLI benchmarks measure against."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


class ServeProcess:
    """`gpupool serve` on a free port with ``settings`` (a service config) and admin token ``token``.

    ``env`` adds to the environment (e.g. ``GPUPOOL_RUNTIME_DIR``); the
    settings file lies beside ``state_dir``. ``port`` 0 picks a free one; a
    fixed port lets a restarted service keep its URL.
    """

    def __init__(self, state_dir: Path, simulate: str, settings: dict[str, object], token: str,
                 env: dict[str, str] | None = None, port: int = 0) -> None:
        self.state_dir = state_dir
        self.simulate = simulate
        self.settings = settings
        self.token = token
        self.env = dict(env or {})
        self.port = port
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""

    def start(self) -> float:
        """Start and wait for the banner; returns seconds until it listened."""
        config = self.state_dir.parent / (self.state_dir.name + "-settings.json")
        config.write_text(json.dumps(self.settings))
        env = dict(os.environ, GPUPOOL_ADMIN_TOKEN=self.token, PYTHONPATH=str(ROOT), **self.env)
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpupool", "serve", "--state-dir", str(self.state_dir), "--port", str(self.port),
             "--simulate", self.simulate, "--config", str(config), "--log-level", "WARNING"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if "listening on " in line:
                self.url = line.split("listening on ", 1)[1].split()[0]
                break
        if not self.url:
            raise SystemExit(f"gpupool serve did not start (exit {self.proc.wait()})")
        return time.perf_counter() - t0

    def rss(self) -> tuple[int, int]:
        """(VmRSS, VmHWM) in bytes."""
        assert self.proc is not None
        values = {}
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(("VmRSS:", "VmHWM:")):
                key, value = line.split(":", 1)
                values[key] = int(value.split()[0]) * 1024
        return values["VmRSS"], values["VmHWM"]

    def kill9(self) -> None:
        """SIGKILL, as a crash: no clean stop, its jobs' processes live on."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
