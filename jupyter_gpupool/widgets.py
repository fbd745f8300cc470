"""ipywidgets monitors of the pool and the queue, live in the notebook.

``PoolMonitor`` shows each GPU with its shares and memory, and each project's
build quota and training guarantee against use (over-quota in red) and its
pending and paused jobs, counted apart as ``gpupool status`` counts them.
``QueueMonitor`` lists queued, running and paused jobs, with pause / resume /
cancel buttons on the user's own jobs, except the job of the kernel the
monitor runs in (cancelling it would kill the notebook's own kernel). A
running job (a kernel's share too) says how busy it kept its share over the
last minute ("37 % busy"; "no use data" when it could not be measured, never
0 %) and, when the scheduler flags it idle by use, since when.

Live updates run as an asyncio task on the kernel's own event loop, waiting on
the scheduler's event long-poll: no thread ever touches a widget (widgets are
not thread-safe; see ipywidgets#4001). Rendering from a status dict is kept
separate from fetching it (:meth:`render`), so the widgets can be checked
without a kernel.

Every widget is a comm to the front end: creating one sends its whole state,
and a widget that is never closed stays registered in the kernel for ever. So
rows are kept across refreshes, keyed by GPU, project or job id; a refresh
sets only the traits whose value changed (ipywidgets sends nothing for an
unchanged pool), creates widgets only for new rows, and closes every widget of
a row that went away.
"""

from __future__ import annotations

import asyncio
import contextlib
import html
import os
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import Any

import ipywidgets as w

from gpupool.wire.states import LIVE_STATES
from jupyter_gpupool.kernel_share import fraction_label

LIVE_JOB_STATES = ",".join(LIVE_STATES)
GIB = 1024**3
ERROR_STYLE = "color:var(--jp-error-color1,#c00)"
WARN_STYLE = "color:var(--jp-warn-color0,#b60)"


def default_client() -> Any:
    """The async scheduler client for this kernel (GPUPOOL_URL / GPUPOOL_TOKEN from the provisioner)."""
    from gpupool.client import AsyncGpupoolClient

    return AsyncGpupoolClient()


def _gib(n: float | None) -> str:
    return "?" if n is None else f"{n / GIB:.1f} GiB"


def _gpus(n: float) -> str:
    """``1 GPU``, ``0.5 GPU``, ``2 GPUs``."""
    return f"{n:g} GPU{'s' if n > 1 else ''}"


def update(widget: w.Widget, **traits: Any) -> bool:
    """Set only the traits whose value differs; True when any did.

    Each trait set on a displayed widget is a comm message to the front end,
    so a refresh of an unchanged pool must set nothing. The changes of one
    widget go out together as one message (``hold_sync``).
    """
    changed = {name: value for name, value in traits.items() if getattr(widget, name) != value}
    if changed:
        with widget.hold_sync():
            for name, value in changed.items():
                setattr(widget, name, value)
    return bool(changed)


def close_tree(widget: w.Widget) -> None:
    """Close a widget with its children, layout and style.

    ``Widget.close()`` closes only the one comm: the ``Layout`` and style
    widgets every DOM widget makes for itself, and a box's children, would
    stay registered in the kernel.
    """
    for child in getattr(widget, "children", ()) or ():
        close_tree(child)
    for part in (getattr(widget, "layout", None), getattr(widget, "style", None)):
        if isinstance(part, w.Widget):
            part.close()
    widget.close()


def _sync_rows(rows: dict[str, Any], wanted: Iterable[tuple[str, Any]], make: Callable[[str], Any],
               fill: Callable[[Any, Any], None]) -> list[Any]:
    """Bring ``rows`` (key -> row) to ``wanted`` (key, data) in order; returns the rows in that order.

    A row that stays is filled in place, a new key gets a new row, and every
    row whose key is gone is closed and dropped.
    """
    order = []
    for key, data in wanted:
        row = rows.get(key)
        if row is None:
            row = rows[key] = make(key)
        fill(row, data)
        order.append(row)
    kept = {id(row) for row in order}
    for key in [k for k, row in rows.items() if id(row) not in kept]:
        rows.pop(key).close()
    return order


