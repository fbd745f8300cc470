"""The notebook monitors against a real embedded scheduler: state after pool changes, buttons, live task.

Every widget is a comm: the traffic tests swap ipywidgets' comm factory for one
that records what each comm would send to the front end (its open with the
whole state, each state update, its close), so they see exactly the messages a
notebook would get, and count live widgets in ipywidgets' own registry.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import comm
import pytest
import pytest_asyncio
from ipywidgets.widgets.widget import _instances as live_widgets

from gpupool.app.embedded import EmbeddedScheduler
from gpupool.client import AsyncGpupoolClient
from jupyter_gpupool.widgets import PoolMonitor, QueueMonitor

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


class RecordingComm:
    """A comm that keeps, instead of sending, every message its widget would send to the front end."""

    ids = itertools.count()

    def __init__(self, log: list[tuple[str, Any]], data: Any) -> None:
        self.comm_id = f"test-comm-{next(self.ids)}"
        self.kernel = "recording"  # ipywidgets sends only through a comm with a kernel
        self.log = log
        log.append(("open", data))

    def on_msg(self, callback: Any) -> None:
        pass

    def send(self, data: Any = None, buffers: Any = None, **_: Any) -> None:
        self.log.append(("msg", data))

    def close(self, *_: Any, **__: Any) -> None:
        self.log.append(("close", None))


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, Any]]]:
    """The messages widgets send from now on (ipywidgets makes its comms through ``comm.create_comm``)."""
    log: list[tuple[str, Any]] = []
    monkeypatch.setattr(comm, "create_comm", lambda **kw: RecordingComm(log, kw.get("data")))
    yield log


async def busy_pool(pool: dict[str, Any]) -> dict[str, Any]:
    """A pool with a row of every kind: a build share, running and queued training, a paused job."""
    alice, bob = pool["alice"], pool["bob"]
    jobs = {
        "share": await alice.submit({"project": "alice", "kind": "build", "gpu_fraction": 0.5}),
        "paused": await alice.submit({"project": "alice", "kind": "train", "gpus": 1, "command": SLEEP}),
        "queued": await bob.submit({"project": "bob", "kind": "train", "gpus": 2, "command": SLEEP}),
    }
    await alice.pause(jobs["paused"]["id"])
    deadline = time.monotonic() + 10
    while (await alice.job(jobs["paused"]["id"]))["state"] != "paused":
        assert time.monotonic() < deadline, "job not paused"
        await asyncio.sleep(0.1)
    return jobs


async def first_samples(admin: AsyncGpupoolClient) -> None:
    """Wait until the service has sampled every GPU's use (simulated GPUs are sampled from the first tick)."""
    deadline = time.monotonic() + 30
    while not all("utilization" in gpu for node in (await admin.pool())["nodes"] for gpu in node["gpus"]):
        assert time.monotonic() < deadline, "no GPU use sampled"
        await asyncio.sleep(0.1)


async def test_unchanged_pool_sends_nothing_and_keeps_its_widgets(
    pool: dict[str, Any], sent: list[tuple[str, Any]]
) -> None:
    """A refresh of a pool where nothing changed creates no widget and sends no message."""
    await busy_pool(pool)
    await first_samples(pool["admin"])  # a GPU's first use sample changes its row once, rightly
    pm = PoolMonitor(client=pool["alice"], autostart=False)
    qm = QueueMonitor(client=pool["alice"], autostart=False)
    await pm.refresh()
    await qm.refresh()
    assert len(pm.gpu_bars) == 2 and set(pm.project_bars) == {"alice", "bob"} and len(qm.buttons) == 3
    widgets = len(live_widgets)
    sent.clear()
    for _ in range(25):
        await pm.refresh()
        await qm.refresh()
    assert len(live_widgets) == widgets
    assert sent == []
    pm.close()
    qm.close()


async def test_a_change_updates_rows_in_place(pool: dict[str, Any], sent: list[tuple[str, Any]]) -> None:
    """A new share changes the one GPU row's traits: no widget is made or closed."""
    alice = pool["alice"]
    pm = PoolMonitor(client=alice, autostart=False)
    await pm.refresh()
    bars = pm.gpu_bars
    widgets = len(live_widgets)
    sent.clear()
    share = await alice.submit({"project": "alice", "kind": "build", "gpu_fraction": 0.5})
    await pm.refresh()
    gpu = share["assignment"]["gpus"][0]["id"]
    assert pm.gpu_bars == bars and pm.gpu_bars[gpu].value == 0.5
    assert len(live_widgets) == widgets
    kinds = {kind for kind, _ in sent}
    assert kinds == {"msg"}, sent  # updates only: nothing opened, nothing closed
    assert all(set(data["state"]) <= {"value", "max", "bar_style"} for _, data in sent), sent
    pm.close()


