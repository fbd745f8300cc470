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

import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from server_lifetime import Lifetime, quiet_lab_notifications  # noqa: E402

from tests.hub.conftest import HUB_SETTINGS, start_hub, stop_hub  # noqa: E402
from tests.hub.hubconfig import USERS  # noqa: E402

SETTINGS = {**HUB_SETTINGS, "hub_group_project": {"build_quota": 0.5, "train_guarantee": 1}}


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="gpupool-ui-hub-"))
    hub = None
    os.chmod(tmp, 0o755)
    try:
        with Lifetime("hub_server", exit_while_starting=True) as life:  # still starting: start_hub stops its own
            try:
                for user in USERS:  # the homes of tests.hub.hubconfig
                    quiet_lab_notifications(tmp / "homes" / user / ".jupyter" / "lab" / "user-settings")
                hub = start_hub(tmp, SETTINGS, run_jobs_as="")
            except BaseException as exc:  # noqa: BLE001 (pytest.fail's Failed is a BaseException)
                life.say(f"the Hub did not start: {exc}")
                return 1
            config = (tmp / "jupyterhub_config.py").read_text()
            password = re.search(r'DummyAuthenticator\.password = "([^"]*)"', config)
            life.announce({"url": hub.url, "password": password.group(1) if password else "", "dir": str(tmp)})
            return life.serve(hub.proc, "jupyterhub", hub.log)
    finally:
        if hub is not None:
            if os.environ.get("GPUPOOL_UI_DEBUG"):
                print(hub.log(), file=sys.stderr, flush=True)
            stop_hub(hub)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