class _GpuRow:
    """One GPU: its name, how much of it is held, and who holds it."""

    def __init__(self) -> None:
        self.label = w.HTML("", layout=w.Layout(width="220px"))
        self.bar = w.FloatProgress(value=0.0, min=0.0, max=1.0, layout=w.Layout(width="180px"))
        self.text = w.HTML("")
        self.box = w.HBox([self.label, self.bar, self.text])

    def fill(self, item: tuple[dict[str, Any], dict[str, Any]]) -> None:
        node, gpu = item
        held = float(gpu.get("allocated") or 0)
        shares = ", ".join(
            f"{html.escape(a.get('project', ''))}/{html.escape(a.get('user', ''))} "
            f"{a.get('kind', '')} {fraction_label(float(a.get('fraction') or 0))}"
            for a in gpu.get("allocations", [])
        ) or "free"
        memory = _gib(gpu.get("memory"))
        if gpu.get("memory_used") is not None:
            memory = f"{_gib(gpu['memory_used'])} / {memory}"
        util = f", {gpu['utilization']:.0f}% busy" if gpu.get("utilization") is not None else ""
        update(self.label, value=f"{html.escape(node.get('name', ''))} GPU{gpu.get('index')} "
                                 f"{html.escape(str(gpu.get('model', '')))}")
        update(self.bar, value=min(held, 1.0))
        update(self.text, value=f"{held:.2f} held: {shares}; memory {memory}{util}")

    def close(self) -> None:
        close_tree(self.box)


class _ProjectRow:
    """One project: build use against quota, training use against guarantee, jobs waiting."""

    def __init__(self) -> None:
        self.name = w.HTML("", layout=w.Layout(width="140px"))
        self.build_text = w.HTML("")
        self.build = w.FloatProgress(value=0.0, min=0.0, max=1.0, bar_style="info", layout=w.Layout(width="140px"))
        self.train_text = w.HTML("")
        self.train = w.FloatProgress(value=0.0, min=0.0, max=1.0, bar_style="success",
                                     layout=w.Layout(width="140px"))
        self.box = w.HBox([self.name, self.build_text, self.build, self.train_text, self.train])

    def fill(self, item: tuple[dict[str, Any], int, int]) -> None:
        project, pending, paused = item
        usage = project.get("usage") or {}
        build_q = float(project.get("build_quota") or 0)
        train_g = float(project.get("train_guarantee") or 0)
        build_u = float(usage.get("build") or 0)
        train_u = float(usage.get("train") or 0)
        over = float(usage.get("train_over_quota") or max(train_u - train_g, 0))
        over_text = f" <span style='{ERROR_STYLE}'>(+{over:g} over guarantee)</span>" if over > 0 else ""
        waiting = f"{pending} pending" + (f", {paused} paused" if paused else "")
        update(self.name, value=f"<b>{html.escape(project.get('name', ''))}</b>")
        update(self.build_text, value=f"build {build_u:g} / {_gpus(build_q)}")
        update(self.train_text, value=f"train {train_u:g} / {_gpus(train_g)}{over_text}; {waiting}")
        # max before value: a value above the old max would be clipped by the trait's validation
        update(self.build, max=max(build_q, build_u, 1e-9), value=build_u,
               bar_style="danger" if build_u > build_q else "info")
        update(self.train, max=max(train_g, train_u, 1e-9), value=train_u,
               bar_style="danger" if over > 0 else "success")

    def close(self) -> None:
        close_tree(self.box)


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
            update(self.error, value=f"<span style='{ERROR_STYLE}'>{html.escape(str(err))}</span>")
            return
        update(self.error, value="")
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
            # also after a quiet long-poll: GPU memory and utilization change without events,
            # and a refresh that finds nothing changed sends nothing
            await self.refresh()

    def _close_rows(self) -> None:
        """Close the widgets of every row (each monitor keeps its own)."""

    def close(self) -> None:
        """Stop updates and close every widget this monitor made, so none stays registered."""
        self.stop()
        self._close_rows()
        for child in self.children:
            close_tree(child)
        for part in (self.layout, getattr(self, "style", None)):
            if isinstance(part, w.Widget):
                part.close()
        super().close()