async def test_rows_come_and_go_with_jobs(pool: dict[str, Any], sent: list[tuple[str, Any]]) -> None:
    """A new job gets a row; a finished one's row is closed, widget by widget, and the count is back."""
    alice, bob = pool["alice"], pool["bob"]
    qm = QueueMonitor(client=alice, autostart=False)
    await qm.refresh()
    assert qm.buttons == {} and qm.empty in qm.table.children
    before = len(live_widgets)

    mine = await alice.submit({"project": "alice", "kind": "train", "gpus": 1, "command": SLEEP})
    theirs = await bob.submit({"project": "bob", "kind": "train", "gpus": 1, "command": SLEEP})
    await qm.refresh()
    assert set(qm.buttons) == {mine["id"], theirs["id"]} and qm.empty not in qm.table.children
    assert [row.text.value.split(" · ")[0] for row in (qm.rows[theirs["id"]], qm.rows[mine["id"]])] == \
        [theirs["id"], mine["id"]]
    assert qm.table.children[1:] == (qm.rows[theirs["id"]].box, qm.rows[mine["id"]].box)  # newest first
    grown = len(live_widgets)
    assert grown > before

    gone = qm.rows[theirs["id"]]
    gone_widgets = [gone.box, gone.box.layout, gone.text, gone.text.layout, gone.text.style]
    gone_ids = {widget.model_id for widget in gone_widgets}
    await bob.cancel(theirs["id"])
    await qm.refresh()
    assert set(qm.buttons) == {mine["id"]} and qm.table.children[1:] == (qm.rows[mine["id"]].box,)
    assert all(widget.comm is None for widget in gone_widgets)  # closed: the front end drops them
    assert not gone_ids & set(live_widgets)
    assert ("close", None) in sent
    one_job = len(live_widgets)
    assert one_job == grown - len(gone_widgets)

    await alice.cancel(mine["id"])
    await qm.refresh()
    assert qm.buttons == {} and qm.empty in qm.table.children
    assert len(live_widgets) == before
    for _ in range(5):  # the same job mix again: the same number of widgets, not more each time
        job = await alice.submit({"project": "alice", "kind": "train", "gpus": 1, "command": SLEEP})
        await qm.refresh()
        assert len(live_widgets) == one_job
        await alice.cancel(job["id"])
        await qm.refresh()
        assert len(live_widgets) == before
    qm.close()


async def test_pause_and_resume_swap_buttons_without_leaking(pool: dict[str, Any], sent: list[tuple[str, Any]]) -> None:
    alice = pool["alice"]
    job = await alice.submit({"project": "alice", "kind": "train", "gpus": 1, "command": SLEEP})
    qm = QueueMonitor(client=alice, autostart=False)
    await qm.refresh()
    assert set(qm.buttons[job["id"]]) == {"pause", "cancel"}
    widgets = len(live_widgets)
    cancel = qm.buttons[job["id"]]["cancel"]
    pause = qm.buttons[job["id"]]["pause"]
    pause.click()
    await eventually(lambda: "resume" in qm.buttons.get(job["id"], {}))
    assert set(qm.buttons[job["id"]]) == {"resume", "cancel"}
    assert qm.buttons[job["id"]]["cancel"] is cancel and pause.comm is None
    assert len(live_widgets) == widgets
    await alice.cancel(job["id"])
    qm.close()


async def test_closing_the_monitors_closes_all_their_widgets(pool: dict[str, Any]) -> None:
    await busy_pool(pool)
    before = len(live_widgets)
    pm = PoolMonitor(client=pool["alice"], autostart=False)
    qm = QueueMonitor(client=pool["alice"], autostart=False)
    await pm.refresh()
    await qm.refresh()
    assert len(live_widgets) > before
    pm.close()
    qm.close()
    assert len(live_widgets) == before


async def test_pool_monitor_counts_paused_jobs_apart(pool: dict[str, Any]) -> None:
    """As `gpupool status` does: a paused job is paused, not pending, in the project's row."""
    jobs = await busy_pool(pool)
    pm = PoolMonitor(client=pool["alice"], autostart=False)
    await pm.refresh()
    status = await pool["alice"].status()
    assert status["queue"]["paused"] == 1
    assert "1 paused" in pm.header.value
    rows = {name: row.train_text.value for name, row in pm.project_rows.items()}
    assert rows["alice"].endswith("; 0 pending, 1 paused"), rows
    assert rows["bob"].endswith("; 1 pending"), rows  # bob's 2-GPU job waits for alice's share
    assert (await pool["bob"].job(jobs["queued"]["id"]))["state"] == "queued"
    pm.close()


async def test_queue_monitor_offers_no_button_on_its_own_kernel(
    pool: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The kernel running the monitor cannot be cancelled from it: found by the provisioner's job id or kernel label."""
    alice = pool["alice"]
    kernel = await alice.submit({"project": "alice", "kind": "build", "gpu_fraction": 0.25,
                                 "labels": {"kernel_id": "k-this"}})
    other = await alice.submit({"project": "alice", "kind": "build", "gpu_fraction": 0.25,
                                "labels": {"kernel_id": "k-other"}})
    monkeypatch.setenv("GPUPOOL_JOB_ID", kernel["id"])  # what the provisioner gives the kernel
    monkeypatch.setenv("GPUPOOL_KERNEL_ID", "k-this")
    qm = QueueMonitor(client=alice, autostart=False)
    await qm.refresh()
    assert qm.buttons[kernel["id"]] == {}
    assert "this kernel" in qm.rows[kernel["id"]].text.value
    assert set(qm.buttons[other["id"]]) == {"cancel"}
    assert "this kernel" not in qm.rows[other["id"]].text.value
    qm.close()

    monkeypatch.delenv("GPUPOOL_JOB_ID")  # a kernel found by its label alone
    qm = QueueMonitor(client=alice, autostart=False)
    await qm.refresh()
    assert qm.buttons[kernel["id"]] == {} and set(qm.buttons[other["id"]]) == {"cancel"}
    qm.close()
