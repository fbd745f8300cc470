"""Idle GPUs by use: a running job whose share sat (measured) below its project's threshold for a whole window.

Why by use: a Jupyter server knows when a notebook's tab last talked to its
kernel, not whether the kernel's GPU does anything. A long training cell with
no browser activity is busy; a kernel whose open tab keeps polling may hold a
quarter GPU for days with nothing on it. What the pool should give back is
the second, so the rule reads what the service samples each tick
(:func:`gpupool.service.gpu_use.job_use`: NVML per process, or the jobs' own
``gpupool.sim_use`` reports on simulated GPUs).

The rule, per project and kind (``ProjectRecord.idle``, set with
``PUT /projects/{name}`` ``{"idle": ...}``; docs/policy.md, "Idle GPUs"):

- a sample is *idle* when every GPU the job holds was measured and its use is
  below ``below_percent`` of its share; *busy* when measured and not below;
  *unmeasured* otherwise (a GPU NVML cannot read per process, a pod without a
  node agent). Only idle samples in a row make a stretch: a busy or unmeasured
  sample, or a gap between samples longer than ``max_gap_s`` (the service was
  stopped), starts the count again. Unmeasured time is never idle.
- a stretch that has lasted ``window_s`` flags the job: ``idle_since`` (the
  stretch's first sample) on its Job object, an ``idle`` event, and the
  rule's ``action``: ``cull`` (build kernels: the kernel's Jupyter server
  shuts it down after a notice when no cell runs, jupyter_gpupool.app),
  ``flag`` (shown only) or ``pause`` (training: paused with the checkpoint
  signal as a user pause is, sticky until its owner resumes it).
- a busy or unmeasured sample clears the flag (another ``idle`` event, with
  ``idle_since`` null).

Stretches live in memory: after a restart every job starts a new one, which
the rule wants anyway (the time the service was down was not measured).
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.backends.base import ForeignWork
from gpupool.service.attempts import Attempts
from gpupool.service.book import JobBook
from gpupool.service.gpu_use import JobUse
from gpupool.service.metrics import Metrics
from gpupool.service.store import JobRecord
from gpupool.wire.limits import IDLE_DEFAULTS
from gpupool.wire.schemas import validate as validate_body

DEFAULTS = IDLE_DEFAULTS
"""Kernels: culled after 30 min below 5 % of their share; training jobs: not watched until the admin says so."""


@dataclass(frozen=True)
class IdleRule:
    """One kind's rule in a project."""

    below_percent: float
    window_s: float
    action: str  # IDLE_ACTIONS[kind]; "off": not watched

    @property
    def on(self) -> bool:
        return self.action != "off"


def rules_of(stored: Mapping[str, Any] | None) -> dict[str, IdleRule]:
    """A project's rules per kind, defaults filled in (``stored``: ``ProjectRecord.idle``)."""
    out = {}
    for kind, default in DEFAULTS.items():
        mine = {**default, **dict((stored or {}).get(kind) or {})}
        out[kind] = IdleRule(float(mine["below_percent"]), float(mine["window_s"]), str(mine["action"]))
    return out


