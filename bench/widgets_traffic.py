"""What the notebook monitors cost a kernel: live widgets and comm traffic per minute (issue 22, item 8).

Run from the project root::

    python -m bench.widgets_traffic                 # 10 minutes on a quiet pool
    python -m bench.widgets_traffic --minutes 2 --churn 20

Starts an embedded scheduler (simulated GPUs) in this process with a pool
that holds a row of every kind (a notebook's ½ GPU share, a running training
job, a paused one, and another user's job queued behind them), then a real
``python3`` kernel whose environment points at it, as the provisioner's would.
In the kernel it creates and displays ``PoolMonitor`` and ``QueueMonitor``
(refreshing every ``--interval`` seconds, the widgets' default 5 s) and then
only listens: it reads the kernel's IOPub socket raw and counts every comm
message (``comm_open``, ``comm_msg``, ``comm_close``: what the front end
would receive for the widgets) with its bytes on the wire, and once a minute
asks the kernel how many widgets ipywidgets holds live. ``--churn S`` also
submits a new job and cancels the last one every S seconds, so rows come and
go. ``--widgets FILE`` loads the monitors from another copy of ``widgets.py``
(an older one, to compare). Prints one table; ``--json`` prints the numbers
only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from jupyter_client.manager import AsyncKernelManager

from gpupool.app.embedded import EmbeddedScheduler
from gpupool.client import AsyncGpupoolClient
from gpupool.wire.errors import GpupoolError

ROOT = Path(__file__).resolve().parents[1]
SLEEP = [sys.executable, "-c", "import time; time.sleep(10**6)"]
COMM_TYPES = ("comm_open", "comm_msg", "comm_close")
MARK = "GPUPOOL-BENCH-WIDGETS="


def monitor_code(widgets: str | None, interval: float) -> str:
    """The cell a user would run, optionally taking the monitors from another file."""
    if widgets:
        load = ("import importlib.util\n"
                f"spec = importlib.util.spec_from_file_location('bench_widgets', {widgets!r})\n"
                "mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)\n"
                "PoolMonitor, QueueMonitor = mod.PoolMonitor, mod.QueueMonitor\n")
    else:
        load = "from jupyter_gpupool.widgets import PoolMonitor, QueueMonitor\n"
    return (load + "from IPython.display import display\n"
            f"pm, qm = PoolMonitor(interval={interval}), QueueMonitor(interval={interval})\n"
            "display(pm, qm)\n")


COUNT_CODE = f"from ipywidgets.widgets.widget import _instances\nprint('{MARK}%d' % len(_instances))\n"


class IopubCounter:
    """Reads the kernel's IOPub socket raw: comm messages and their bytes, and the widget counts printed."""

    def __init__(self, kc: Any) -> None:
        self.kc = kc
        self.messages = 0
        self.bytes = 0
        self.by_type = dict.fromkeys(COMM_TYPES, 0)
        self.counts: asyncio.Queue[int] = asyncio.Queue()

    async def run(self) -> None:
        socket = self.kc.iopub_channel.socket
        session = self.kc.session
        while True:
            frames = await socket.recv_multipart(copy=True)
            _idents, parts = session.feed_identities(frames)
            msg = session.deserialize(parts, content=True)
            kind = msg["header"]["msg_type"]
            if kind in COMM_TYPES:
                self.messages += 1
                self.bytes += sum(len(f) for f in frames)
                self.by_type[kind] += 1
            elif kind == "stream" and MARK in msg["content"].get("text", ""):
                text = msg["content"]["text"]
                self.counts.put_nowait(int(text.split(MARK, 1)[1].split()[0]))


async def execute(kc: Any, code: str) -> None:
    """Run a cell and wait for its reply; raise with the kernel's error if it failed."""
    msg_id = kc.execute(code)
    while True:
        reply = await kc.get_shell_msg(timeout=60)
        if reply["parent_header"].get("msg_id") == msg_id:
            break
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"kernel error: {reply['content'].get('ename')}: {reply['content'].get('evalue')}")


async def widget_count(kc: Any, counter: IopubCounter) -> int:
    await execute(kc, COUNT_CODE)
    return await asyncio.wait_for(counter.counts.get(), 30)


async def quiet_pool(alice: AsyncGpupoolClient, bob: AsyncGpupoolClient) -> list[str]:
    """A ½ GPU share, a running and a paused training job of alice's, bob's job queued behind them."""
    jobs = [await alice.submit({"project": "alice", "kind": "build", "gpu_fraction": 0.5, "name": "kernel nb.ipynb"}),
            await alice.submit({"project": "alice", "kind": "train", "gpus": 1, "command": SLEEP, "name": "run"}),
            await alice.submit({"project": "alice", "kind": "train", "gpus": 1, "command": SLEEP, "name": "later"})]
    jobs.append(await bob.submit({"project": "bob", "kind": "train", "gpus": 4, "command": SLEEP, "name": "big"}))
    await alice.pause(jobs[2]["id"])
    deadline = time.monotonic() + 30
    while (await alice.job(jobs[2]["id"]))["state"] != "paused":
        if time.monotonic() > deadline:
            raise SystemExit("the job to pause did not pause")
        await asyncio.sleep(0.2)
    return [j["id"] for j in jobs]


