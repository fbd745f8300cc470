"""Small helpers shared by the service tests."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from typing import Any

PY = sys.executable

# A training job that checkpoints: counts to STEPS, saving its step to ckpt.txt;
# on SIGTERM it saves and exits 0. Each start appends "attempt resume first_step" to starts.txt.
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
