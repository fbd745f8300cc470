"""A scheduler service in its own process, for the crash-recovery tests.

``python -m tests.service.crash_server STATE_DIR SPECS_JSON``: starts a core
on simulated GPUs with ``on_shutdown="leave"``; on its first start (empty
store) creates project ``p`` and submits the job specs in SPECS_JSON (a JSON
list). Runs until SIGTERM (clean stop) or SIGKILL (the point of the tests).

With ``GPUPOOL_TEST_DIE_AT_EVENT=STATE`` in its environment, the process dies
at once (``os._exit``, as abruptly as a SIGKILL) when it is about to write the
first event of a job entering STATE: the worst moment for a state and its
event to be written apart.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

from gpupool.app.backend import build_core
from gpupool.service.config import ServiceConfig
from gpupool.service.core import Actor
from gpupool.service.store import Store


def _die_at_event(state: str) -> None:
    """Make the process die right before it writes the first ``job`` event entering ``state``."""
    add_event = Store.add_event

    def dying(self: Store, t: float, body: dict) -> int:
        if body.get("type") == "job" and body.get("state") == state:
            os._exit(9)
        return add_event(self, t, body)

    Store.add_event = dying  # type: ignore[method-assign]


async def main(state_dir: str, specs_path: str, gpus: str) -> None:
    if os.environ.get("GPUPOOL_TEST_DIE_AT_EVENT"):
        _die_at_event(os.environ["GPUPOOL_TEST_DIE_AT_EVENT"])
    core = build_core(ServiceConfig(
        state_dir=Path(state_dir), simulate=gpus, tick_s=0.1, poll_s=0.02, pause_grace_s=1.0,
        on_shutdown="leave", min_runtime_s=0.0, resume_backoff_s=0.0, admin_token="admin", node_name="crash",
        history_interval_s=0.5,
    ))
    await core.start()
    admin = Actor("admin", True)
    if not core.list_jobs(admin, {}):
        core.set_project(admin, "p", {"train_guarantee": 0, "build_quota": 1})
        for spec in json.loads(Path(specs_path).read_text()):
            await core.submit(Actor("alice"), spec)
    (Path(state_dir) / "server.ready").write_text("ok")
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await core.stop()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) > 3 else "2xA100-80GB"))