async def run(minutes: float, interval: float, churn: float, widgets: str | None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        sched = EmbeddedScheduler(
            Path(tmp) / "state", simulate="4xA100-80GB",
            projects={"alice": {"build_quota": 1, "train_guarantee": 2}, "bob": {"build_quota": 1, "train_guarantee": 2}},
            config={"min_runtime_s": 0.0, "run_jobs_as": "service"},  # jobs as this account: the bench is about widgets
            publish=False,  # no runtime file: the user's own `gpupool` must never find this scheduler
        )
        await sched.start()
        admin = AsyncGpupoolClient(sched.url, sched.admin_token)
        tokens = {u: (await admin.create_token(u))["token"] for u in ("alice", "bob")}
        alice, bob = (AsyncGpupoolClient(sched.url, tokens[u]) for u in ("alice", "bob"))
        standing = await quiet_pool(alice, bob)

        env = dict(os.environ, GPUPOOL_URL=sched.url, GPUPOOL_TOKEN=tokens["alice"], GPUPOOL_USER="alice",
                   GPUPOOL_JOB_ID=standing[0], PYTHONPATH=str(ROOT))
        km = AsyncKernelManager(kernel_name="python3")
        await km.start_kernel(env=env, cwd=tmp)
        kc = km.client()
        kc.start_channels()
        counter = IopubCounter(kc)
        reader: asyncio.Future[Any] | None = None
        churner: asyncio.Future[Any] | None = None
        renewer: asyncio.Future[Any] | None = None
        rows: list[dict[str, Any]] = []
        try:
            await kc.wait_for_ready(timeout=60)  # reads IOPub itself: the counter starts after it
            reader = asyncio.ensure_future(counter.run())
            await execute(kc, monitor_code(widgets, interval))
            await asyncio.sleep(min(interval, 5) + 1)  # the first refresh has drawn every row
            rows.append({"minute": 0, "widgets": await widget_count(kc, counter),
                         "messages": counter.messages, "kib": counter.bytes / 1024})
            renewer = asyncio.ensure_future(renew(alice, standing[0]))
            if churn > 0:
                churner = asyncio.ensure_future(churn_jobs(alice, churn))
            last_m, last_b = counter.messages, counter.bytes
            start = time.monotonic()
            minute = 0
            while minute < minutes:
                minute += 1
                await asyncio.sleep(max(0.0, start + 60 * min(minute, minutes) - time.monotonic()))
                count = await widget_count(kc, counter)
                rows.append({"minute": minute, "widgets": count, "messages": counter.messages - last_m,
                             "kib": (counter.bytes - last_b) / 1024})
                last_m, last_b = counter.messages, counter.bytes
        finally:
            for task in (churner, renewer):
                if task is not None:
                    task.cancel()
            if reader is not None:
                reader.cancel()
            kc.stop_channels()
            await km.shutdown_kernel(now=True)
            for owner, job_id in zip((alice, alice, alice, bob), standing, strict=True):
                with contextlib.suppress(GpupoolError):  # gone already: nothing to clean up
                    await owner.cancel(job_id)
            await sched.stop()
        return {"minutes": minutes, "interval_s": interval, "churn_s": churn, "widgets_file": widgets,
                "rows": rows, "by_type": counter.by_type,
                "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}"}


async def renew(client: AsyncGpupoolClient, job_id: str) -> None:
    """Keep the notebook's share alive, as its provisioner would (a build job's lease runs out otherwise)."""
    while True:
        await asyncio.sleep(20)
        await client.renew(job_id)


async def churn_jobs(client: AsyncGpupoolClient, every: float) -> None:
    """Rows that come and go: a new ¼ GPU share every ``every`` seconds, the previous one cancelled."""
    last: str | None = None
    while True:
        job = await client.submit({"project": "alice", "kind": "build", "gpu_fraction": 0.25, "name": "churn"})
        if last is not None:
            await client.cancel(last)
        last = job["id"]
        await asyncio.sleep(every)


def print_table(result: dict[str, Any]) -> None:
    rows = result["rows"]
    print(f"widgets traffic: PoolMonitor + QueueMonitor displayed in one kernel, refresh every "
          f"{result['interval_s']:g} s, {result['minutes']:g} min"
          + (f", a job in and one out every {result['churn_s']:g} s" if result["churn_s"] else ", quiet pool")
          + (f", widgets from {result['widgets_file']}" if result["widgets_file"] else ""))
    print(f"machine: {result['machine']}")
    print(f"{'minute':>6}  {'live widgets':>12}  {'comm msgs':>9}  {'KiB':>9}")
    for row in rows:
        label = "start" if row["minute"] == 0 else str(row["minute"])
        print(f"{label:>6}  {row['widgets']:>12}  {row['messages']:>9}  {row['kib']:>9.1f}")
    later = rows[1:]
    if later:
        msgs = sum(r["messages"] for r in later) / len(later)
        kib = sum(r["kib"] for r in later) / len(later)
        print(f"after start: {msgs:.1f} comm messages/min, {kib:.1f} KiB/min; live widgets "
              f"{rows[0]['widgets']} at start, {min(r['widgets'] for r in later)}-{max(r['widgets'] for r in later)} "
              f"after; by type {result['by_type']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long to listen (default 10)")
    parser.add_argument("--interval", type=float, default=5.0, help="the monitors' refresh interval (default 5 s)")
    parser.add_argument("--churn", type=float, default=0.0, metavar="S",
                        help="submit a job and cancel the last every S seconds (default: a quiet pool)")
    parser.add_argument("--widgets", help="load the monitors from this widgets.py instead (to compare)")
    parser.add_argument("--json", action="store_true", help="print the numbers only")
    args = parser.parse_args()
    if args.minutes <= 0:
        parser.error("--minutes must be positive")
    widgets = str(Path(args.widgets).resolve()) if args.widgets else None
    result = asyncio.run(run(args.minutes, args.interval, args.churn, widgets))
    if args.json:
        print(json.dumps(result))
    else:
        print_table(result)


if __name__ == "__main__":
    main()
