"""The notebook monitors against a real embedded scheduler: state after pool changes, buttons, live task."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from jupyter_gpupool.widgets import PoolMonitor, QueueMonitor
from scheduler.client import AsyncGpupoolClient
from scheduler.service.embedded import EmbeddedScheduler

pytestmark = pytest.mark.timeout(120)


@pytest_asyncio.fixture
async def pool(tmp_path: Any) -> AsyncIterator[dict[str, Any]]:
    sched = EmbeddedScheduler(
        tmp_path / "state", simulate="2xA100-80GB",
        projects={"alice": {"build_quota": 1, "train_guarantee": 1}, "bob": {"build_quota": 1, "train_guarantee": 1}},
        config={"tick_s": 0.2, "poll_s": 0.05, "min_runtime_s": 0.0, "pause_grace_s": 1.0},
    )
    await sched.start()
    admin = AsyncGpupoolClient(sched.url, sched.admin_token)
    clients = {u: AsyncGpupoolClient(sched.url, (await admin.create_token(u))["token"]) for u in ("alice", "bob")}
    try:
        yield {"sched": sched, "admin": admin, **clients}
    finally:
        await sched.stop()


async def eventually(check: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.1)


SLEEP = [sys.executable, "-c", "import time; time.sleep(60)"]


async def test_pool_monitor_follows_the_pool(pool: dict[str, Any]) -> None:
    alice = pool["alice"]
    monitor = PoolMonitor(client=alice, autostart=False)
    await monitor.refresh()
    assert len(monitor.gpu_bars) == 2 and all(b.value == 0 for b in monitor.gpu_bars.values())
    assert monitor.project_bars["alice"]["build"].value == 0

    share = await alice.submit({"project": "alice", "kind": "build", "gpu_fraction": 0.5})
    gpu = share["assignment"]["gpus"][0]["id"]
    await monitor.refresh()
    assert monitor.gpu_bars[gpu].value == 0.5
    assert monitor.project_bars["alice"]["build"].value == 0.5
    assert monitor.project_bars["alice"]["build"].bar_style == "info"
    row_text = " ".join(c.value for row in monitor.gpu_box.children for c in row.children if hasattr(c, "value")
                        and isinstance(c.value, str))
    assert "alice/alice build ½ GPU" in row_text

    # alice borrows bob's idle GPU beyond her training guarantee of 1 GPU: visible as over quota
    await alice.cancel(share["id"])
    jobs = [await alice.submit({"project": "alice", "kind": "train", "gpus": 1, "command": SLEEP}) for _ in range(2)]
    for _ in range(100):
        await monitor.refresh()
        if monitor.project_bars["alice"]["train"].value >= 2:
            break
        await asyncio.sleep(0.1)
    assert monitor.project_bars["alice"]["train"].value == 2
    assert monitor.project_bars["alice"]["train"].bar_style == "danger"
    texts = [c.value for row in monitor.project_box.children for c in row.children
             if isinstance(getattr(c, "value", None), str)]
    assert any("train 2 / 1 GPU" in t and "+1 over guarantee" in t for t in texts), texts
    assert monitor.project_bars["bob"]["train"].bar_style == "success"
    for job in jobs:
        await alice.cancel(job["id"])
    monitor.close()


async def test_queue_monitor_buttons_and_live_updates(pool: dict[str, Any]) -> None:
    alice, bob = pool["alice"], pool["bob"]
    mine = await alice.submit({"project": "alice", "kind": "train", "gpus": 1, "command": SLEEP})
    theirs = await bob.submit({"project": "bob", "kind": "train", "gpus": 1, "command": SLEEP})
    monitor = QueueMonitor(client=alice, autostart=False)
    await monitor.refresh()
    assert monitor.user == "alice"
    assert set(monitor.buttons) == {mine["id"], theirs["id"]}
    assert set(monitor.buttons[mine["id"]]) == {"pause", "cancel"}
    assert monitor.buttons[theirs["id"]] == {}

    monitor.buttons[mine["id"]]["pause"].click()
    await eventually(lambda: "resume" in monitor.buttons.get(mine["id"], {}))
    assert (await alice.job(mine["id"]))["state"] == "paused"

    # live: the asyncio task on this loop picks up changes made elsewhere
    monitor.start()
    third = await alice.submit({"project": "alice", "kind": "train", "gpu_fraction": 0.5, "command": SLEEP})
    await eventually(lambda: third["id"] in monitor.buttons)
    await bob.cancel(theirs["id"])
    await eventually(lambda: theirs["id"] not in monitor.buttons)
    monitor.stop()
    for job in (mine, third):
        await alice.cancel(job["id"])
    monitor.close()