class PoolMonitor(_LiveWidget):
    """GPUs with their shares and memory, and every project's quotas against use."""

    def __init__(self, client: Any = None, interval: float = 5.0, autostart: bool = True) -> None:
        self.header = w.HTML("")
        self.gpu_box = w.VBox()
        self.project_box = w.VBox()
        self.gpu_rows: dict[str, _GpuRow] = {}
        self.project_rows: dict[str, _ProjectRow] = {}
        super().__init__(client=client, interval=interval, autostart=autostart)
        self.children = [self.header, self.error, w.HTML("<b>GPUs</b>"), self.gpu_box,
                         w.HTML("<b>Projects</b>"), self.project_box]

    @property
    def gpu_bars(self) -> dict[str, w.FloatProgress]:
        """GPU id -> its bar (fraction held)."""
        return {key: row.bar for key, row in self.gpu_rows.items()}

    @property
    def project_bars(self) -> dict[str, dict[str, w.FloatProgress]]:
        """Project name -> {"build", "train"} bars."""
        return {key: {"build": row.build, "train": row.train} for key, row in self.project_rows.items()}

    async def fetch(self) -> Any:
        return await self.client.status()

    def render(self, status: dict[str, Any]) -> None:
        """Redraw from a scheduler status (``{"simulated", "pool", "projects", "queue"}``).

        A project's ``pending`` counts its queued jobs, ``paused`` its paused
        ones, as ``gpupool status`` shows them (docs/design.md, Project).
        """
        queue = status.get("queue") or {}
        sim = " (simulated GPUs)" if status.get("simulated") else ""
        update(self.header, value=(f"<b>gpupool</b>{sim}: {queue.get('running', 0)} running, "
                                   f"{queue.get('pending', 0)} pending, {queue.get('paused', 0)} paused"))
        gpus = [(str(gpu.get("id")), (node, gpu))
                for node in (status.get("pool") or {}).get("nodes", []) for gpu in node.get("gpus", [])]
        rows = _sync_rows(self.gpu_rows, gpus, lambda _key: _GpuRow(), _GpuRow.fill)
        update(self.gpu_box, children=tuple(row.box for row in rows))
        projects = [(p.get("name", ""), (p, int(p.get("pending") or 0), int(p.get("paused") or 0)))
                    for p in status.get("projects") or []]
        prows = _sync_rows(self.project_rows, projects, lambda _key: _ProjectRow(), _ProjectRow.fill)
        update(self.project_box, children=tuple(row.box for row in prows))

    def _close_rows(self) -> None:
        for rows in (self.gpu_rows, self.project_rows):
            for row in rows.values():
                row.close()
            rows.clear()


ICONS = {"pause": "pause", "resume": "play", "cancel": "times"}


def use_text(job: dict[str, Any]) -> str:
    """A running job's recent use and idle flag as HTML (" · 37 % busy"), as the Lab status bar words it.

    Unmeasured is not idle: a job whose use could not be measured, or that
    was not sampled yet, reads "no use data", never 0 %.
    """
    if job.get("state") != "running":
        return ""
    use = job.get("recent_use")
    if not use or use.get("busy") is None:
        text = " · no use data"
    else:
        text = f" · {round(float(use['busy']) * 100)} % busy"
        if float(use.get("measured", 1.0)) < 0.999:
            text += f" (of the {round(float(use['measured']) * 100)} % measured)"
    if job.get("idle_since"):
        text += f" · <span style='{WARN_STYLE}'>⚠ idle since {html.escape(_clock(str(job['idle_since'])))}</span>"
    return text


def _clock(iso: str) -> str:
    """An ISO time as this machine's clock time (the text as is when it is not one)."""
    try:
        return datetime.fromisoformat(iso).astimezone().strftime("%H:%M:%S")
    except ValueError:
        return iso


class _JobRow:
    """One job: a line of text and the buttons its owner may use on it."""

    def __init__(self, job_id: str, act: Callable[[str, str], None]) -> None:
        self.job_id = job_id
        self._act = act
        self.text = w.HTML("", layout=w.Layout(width="auto"))
        self.buttons: dict[str, w.Button] = {}
        self.box = w.HBox([self.text])

    def _button(self, action: str) -> w.Button:
        button = w.Button(description=action, icon=ICONS[action], layout=w.Layout(width="90px", flex="0 0 auto"),
                          button_style="danger" if action == "cancel" else "")
        button.on_click(lambda _b: self._act(self.job_id, action))
        return button

    def fill(self, job: dict[str, Any], actions: list[str], note: str) -> None:
        req = job.get("request") or {}
        amount = req.get("gpus") or req.get("gpu_fraction") or 0
        update(self.text, value=(
            f"{html.escape(job['id'])} · {html.escape(str(job.get('name', '')))} · "
            f"{html.escape(job.get('project', ''))}/{html.escape(job.get('user', ''))} · "
            f"<b>{html.escape(job.get('state', ''))}</b> · {fraction_label(float(amount)) if amount else 'CPU'}"
            f"{use_text(job)} · {html.escape(job.get('reason') or '')}{note}"))
        for action in [a for a in self.buttons if a not in actions]:
            close_tree(self.buttons.pop(action))
        self.buttons = {a: self.buttons[a] if a in self.buttons else self._button(a) for a in actions}
        update(self.box, children=(self.text, *self.buttons.values()))

    def close(self) -> None:
        close_tree(self.box)


