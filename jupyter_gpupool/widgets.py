"""ipywidgets monitors of the pool and the queue, live in the notebook.

``PoolMonitor`` shows each GPU with its shares and memory, and each project's
build quota and training guarantee against use (over-quota in red).
``QueueMonitor`` lists queued, running and paused jobs, with pause / resume /
cancel buttons on the user's own jobs.

Live updates run as an asyncio task on the kernel's own event loop, waiting on
the scheduler's event long-poll: no thread ever touches a widget (widgets are
not thread-safe; see ipywidgets#4001). Rendering from a status dict is kept
separate from fetching it (:meth:`render`), so the widgets can be checked
without a kernel.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import os
from typing import Any

import ipywidgets as w

from jupyter_gpupool.provisioner import fraction_label

LIVE_JOB_STATES = "queued,running,paused"
GIB = 1024**3


def default_client() -> Any:
    """The async scheduler client for this kernel (GPUPOOL_URL / GPUPOOL_TOKEN from the provisioner)."""
    from scheduler.client import AsyncGpupoolClient

    return AsyncGpupoolClient()


def _gib(n: float | None) -> str:
    return "?" if n is None else f"{n / GIB:.1f} GiB"


def _gpus(n: float) -> str:
    return f"{n:g} GPU"


class _LiveWidget(w.VBox):
    """Shared machinery: a client, a refresh, and an asyncio task that keeps it fresh."""

    def __init__(self, client: Any = None, interval: float = 5.0, autostart: bool = True, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.client = client if client is not None else default_client()
        self.interval = interval
        self.error = w.HTML("")
        self._task: asyncio.Task[Any] | None = None
        self._since = 0
        if autostart:
            self.start()

    async def fetch(self) -> Any:
        raise NotImplementedError

    def render(self, data: Any) -> None:
        raise NotImplementedError

    async def refresh(self) -> None:
        """Fetch once and redraw; a scheduler error is shown, not raised."""
        try:
            data = await self.fetch()
        except Exception as err:
            self.error.value = f"<span style='color:var(--jp-error-color1,#c00)'>{html.escape(str(err))}</span>"
            return
        self.error.value = ""
        self.render(data)

    def start(self) -> None:
        """Start live updates on the running loop (the kernel's); no-op without one."""
        if self._task is not None and not self._task.done():
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            loop = asyncio.get_event_loop()
        self._task = loop.create_task(self._run())

    def stop(self) -> None:
        """Stop live updates."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self) -> None:
        await self.refresh()
        while True:
            try:
                reply = await self.client.events(since=self._since, timeout=self.interval)
                self._since = int(reply.get("last", self._since))
            except asyncio.CancelledError:
                raise
            except Exception:
                await asyncio.sleep(self.interval)
            await self.refresh()

    def close(self) -> None:
        self.stop()
        super().close()


class PoolMonitor(_LiveWidget):
    """GPUs with their shares and memory, and every project's quotas against use."""

    def __init__(self, client: Any = None, interval: float = 5.0, autostart: bool = True) -> None:
        self.header = w.HTML("")
        self.gpu_box = w.VBox()
        self.project_box = w.VBox()
        self.gpu_bars: dict[str, w.FloatProgress] = {}
        self.project_bars: dict[str, dict[str, w.FloatProgress]] = {}
        super().__init__(client=client, interval=interval, autostart=autostart)
        self.children = [self.header, self.error, w.HTML("<b>GPUs</b>"), self.gpu_box,
                         w.HTML("<b>Projects</b>"), self.project_box]

    async def fetch(self) -> Any:
        return await self.client.status()

    def render(self, status: dict[str, Any]) -> None:
        """Redraw from a scheduler status (``{"simulated", "pool", "projects", "queue"}``)."""
        queue = status.get("queue") or {}
        sim = " (simulated GPUs)" if status.get("simulated") else ""
        self.header.value = (
            f"<b>gpupool</b>{sim}: {queue.get('running', 0)} running, "
            f"{queue.get('pending', 0)} pending, {queue.get('paused', 0)} paused"
        )
        rows, bars = [], {}
        for node in (status.get("pool") or {}).get("nodes", []):
            for gpu in node.get("gpus", []):
                bar = w.FloatProgress(value=min(float(gpu.get("allocated") or 0), 1.0), min=0.0, max=1.0,
                                      layout=w.Layout(width="180px"))
                shares = ", ".join(
                    f"{html.escape(a.get('project', ''))}/{html.escape(a.get('user', ''))} "
                    f"{a.get('kind', '')} {fraction_label(float(a.get('fraction') or 0))}"
                    for a in gpu.get("allocations", [])
                ) or "free"
                memory = _gib(gpu.get("memory"))
                if gpu.get("memory_used") is not None:
                    memory = f"{_gib(gpu['memory_used'])} / {memory}"
                util = f", {gpu['utilization']:.0f}% busy" if gpu.get("utilization") is not None else ""
                label = w.HTML(f"{html.escape(node.get('name', ''))} GPU{gpu.get('index')} "
                               f"{html.escape(str(gpu.get('model', '')))}", layout=w.Layout(width="220px"))
                text = w.HTML(f"{float(gpu.get('allocated') or 0):.2f} held: {shares}; memory {memory}{util}")
                rows.append(w.HBox([label, bar, text]))
                bars[str(gpu.get("id"))] = bar
        self.gpu_bars = bars
        self.gpu_box.children = rows
        prow, pbars = [], {}
        for project in status.get("projects") or []:
            usage = project.get("usage") or {}
            build_q = float(project.get("build_quota") or 0)
            train_g = float(project.get("train_guarantee") or 0)
            build_u = float(usage.get("build") or 0)
            train_u = float(usage.get("train") or 0)
            over = float(usage.get("train_over_quota") or max(train_u - train_g, 0))
            build = w.FloatProgress(value=build_u, min=0.0, max=max(build_q, build_u, 1e-9),
                                    bar_style="danger" if build_u > build_q else "info",
                                    layout=w.Layout(width="140px"))
            train = w.FloatProgress(value=train_u, min=0.0, max=max(train_g, train_u, 1e-9),
                                    bar_style="danger" if over > 0 else "success", layout=w.Layout(width="140px"))
            over_text = (f" <span style='color:var(--jp-error-color1,#c00)'>(+{over:g} over guarantee)</span>"
                         if over > 0 else "")
            prow.append(w.HBox([
                w.HTML(f"<b>{html.escape(project.get('name', ''))}</b>", layout=w.Layout(width="140px")),
                w.HTML(f"build {build_u:g} / {_gpus(build_q)}"), build,
                w.HTML(f"train {train_u:g} / {_gpus(train_g)}{over_text}; {project.get('pending', 0)} pending"),
                train,
            ]))
            pbars[project.get("name", "")] = {"build": build, "train": train}
        self.project_bars = pbars
        self.project_box.children = prow


class QueueMonitor(_LiveWidget):
    """Live jobs (queued, running, paused) with pause / resume / cancel on your own."""

    def __init__(self, client: Any = None, interval: float = 5.0, autostart: bool = True,
                 user: str | None = None) -> None:
        self.user = user or os.environ.get("GPUPOOL_USER") or ""
        self.table = w.VBox()
        self.buttons: dict[str, dict[str, w.Button]] = {}
        super().__init__(client=client, interval=interval, autostart=autostart)
        self.children = [self.error, self.table]

    async def fetch(self) -> Any:
        if not self.user:
            who = await self.client.whoami()
            self.user = who.get("user", "")
        return await self.client.jobs(state=LIVE_JOB_STATES)

    def _button(self, job: dict[str, Any], action: str) -> w.Button:
        icons = {"pause": "pause", "resume": "play", "cancel": "times"}
        button = w.Button(description=action, icon=icons[action], layout=w.Layout(width="90px", flex="0 0 auto"),
                          button_style="danger" if action == "cancel" else "")
        button.on_click(lambda _b, jid=job["id"], act=action: self._act(jid, act))
        return button

    def _act(self, job_id: str, action: str) -> None:
        """Button callback: run the action on the loop, then refresh."""
        async def go() -> None:
            try:
                await getattr(self.client, action)(job_id)
            except Exception as err:
                self.error.value = html.escape(f"{action} {job_id}: {err}")
                return
            await self.refresh()

        with contextlib.suppress(RuntimeError):
            asyncio.get_event_loop().create_task(go())

    def render(self, jobs: list[dict[str, Any]]) -> None:
        """Redraw from a list of jobs."""
        rows = [w.HTML("<b>id · name · project/user · state · GPUs · reason</b>")]
        buttons: dict[str, dict[str, w.Button]] = {}
        for job in jobs:
            req = job.get("request") or {}
            amount = req.get("gpus") or req.get("gpu_fraction") or 0
            text = w.HTML(
                f"{html.escape(job['id'])} · {html.escape(str(job.get('name', '')))} · "
                f"{html.escape(job.get('project', ''))}/{html.escape(job.get('user', ''))} · "
                f"<b>{html.escape(job.get('state', ''))}</b> · {fraction_label(float(amount)) if amount else 'CPU'} · "
                f"{html.escape(job.get('reason') or '')}",
                layout=w.Layout(width="auto"),
            )
            mine: dict[str, w.Button] = {}
            if job.get("user") == self.user:
                state = job.get("state")
                if job.get("kind") == "train" and state in ("queued", "running"):
                    mine["pause"] = self._button(job, "pause")
                if state == "paused":
                    mine["resume"] = self._button(job, "resume")
                mine["cancel"] = self._button(job, "cancel")
            buttons[job["id"]] = mine
            rows.append(w.HBox([text, *mine.values()]))
        if not jobs:
            rows.append(w.HTML("<i>no queued, running or paused jobs</i>"))
        self.buttons = buttons
        self.table.children = rows
