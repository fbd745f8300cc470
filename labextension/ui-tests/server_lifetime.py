"""What the browser specs' server starters (hub_server.py, kernel_pods_server.py) share: how they live and end.

A spec spawns a starter, reads the one JSON line it prints once its servers
answer, and ends it with SIGTERM (or SIGINT); if the test runner dies instead,
the starter's standard input closes, and that ends it too. Its servers get
/dev/null as standard input: Node.js makes a pipe it shares non-blocking, and
nothing of theirs should read the spec's pipe; the starter watches its own on
a copy.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any


class Lifetime:
    """One starter's life: ``with Lifetime("hub_server") as life``, start the servers, ``life.announce({...})``,
    then ``return life.serve(proc, what, log)`` (0 when told to stop, 1 when ``proc`` exits first).

    ``exit_while_starting``: a signal before :meth:`announce` raises SystemExit
    at once (the starter's own clean-up stops what it started) instead of
    ending the wait that follows.
    """

    def __init__(self, name: str, exit_while_starting: bool = False) -> None:
        self.name = name
        self.exit_while_starting = exit_while_starting
        self.done = threading.Event()
        self._announced = False
        self._watched = -1

    def __enter__(self) -> Lifetime:
        signal.signal(signal.SIGTERM, self._stop)
        signal.signal(signal.SIGINT, self._stop)
        self._watched = os.dup(0)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.done.set()

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        if self.exit_while_starting and not self._announced:
            raise SystemExit(1)
        self.done.set()

    def say(self, text: str) -> None:
        """A line on standard error, for the spec's failure message."""
        print(f"{self.name}: {text}", file=sys.stderr, flush=True)

    def announce(self, info: dict[str, Any]) -> None:
        """Print where the servers are (the spec's one line), then watch standard input for its end."""
        self._announced = True
        print(json.dumps(info), flush=True)
        threading.Thread(target=self._watch_stdin, daemon=True, name="stdin-watch").start()

    def _watch_stdin(self) -> None:
        os.set_blocking(self._watched, True)
        try:
            while os.read(self._watched, 4096):
                pass
        finally:
            self.done.set()

    def serve(self, proc: subprocess.Popen[Any], what: str, log: Callable[[], str]) -> int:
        """Wait until told to stop (0), or until ``proc`` (``what``) exits first (1, saying so with its ``log()``)."""
        while not self.done.wait(1):
            if proc.poll() is not None:
                self.say(f"{what} exited ({proc.returncode}):\n{log()}")
                return 1
        return 0


def quiet_lab_notifications(user_settings_dir: Path) -> None:
    """No "notified about official Jupyter news?" prompt and no update check in a Lab with these user settings
    (Galata's own servers have none either): a prompt would cover what the specs click."""
    path = user_settings_dir / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}) + "\n")
