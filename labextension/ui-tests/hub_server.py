"""A real JupyterHub with `gpupool serve --hub` for the Hub browser test (tests/hub.spec.ts).

It starts the Hub exactly as the pytest suite's tests/hub do (their
``start_hub``: the config of docs/jupyterhub.md, the dummy authenticator, the
simple local process spawner, configurable-http-proxy from .venv/chp, users
alice in vision and bob in nlp), with the group projects of docs/jupyterhub.md's
``serve.json`` (½ GPU of kernels each). When the Hub and the service answer, it
prints one JSON line, ``{"url": ..., "password": ..., "dir": ...}``, and runs
until its standard input closes or it gets SIGTERM/SIGINT; then it stops the
Hub's whole process group (proxy, service, users' servers) and removes its
temporary directory.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.hub.conftest import HUB_SETTINGS, start_hub, stop_hub  # noqa: E402
from tests.hub.hubconfig import USERS  # noqa: E402

SETTINGS = {**HUB_SETTINGS, "hub_group_project": {"build_quota": 0.5, "train_guarantee": 1}}


def quiet_lab_settings(homes: Path) -> None:
    """No "notified about official Jupyter news?" prompt in the users' Labs (Galata's servers have none either)."""
    for user in USERS:
        settings = homes / user / ".jupyter" / "lab" / "user-settings" / "@jupyterlab" / "apputils-extension"
        settings.mkdir(parents=True, exist_ok=True)
        (settings / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))


def watch_stdin(fd: int, done: threading.Event) -> None:
    os.set_blocking(fd, True)
    try:
        while os.read(fd, 4096):
            pass
    finally:
        done.set()


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="gpupool-ui-hub-"))
    hub = None
    os.chmod(tmp, 0o755)
    done = threading.Event()

    def stop(signum: int, frame: FrameType | None) -> None:
        if hub is None:
            raise SystemExit(1)  # still starting: start_hub stops what it started
        done.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    # The Hub and its children get /dev/null as standard input (Node.js would make a shared pipe
    # non-blocking, and nothing of theirs should read it); ours is watched on a copy.
    watched = os.dup(0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    try:
        try:
            quiet_lab_settings(tmp / "homes")  # the homes of tests.hub.hubconfig
            hub = start_hub(tmp, SETTINGS, run_jobs_as="")
        except BaseException as exc:  # noqa: BLE001 (pytest.fail's Failed is a BaseException)
            print(f"hub_server: the Hub did not start: {exc}", file=sys.stderr, flush=True)
            return 1
        config = (tmp / "jupyterhub_config.py").read_text()
        password = re.search(r'DummyAuthenticator\.password = "([^"]*)"', config)
        print(json.dumps({"url": hub.url, "password": password.group(1) if password else "", "dir": str(tmp)}),
              flush=True)
        # Standard input closing (the test runner gone) is the other way to stop.
        threading.Thread(target=watch_stdin, args=(watched, done), daemon=True).start()
        while not done.wait(1):
            if hub.proc.poll() is not None:
                print(f"hub_server: jupyterhub exited ({hub.proc.returncode}):\n{hub.log()}", file=sys.stderr,
                      flush=True)
                return 1
        return 0
    finally:
        if hub is not None:
            if os.environ.get("GPUPOOL_UI_DEBUG"):
                print(hub.log(), file=sys.stderr, flush=True)
            stop_hub(hub)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
