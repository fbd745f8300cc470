"""Set up jupyter-gpupool's demo pool for Binder: simulated GPUs and two projects.

Called by ``binder/postBuild`` after the project is installed. It

1. seeds the embedded scheduler's state directory with two projects and their
   quotas (through :class:`gpupool.app.embedded.EmbeddedScheduler`, the
   same object the Jupyter extension runs, so the state is exactly what the
   server will open), and
2. writes the ``c.GPUPool`` settings into ``jupyter_server_config.py`` in the
   user's Jupyter config directory (``~/.jupyter`` on Binder), inside a marked
   block replaced on a re-run, so a user's own settings stay.

The Jupyter server later starts its embedded scheduler on that state directory:
projects that already exist keep the quotas seeded here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path
from typing import Any

SIMULATE = "4xA100-80GB"
PROJECTS: dict[str, dict[str, Any]] = {
    # Computer vision: more kernels, two guaranteed training GPUs.
    "vision": {"build_quota": 1.5, "train_guarantee": 2.0, "weight": 1.0},
    # Language models: fewer kernels, two guaranteed training GPUs.
    "nlp": {"build_quota": 1.0, "train_guarantee": 2.0, "weight": 1.0},
}
DEFAULT_PROJECT = "vision"
BEGIN = "# >>> jupyter-gpupool demo (binder/postBuild) >>>"
END = "# <<< jupyter-gpupool demo <<<"


def default_state_dir() -> Path:
    """Where the demo scheduler keeps its state: the user's Jupyter data directory."""
    from jupyter_core.paths import jupyter_data_dir

    return Path(jupyter_data_dir()) / "gpupool-demo"


def default_config_dir() -> Path:
    """The user's Jupyter config directory, as the server will search it."""
    from jupyter_core.paths import jupyter_config_dir

    return Path(jupyter_config_dir())


def config_block(state_dir: Path) -> str:
    """The ``c.GPUPool`` settings of the demo, as Python config lines."""
    mine = PROJECTS[DEFAULT_PROJECT]
    lines = [
        BEGIN,
        "# Simulated GPUs and two projects; the embedded scheduler runs inside Jupyter.",
        f"c.GPUPool.simulate = {SIMULATE!r}",
        f"c.GPUPool.state_dir = {str(state_dir)!r}",
        f"c.GPUPool.project = {DEFAULT_PROJECT!r}",
        f"c.GPUPool.build_quota = {mine['build_quota']!r}",
        f"c.GPUPool.train_guarantee = {mine['train_guarantee']!r}",
        "# Sample the pool often so the history chart fills quickly in a short session.",
        "c.GPUPool.scheduler_config = {'history_interval_s': 5.0}",
        END,
    ]
    return "\n".join(lines) + "\n"


def write_config(config_dir: Path, state_dir: Path) -> Path:
    """Write (or replace) the demo block in ``<config_dir>/jupyter_server_config.py``."""
    path = config_dir / "jupyter_server_config.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    text = path.read_text() if path.exists() else ""
    if BEGIN in text and END in text:
        head, rest = text.split(BEGIN, 1)
        tail = rest.split(END, 1)[1].lstrip("\n")
        text = head + tail
    if text and not text.endswith("\n"):
        text += "\n"
    path.write_text(text + config_block(state_dir))
    return path


async def seed_projects(state_dir: Path) -> list[dict[str, Any]]:
    """Create the demo projects in the scheduler state; returns them as the scheduler sees them."""
    from gpupool.app.embedded import EmbeddedScheduler
    from gpupool.client import AsyncGpupoolClient

    state_dir.mkdir(parents=True, exist_ok=True)
    # Binder's one user: jobs run as the server's own account, as in the Jupyter extension's scheduler.
    embedded = EmbeddedScheduler(state_dir, simulate=SIMULATE, projects=PROJECTS,
                                 config={"run_jobs_as": "service"})
    await embedded.start()
    try:
        client = AsyncGpupoolClient(embedded.url, embedded.admin_token)
        return list(await client.projects())
    finally:
        await embedded.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config-dir", default=None, help="Jupyter config directory (default: yours)")
    parser.add_argument("--state-dir", default=None, help="scheduler state (default: <Jupyter data dir>/gpupool-demo)")
    args = parser.parse_args(argv)
    state_dir = Path(args.state_dir).expanduser() if args.state_dir else default_state_dir()
    config_dir = Path(args.config_dir).expanduser() if args.config_dir else default_config_dir()
    projects = asyncio.run(seed_projects(state_dir))
    config = write_config(config_dir, state_dir)
    summary = {
        "config": str(config),
        "state_dir": str(state_dir),
        "simulate": SIMULATE,
        "projects": {p["name"]: {"build_quota": p["build_quota"], "train_guarantee": p["train_guarantee"]} for p in projects},
    }
    print(json.dumps(summary, indent=2))
    missing = sorted(set(PROJECTS) - {p["name"] for p in projects})
    if missing:
        print(f"gpupool demo: the scheduler did not keep project(s) {', '.join(missing)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
