"""Small helpers shared by the service tests."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from gpupool.app.backend import build_core
from gpupool.service.config import ServiceConfig
from gpupool.service.core import Actor

PY = sys.executable

ADMIN = Actor("admin", True)
ALICE = Actor("alice")
BOB = Actor("bob")


async def cores_made(config_of: Callable[..., ServiceConfig]) -> AsyncIterator[Callable[..., Any]]:
    """A ``make_core`` fixture's body: ``await make(**overrides)`` starts a core on ``config_of(**overrides)``;
    every core made is stopped when the test ends."""
    from gpupool.service.core import SchedulerCore

    cores: list[SchedulerCore] = []

    async def make(**overrides: Any) -> SchedulerCore:
        core = build_core(config_of(**overrides))
        await core.start()
        cores.append(core)
        return core

    yield make
    for c in cores:
        await c.stop()


def fast_config(state_dir: Path, **overrides: Any) -> ServiceConfig:
    """Short timers so tests are quick; the policy knobs let reclaim act at once."""
    base: dict[str, Any] = dict(
        state_dir=state_dir, simulate="2xA100-80GB", tick_s=0.2, poll_s=0.02, pause_grace_s=2.0,
        reply_wait_s=3.0, history_interval_s=0.2, min_runtime_s=0.0, resume_backoff_s=0.0, admin_token="admin-secret",
        node_name="testhost", cycle_min_interval_s=0.0,
    )
    base.update(overrides)
    return ServiceConfig(**base)


# A training job that checkpoints: counts to STEPS, saving its step to ckpt.txt;
# on SIGTERM it saves and exits 0. Each start appends "attempt resume first_step" to starts.txt.
SLOW_TO_STOP = r"""
import signal, sys, time
delay = float(sys.argv[1])  # seconds between SIGTERM and exit
def term(*_):
    time.sleep(delay); sys.exit(0)
signal.signal(signal.SIGTERM, term)
open("ready", "w").close()
time.sleep(120)
"""
"""A job that writes ``ready`` once its SIGTERM handler is set, then takes argv[1] seconds to stop."""


CHECKPOINTING_JOB = r"""
import os, signal, sys, time
steps = int(sys.argv[1]); delay = float(sys.argv[2])
step = int(open("ckpt.txt").read()) if os.path.exists("ckpt.txt") else 0
with open("starts.txt", "a") as f:
    f.write(f"{os.environ['GPUPOOL_ATTEMPT']} {os.environ['GPUPOOL_RESUME']} {step}\n")
def save(*_):
    with open("ckpt.tmp", "w") as f:
        f.write(str(step))
    os.replace("ckpt.tmp", "ckpt.txt")
def term(*_):
    save(); print(f"checkpointed at {step}", flush=True); sys.exit(0)
signal.signal(signal.SIGTERM, term)
while step < steps:
    time.sleep(delay); step += 1; save()
print("done", step, flush=True)
"""


async def wait_for(pred: Callable[[], Any], timeout: float = 30.0, what: str = "condition") -> Any:
    """Poll ``pred`` until it returns something truthy; fail the test after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


async def started(core: Any, job_id: str, timeout: float = 30.0) -> dict[str, Any]:
    """The job once its first cycle decided it running (a train submit returns it queued)."""
    admin = Actor("admin", True)
    await wait_for(lambda: core.get_job(admin, job_id)["state"] != "queued", timeout, f"{job_id} to be decided")
    return core.get_job(admin, job_id)


OLD_JOB_ROW = ("INSERT INTO jobs(id, num, name, project, user, kind, state, request, submitted_at, command) "
               "VALUES ('j-000001', 1, 'old', 'p', 'alice', 'train', 'queued', '{\"gpus\": 1}', 1.0, '[\"true\"]')")


def older_store(path: Path, schema_text: str, instead: str = "", row: str = OLD_JOB_ROW) -> set[str]:
    """A state.db as an older version made it: today's schema with ``schema_text`` (its newer columns) replaced
    by ``instead``, holding one job ``row``; the jobs table's columns. For the tests that it is upgraded in place."""
    import sqlite3

    import gpupool.service.store as store_module

    old_schema = store_module._SCHEMA.replace(schema_text, instead)
    assert old_schema != store_module._SCHEMA  # the columns really are left out of the old database
    db = sqlite3.connect(path)
    db.executescript(old_schema)
    db.execute(row)
    db.commit()
    columns = {r[1] for r in db.execute("PRAGMA table_info(jobs)")}
    db.close()
    return columns

