"""The queue monitor says how busy each running job keeps its share, and flags the idle ones (issue 26, item 3).

Against a real embedded scheduler on simulated GPUs whose jobs report their
own use (gpupool.sim_use), as a notebook's monitor sees them.
"""

from __future__ import annotations

import asyncio
import re
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from gpupool.app.embedded import EmbeddedScheduler
from gpupool.client import AsyncGpupoolClient
from jupyter_gpupool.widgets import QueueMonitor, use_text

pytestmark = pytest.mark.timeout(120)

REPORTS = "import time, gpupool, sys; gpupool.sim_use(busy=float(sys.argv[1])); time.sleep(60)"


@pytest_asyncio.fixture
async def alice(tmp_path: Any) -> AsyncIterator[AsyncGpupoolClient]:
    sched = EmbeddedScheduler(
        tmp_path / "state", simulate="2xA100-80GB",
        projects={"vision": {"build_quota": 1, "train_guarantee": 2}},
        config={"tick_s": 0.2, "poll_s": 0.05, "min_runtime_s": 0.0, "pause_grace_s": 1.0},
    )
    await sched.start()
    admin = AsyncGpupoolClient(sched.url, sched.admin_token)
    # the admin flags training jobs idle after 1 s below 5 % of their share (docs/policy.md, "Idle GPUs")
    await admin.set_project("vision", idle={"train": {"window_s": 1, "action": "flag"}})
    try:
        yield AsyncGpupoolClient(sched.url, (await admin.create_token("alice"))["token"])
    finally:
        await sched.stop()


async def test_each_running_job_shows_its_recent_use_and_the_idle_one_is_flagged(alice: Any) -> None:
    busy = await alice.submit({"project": "vision", "gpus": 1, "command": [sys.executable, "-c", REPORTS, "0.5"]})
    idle = await alice.submit({"project": "vision", "gpus": 1, "command": [sys.executable, "-c", REPORTS, "0"]})
    monitor = QueueMonitor(client=alice, autostart=False, user="alice")
    try:
        deadline = time.monotonic() + 30
        while True:
            await monitor.refresh()
            texts = {key: row.text.value for key, row in monitor.rows.items()}
            if "% busy" in texts.get(busy["id"], "") and "idle since" in texts.get(idle["id"], ""):
                break
            assert time.monotonic() < deadline, texts
            await asyncio.sleep(0.2)
        percent = int(re.search(r"· (\d+) % busy", texts[busy["id"]]).group(1))  # type: ignore[union-attr]
        assert 30 <= percent <= 50, texts[busy["id"]]  # half of its GPU since it reported, idle a moment before
        assert "idle since" not in texts[busy["id"]]
        assert re.search(r"· 0 % busy · <span [^>]*>⚠ idle since \d\d:\d\d:\d\d</span>", texts[idle["id"]])
        assert "use" in monitor.heading.value
    finally:
        monitor.close()
        for job in (busy, idle):
            await alice.cancel(job["id"])


def test_unmeasured_or_unsampled_use_reads_no_use_data_never_idle() -> None:
    running = {"state": "running", "idle_since": None}
    assert use_text({**running, "recent_use": None}) == " · no use data"
    assert use_text({**running, "recent_use": {"busy": None, "measured": 0.0}}) == " · no use data"
    assert use_text({**running, "recent_use": {"busy": 0.37, "measured": 0.5}}) == " · 37 % busy (of the 50 % measured)"
    assert use_text({"state": "queued", "recent_use": None}) == ""
