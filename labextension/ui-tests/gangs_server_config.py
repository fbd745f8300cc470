"""Jupyter server for tests/gangs.spec.ts: a pool of two simulated 8-GPU nodes.

The main test server (jupyter_server_test_config.py) simulates the Binder demo's
one node of 4 GPUs; a multi-node gang needs several nodes, so gangs.spec.ts
starts this second server itself, on a free port and in a temporary root
(``GPUPOOL_UI_PORT``, ``JUPYTERLAB_GALATA_ROOT_DIR``). The user's own project
guarantees every GPU (``train_guarantee`` -1), so a 16-GPU job is within quota.
"""

import os
import tempfile
from pathlib import Path

from jupyterlab.galata import configure_jupyter_server

c = get_config()  # noqa: F821 (provided by Jupyter when it loads this file)

configure_jupyter_server(c)

NODES = "node-a=8xA100-80GB;node-b=8xA100-80GB"

root = Path(os.environ.get("JUPYTERLAB_GALATA_ROOT_DIR") or tempfile.mkdtemp(prefix="gpupool-gangs-"))
root.mkdir(parents=True, exist_ok=True)
c.ServerApp.root_dir = str(root)
c.ServerApp.port = int(os.environ["GPUPOOL_UI_PORT"])
c.ServerApp.ip = "127.0.0.1"
c.ServerApp.allow_root = True  # CI runs as root in a container
c.ServerApp.runtime_dir = str(root / ".runtime")
c.ServerApp.jpserver_extensions = {"jupyter_gpupool": True}
c.LabApp.user_settings_dir = str(root / ".lab-settings")
# No "get notified about Jupyter news?" toast over the panel (Galata's own fixture mocks it away).
news = root / ".lab-settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
news.parent.mkdir(parents=True, exist_ok=True)
news.write_text('{"fetchNews": "false", "checkForUpdates": false}\n')

c.GPUPool.state_dir = str(root / ".gpupool-state")
c.GPUPool.simulate = NODES
c.GPUPool.train_guarantee = -1
# A fast scheduler for a test's patience, as in the main test server.
c.GPUPool.scheduler_config = {
    "tick_s": 0.5,
    "history_interval_s": 1.0,
    "pause_grace_s": 2.0,
    "resume_backoff_s": 1.0,
    "min_runtime_s": 1.0,
}
if os.environ.get("GPUPOOL_UI_DEBUG"):
    c.ServerApp.log_level = "DEBUG"