def settings_wire(stored: Mapping[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The rules in force, as the Project object shows them."""
    return {kind: {"below_percent": r.below_percent, "window_s": r.window_s, "action": r.action}
            for kind, r in rules_of(stored).items()}


def merge_settings(stored: Mapping[str, Any] | None, given: Any) -> dict[str, Any] | None:
    """What ``PUT /projects`` stores for ``{"idle": given}``.

    A kind or a field left out keeps its value; ``null`` goes back to the
    defaults. ``given`` is checked by the wire model (``ProjectFields.idle``,
    the one statement of what a rule may hold, which the API document shows
    too), here as well as at the HTTP layer since a caller of the core may
    skip that layer: a bad value is a 400 naming the field and its rule.
    """
    validate_body("ProjectFields", {"idle": given}, "project")
    if given is None:
        return None
    out = {kind: dict((stored or {}).get(kind) or {}) for kind in DEFAULTS}
    for kind, fields in given.items():
        for name, value in fields.items():
            out[kind][name] = value if name == "action" else float(value)
    return {kind: rule for kind, rule in out.items() if rule}


def iso(t: float) -> str:
    """A time as the Job object's ``idle_since`` gives it: ISO 8601, UTC, to the second."""
    return datetime.datetime.fromtimestamp(t, datetime.timezone.utc).isoformat(timespec="seconds")


def _span(seconds: float) -> str:
    if seconds >= 3600 and seconds % 3600 == 0:
        return f"{seconds / 3600:g} h"
    if seconds >= 60 and seconds % 60 == 0:
        return f"{seconds / 60:g} min"
    return f"{seconds:g} s"


def _who(rec: JobRecord) -> str:
    """How a reason names the job: "kernel nb.ipynb (j-000004)", "job train-resnet (j-000007)"."""
    what = "kernel" if rec.kind == "build" else "job"
    name = rec.name if rec.name.startswith(f"{what} ") else f"{what} {rec.name}"
    return f"{name} ({rec.id})"


@dataclass
class _Stretch:
    """One running job's count: where its current idle stretch began, and the flag."""

    last_t: float | None = None  # the previous sample
    start: float | None = None  # the first sample of the current idle stretch; None: not in one
    since: float | None = None  # the flag: set once the stretch has lasted the window
    action: str = ""


class IdleWatch:
    """Per running job, the idle stretch and its flag; fed each tick with that tick's uses (gpupool.service.periodic)."""

    def __init__(self, book: JobBook, attempts: Attempts, metrics: Metrics, max_gap_s: float,
                 foreign: ForeignWork | None = None) -> None:
        self.book = book
        self.foreign = foreign
        """The backend's foreign work (kubectl pods), whose jobs cannot be paused: ``pause`` only flags them."""
        self.attempts = attempts
        self.metrics = metrics
        self.max_gap_s = float(max_gap_s)
        self._jobs: dict[str, _Stretch] = {}

    # ---------------------------------------------------------------- reads
    def job_fields(self, rec: JobRecord) -> dict[str, Any]:
        """``idle_since`` and ``idle_action`` of the Job object (null unless it runs flagged)."""
        st = self._jobs.get(rec.id)
        if st is None or st.since is None or rec.state != "running":
            return {"idle_since": None, "idle_action": None}
        return {"idle_since": iso(st.since), "idle_action": st.action}

    def flagged(self) -> int:
        """How many running jobs are flagged idle now (the status's ``idle_running``)."""
        return sum(1 for st in self._jobs.values() if st.since is not None)

    # ---------------------------------------------------------------- the tick
    def observe(self, now: float, running: Iterable[JobRecord], uses: Mapping[str, JobUse]) -> None:
        """One sample: extend, start or end each running job's stretch; flag, clear and act."""
        projects = self.book.projects()
        rules: dict[str, dict[str, IdleRule]] = {}  # per project, read once per sample
        seen: set[str] = set()
        for rec in running:
            use = uses.get(rec.id)
            if rec.state != "running" or use is None or use.alloc <= 0 or rec.kind not in DEFAULTS:
                continue
            seen.add(rec.id)
            if rec.project not in rules:
                project = projects.get(rec.project)
                rules[rec.project] = rules_of(project.idle if project is not None else None)
            rule = rules[rec.project][rec.kind]
            st = self._jobs.setdefault(rec.id, _Stretch())
            gap = st.last_t is None or now - st.last_t > self.max_gap_s
            st.last_t = now
            if not rule.on:
                st.start = None
                if st.since is not None:
                    self._clear(rec, st, f"its project's idle rule for {rec.kind} jobs is off")
                continue
            if use.measured < use.alloc:
                st.start = None
                if st.since is not None:
                    self._clear(rec, st, "its GPU use is no longer measured (unmeasured time is never idle)")
                continue
            percent = 100.0 * use.used / use.alloc
            if percent >= rule.below_percent:
                st.start = None
                if st.since is not None:
                    self._clear(rec, st, f"busy again: {percent:.0f} % of its share")
                continue
            if st.start is None or gap:
                st.start = now
                if st.since is not None:
                    self._clear(rec, st, "its use was not sampled for a while (a new idle count begins)")
            if now - st.start < rule.window_s:
                if st.since is not None:
                    self._clear(rec, st, f"its project's idle window is now {_span(rule.window_s)}")
            elif st.since is None or st.action != rule.action:
                self._flag(rec, st, rule)
        for job_id in [j for j in self._jobs if j not in seen]:
            del self._jobs[job_id]  # ended, paused, or holds no GPU now: its next run counts afresh

    def _flag(self, rec: JobRecord, st: _Stretch, rule: IdleRule) -> None:
        """Flag the job (or flag it again under a rule whose action changed): its event, and a pause if the rule says."""
        st.since, st.action = st.start, rule.action
        assert st.since is not None
        base = (f"{_who(rec)} used under {rule.below_percent:g} % of its GPU share for "
                f"{_span(rule.window_s)} (since {iso(st.since)})")
        pausable = self.foreign is None or self.foreign.stands_for(rec) is None
        if rule.action == "cull":
            reason = f"{base}: its Jupyter server shuts it down after a notice, unless a cell is running"
        elif rule.action == "pause" and not pausable:
            reason = f"{base}: flagged idle (it stands for a pod made outside gpupool, which cannot be paused)"
        elif rule.action == "pause":
            reason = f"{base}: paused to give its GPUs back; resume it with: gpupool resume {rec.id}"
        else:
            reason = f"{base}: flagged idle"
        self.book.emit("idle", job_id=rec.id, name=rec.name, user=rec.user, project=rec.project, kind=rec.kind,
                       state=rec.state, idle_since=iso(st.since), action=rule.action, reason=reason)
        if rule.action == "pause" and rec.kind == "train" and rec.stop_intent is None and pausable:
            self.metrics.pauses.labels("idle").inc()
            self.attempts.begin_stop(rec, "pause", reason)

    def _clear(self, rec: JobRecord, st: _Stretch, why: str) -> None:
        if st.since is None:
            return
        st.since, st.action = None, ""
        self.book.emit("idle", job_id=rec.id, name=rec.name, user=rec.user, project=rec.project, kind=rec.kind,
                       state=rec.state, idle_since=None, action=None,
                       reason=f"{_who(rec)} is no longer idle: {why}")
