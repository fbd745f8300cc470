"""Jupyter server for the browser tests: Galata's test settings plus a throwaway GPU pool.

Everything lives in one temporary directory (notebooks, the embedded
scheduler's state, workspaces), the GPUs are simulated, and the scheduler
ticks fast so a promoted notebook finishes within the test's patience.
"""

import asyncio
import os
import sys
import tempfile
from pathlib import Path

from jupyterlab.galata import configure_jupyter_server

c = get_config()  # noqa: F821 (provided by Jupyter when it loads this file)

configure_jupyter_server(c)

root = Path(os.environ.get("JUPYTERLAB_GALATA_ROOT_DIR") or tempfile.mkdtemp(prefix="gpupool-ui-"))
root.mkdir(parents=True, exist_ok=True)
c.ServerApp.root_dir = str(root)
c.ServerApp.port = int(os.environ.get("GPUPOOL_UI_PORT", "8899"))
c.ServerApp.ip = "127.0.0.1"

# The Binder demo pool: 4 simulated A100s, projects "vision" (ours) and "nlp".
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "binder"))
import gpupool_demo  # noqa: E402

state_dir = root / ".gpupool-state"
asyncio.run(gpupool_demo.seed_projects(state_dir))
c.GPUPool.state_dir = str(state_dir)
c.GPUPool.simulate = gpupool_demo.SIMULATE
c.GPUPool.project = gpupool_demo.DEFAULT_PROJECT
c.GPUPool.build_quota = gpupool_demo.PROJECTS["vision"]["build_quota"]
c.GPUPool.train_guarantee = gpupool_demo.PROJECTS["vision"]["train_guarantee"]
# A fast scheduler for a test's patience: short ticks, pauses and backoffs.
c.GPUPool.scheduler_config = {
    "tick_s": 0.5,
    "history_interval_s": 1.0,
    "pause_grace_s": 2.0,
    "resume_backoff_s": 1.0,
    "min_runtime_s": 1.0,
}
# Culling idle kernels by use (tests/idle.spec.ts): a short notice, checked often. A kernel is flagged only
# under its project's idle window (30 min unless a test sets it), so other tests never see it.
c.GPUPool.idle_notice = 4.0
c.GPUPool.idle_check_interval = 0.5
c.ServerApp.allow_root = True  # CI runs as root in a container
c.ServerApp.runtime_dir = str(root / ".runtime")
c.ServerApp.jpserver_extensions = {"jupyter_gpupool": True}
# Theme and other settings changed by the tests stay in the throwaway directory.
c.LabApp.user_settings_dir = str(root / ".lab-settings")
if os.environ.get("GPUPOOL_UI_DEBUG"):
    c.ServerApp.log_level = "DEBUG"