class QueueMonitor(_LiveWidget):
    """Live jobs (queued, running, paused) with pause / resume / cancel on your own.

    ``kernel_job`` is the job of the kernel this monitor runs in (the
    provisioner's ``GPUPOOL_JOB_ID``; also found by its ``kernel_id`` label
    against ``GPUPOOL_KERNEL_ID``): it gets no buttons, since pausing or
    cancelling it would stop the kernel that runs the notebook.
    """

    def __init__(self, client: Any = None, interval: float = 5.0, autostart: bool = True,
                 user: str | None = None, kernel_job: str | None = None, kernel_id: str | None = None) -> None:
        self.user = user or os.environ.get("GPUPOOL_USER") or ""
        self.kernel_job = kernel_job if kernel_job is not None else os.environ.get("GPUPOOL_JOB_ID", "")
        self.kernel_id = kernel_id if kernel_id is not None else os.environ.get("GPUPOOL_KERNEL_ID", "")
        self.heading = w.HTML("<b>id · name · project/user · state · GPUs · use · reason</b>")
        self.empty = w.HTML("<i>no queued, running or paused jobs</i>")
        self.table = w.VBox([self.heading])
        self.rows: dict[str, _JobRow] = {}
        super().__init__(client=client, interval=interval, autostart=autostart)
        self.children = [self.error, self.table]

    @property
    def buttons(self) -> dict[str, dict[str, w.Button]]:
        """Job id -> the buttons shown on it (empty for other users' jobs and this kernel's)."""
        return {key: dict(row.buttons) for key, row in self.rows.items()}

    async def fetch(self) -> Any:
        if not self.user:
            who = await self.client.whoami()
            self.user = who.get("user", "")
        return await self.client.jobs(state=LIVE_JOB_STATES)

    def _act(self, job_id: str, action: str) -> None:
        """Button callback: run the action on the loop, then refresh."""
        async def go() -> None:
            try:
                await getattr(self.client, action)(job_id)
            except Exception as err:
                update(self.error, value=html.escape(f"{action} {job_id}: {err}"))
                return
            await self.refresh()

        with contextlib.suppress(RuntimeError):
            asyncio.get_event_loop().create_task(go())

    def is_this_kernel(self, job: dict[str, Any]) -> bool:
        """Whether ``job`` is the share of the kernel this monitor runs in."""
        if self.kernel_job and job.get("id") == self.kernel_job:
            return True
        return bool(self.kernel_id) and (job.get("labels") or {}).get("kernel_id") == self.kernel_id

    def actions(self, job: dict[str, Any]) -> list[str]:
        """The buttons ``job`` gets here: only the user's own, never this kernel's."""
        if job.get("user") != self.user or self.is_this_kernel(job):
            return []
        state = job.get("state")
        out = []
        if job.get("kind") == "train" and state in ("queued", "running"):
            out.append("pause")
        if state == "paused":
            out.append("resume")
        return [*out, "cancel"]

    def render(self, jobs: list[dict[str, Any]]) -> None:
        """Redraw from a list of jobs."""
        def fill(row: _JobRow, job: dict[str, Any]) -> None:
            row.fill(job, self.actions(job), " · <i>this kernel</i>" if self.is_this_kernel(job) else "")

        rows = _sync_rows(self.rows, [(job["id"], job) for job in jobs],
                          lambda key: _JobRow(key, self._act), fill)
        update(self.table, children=(self.heading, *(row.box for row in rows)) if rows else (self.heading, self.empty))

    def _close_rows(self) -> None:
        for row in self.rows.values():
            row.close()
        self.rows.clear()
        close_tree(self.heading)
        close_tree(self.empty)
