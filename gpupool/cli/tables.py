"""Human-readable output of the `gpupool` CLI: tables and key/value blocks.

Kept apart from :mod:`gpupool.cli.main` (argument parsing and calls) so that the
shapes on screen can change without touching command logic, and so the
formatters can be tested on plain dicts.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from typing import Any

from gpupool.wire.limits import IDLE_DEFAULTS
from gpupool.wire.plain_text import escape

GIB = 2**30


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Left-aligned columns separated by two spaces; empty cells print as '-'.

    Every cell is escaped (:func:`gpupool.wire.plain_text.escape`): cells hold other users' names, labels and
    reasons, which must show as text, never act on the reader's terminal.
    """
    cells = [[("-" if v is None or v == "" else escape(str(v))) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, v in enumerate(row):
            widths[i] = max(widths[i], len(v))
    lines = ["  ".join(h.ljust(widths[i]) for i, h in enumerate(headers)).rstrip()]
    lines += ["  ".join(v.ljust(widths[i]) for i, v in enumerate(row)).rstrip() for row in cells]
    return "\n".join(lines)


def gpus_text(value: Any) -> str:
    """A GPU amount for people: 2, 1.5, 0.25 (no trailing zeros)."""
    if value is None:
        return "-"
    try:
        number = float(value)
    except (TypeError, ValueError):
        return str(value)
    return f"{number:.3f}".rstrip("0").rstrip(".") or "0"


def bytes_text(value: Any) -> str:
    if value is None:
        return "-"
    number = float(value)
    for unit, size in (("TiB", 2**40), ("GiB", GIB), ("MiB", 2**20), ("KiB", 1024)):
        if number >= size:
            return f"{number / size:.1f}".rstrip("0").rstrip(".") + unit
    return f"{int(number)}B"


def ago(t: Any, now: float | None = None) -> str:
    """'12s ago', '5m ago', '3h ago', '2d ago' from a Unix time."""
    if t is None:
        return "-"
    delta = max(0.0, (now if now is not None else time.time()) - float(t))
    return duration(delta) + " ago"


def duration(seconds: float) -> str:
    if seconds < 60:
        return f"{int(seconds)}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m"
    if seconds < 86400:
        return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"
    return f"{int(seconds // 86400)}d{int(seconds % 86400 // 3600)}h"


def request_text(job: dict[str, Any]) -> str:
    """What a job asked for, e.g. '1 GPU', '2 GPUs', '2 × 8 GPUs' (a gang of 2 replicas), '0.25 GPU', '20GiB GPU', 'CPU'."""
    req = job.get("request") or {}
    model = f" {req['gpu_model']}" if req.get("gpu_model") else ""
    replicas = _count(req.get("replicas"))
    if req.get("gpus"):
        whole = f"{gpus_text(req['gpus'])} GPU{'' if gpus_text(req['gpus']) == '1' else 's'}{model}"
        return f"{replicas} × {whole}" if replicas > 1 else whole
    if req.get("gpu_fraction"):
        return f"{gpus_text(req['gpu_fraction'])} GPU{model}"
    if req.get("gpu_memory"):
        return f"{bytes_text(req['gpu_memory'])} GPU{model}"
    return "CPU"


def _count(value: Any) -> int:
    if isinstance(value, list | tuple | dict):
        return len(value)
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def jobs_table(jobs: Sequence[dict[str, Any]]) -> str:
    if not jobs:
        return "no jobs"
    now = time.time()
    rows = [
        (j.get("id"), _clip(j.get("name"), 24), j.get("project"), j.get("user"), j.get("kind"),
         str(j.get("state") or "") + ("*" if j.get("preemptible") and j.get("state") == "running" else "")
         + (" idle" if j.get("idle_since") else ""),
         request_text(j), j.get("priority"), ago(j.get("submitted_at"), now), _clip(j.get("reason"), 60))
        for j in jobs
    ]
    out = table(["ID", "NAME", "PROJECT", "USER", "KIND", "STATE", "REQUEST", "PRIO", "SUBMITTED", "REASON"], rows)
    if any(j.get("preemptible") and j.get("state") == "running" for j in jobs):
        out += "\n(* running beyond its project's guarantee: may be paused to give GPUs back)"
    if any(j.get("idle_since") for j in jobs):
        out += ("\n(idle: its GPU share has been used below its project's idle threshold for the whole window; "
                "gpupool describe says since when)")
    return out


def projects_table(projects: Sequence[dict[str, Any]]) -> str:
    if not projects:
        return "no projects"
    rows = []
    for p in projects:
        usage = p.get("usage") or {}
        limit = p.get("train_limit")
        rows.append((
            p.get("name"),
            f"{gpus_text(usage.get('build', 0))}/{gpus_text(p.get('build_quota'))}",
            f"{gpus_text(usage.get('train', 0))}/{gpus_text(p.get('train_guarantee'))}",
            gpus_text(usage.get("train_over_quota", 0)),
            "none" if limit is None else gpus_text(limit),
            gpus_text(p.get("weight")),
            p.get("pending", 0),
            p.get("paused", 0),
            recent_text(p),
            standing_text(p),
            members_text(p),
        ))
    out = table(["PROJECT", "BUILD USE/QUOTA", "TRAIN USE/GUARANTEE", "OVER", "LIMIT", "WEIGHT", "PENDING", "PAUSED",
                 "RECENT GPU-h", "OF FAIR SHARE", "MEMBERS"], rows)
    if any(isinstance(p.get("fair_share"), dict) and p["fair_share"].get("percent") is not None for p in projects):
        out += ("\n(OF FAIR SHARE: the training GPUs a project runs now plus those it held on average lately, as "
                "a share of what it is entitled to when every project wants GPUs;\n idle GPUs beyond guarantees go "
                "first to the projects lowest here, see docs/policy.md)")
    idle = [f"  {p.get('name')}: {idle_text(p['idle'])}" for p in projects
            if isinstance(p.get("idle"), dict) and p["idle"] != IDLE_DEFAULTS]
    if idle:
        out += "\nidle rules (others: the defaults, " + idle_text(IDLE_DEFAULTS) + "):\n" + "\n".join(idle)
    return out


def idle_text(rules: dict[str, Any]) -> str:
    """'build: cull below 5% for 30 min; train: off' (a project's idle rules, docs/policy.md)."""
    parts = []
    for kind in ("build", "train"):
        rule = rules.get(kind) or {}
        if rule.get("action") in (None, "off"):
            parts.append(f"{kind}: off")
            continue
        window = float(rule.get("window_s") or 0)
        span = f"{window / 3600:g} h" if window >= 3600 else f"{window / 60:g} min" if window >= 60 else f"{window:g} s"
        parts.append(f"{kind}: {rule['action']} below {float(rule.get('below_percent') or 0):g}% for {span}")
    return "; ".join(parts)


def standing_text(project: dict[str, Any]) -> str:
    """'40% of 4' (training use now plus lately as a share of the long-run fair share of 4 GPUs), or '-'."""
    fair = project.get("fair_share")
    if not isinstance(fair, dict) or fair.get("percent") is None:
        return "-"
    return f"{fair['percent']}% of {gpus_text(fair.get('gpus'))}"


def recent_text(project: dict[str, Any]) -> str:
    """The GPU-hours a project held lately (build and train, decayed by the usage half-life): '12.5', '-'."""
    recent = project.get("recent_gpu_hours")
    if not isinstance(recent, dict):
        return "-"
    total = sum(float(v) for v in recent.values() if isinstance(v, int | float))
    return f"{total:.2f}".rstrip("0").rstrip(".") if total >= 0.005 else "0"


def members_text(project: dict[str, Any]) -> str:
    """``everyone`` (open project), ``admins only`` (empty list), else the entries; ``(not you)`` if so."""
    members = project.get("members")
    text = "everyone" if members is None else (", ".join(members) if members else "admins only")
    return text + (" (not you)" if project.get("member") is False else "")


def gpus_table(pool: dict[str, Any]) -> str:
    rows = []
    for node in pool.get("nodes") or []:
        for gpu in node.get("gpus") or []:
            users = ", ".join(
                f"{a.get('job_id')} {a.get('project')}/{a.get('user')} {gpus_text(a.get('fraction'))}"
                for a in gpu.get("allocations") or []
            )
            util = gpu.get("utilization")
            name = str(node.get("name")) + (f" ({node['group']})" if node.get("group") else "")
            rows.append((name, gpu.get("index"), gpu.get("model"), bytes_text(gpu.get("memory")),
                         f"{gpus_text(gpu.get('allocated', 0))}/1",
                         "-" if util is None else f"{util:.0f}%", users or "idle"))
    if not rows:
        return "no GPUs"
    return table(["NODE", "GPU", "MODEL", "MEMORY", "ALLOCATED", "UTIL", "USED BY"], rows)


def status_text(url: str, status: dict[str, Any]) -> str:
    pool = status.get("pool") or {}
    simulated = status.get("simulated", pool.get("simulated"))
    gpus = [g for n in pool.get("nodes") or [] for g in n.get("gpus") or []]
    total = len(gpus)
    allocated = sum(float(g.get("allocated") or 0) for g in gpus)
    head = f"gpupool scheduler at {url}"
    if simulated:
        head += "   ** SIMULATED GPUs: no real GPU is used **"
    queue = status.get("queue") or {}
    backend = backend_text(status.get("backend"))
    lines = [
        head,
        *([backend] if backend else []),
        f"GPUs: {gpus_text(allocated)} of {total} allocated    queue: {_count(queue.get('pending'))} pending, "
        f"{_count(queue.get('running'))} running"
        + (f" ({_count(status.get('idle_running'))} idle)" if _count(status.get("idle_running")) else "")
        + f", {_count(queue.get('paused'))} paused",
        "",
        gpus_table(pool),
        "",
        projects_table(status.get("projects") or []),
    ]
    return "\n".join(lines)


def backend_text(health: Any) -> str:
    """One line on where jobs run, said only for a cluster backend or when something is wrong.

    ``Kubernetes API https://10.0.0.1:6443, namespace gpupool: OK`` or, while
    the API server cannot be reached, the failing calls and since when; GPU
    nodes left out of the pool follow with their reason.
    """
    if not isinstance(health, dict) or (health.get("backend") == "local" and health.get("ok", True)):
        return ""
    return "\n".join(escape(line) for line in _backend_lines(health))  # the API's words: shown, not obeyed


def _backend_lines(health: dict[str, Any]) -> list[str]:
    if health.get("backend") == "kubernetes":
        text = f"Kubernetes API {health.get('api_server', '?')}, namespace {health.get('namespace', '?')}: "
    else:
        text = f"backend {health.get('backend', '?')}: "
    errors = [e for e in health.get("errors") or [] if isinstance(e, dict)]
    if health.get("ok", True) and not errors:
        text += "OK"
    else:
        text += "PROBLEM: " + "; ".join(
            f"{e.get('source', '?')}: {e.get('error', '?')}" + (f" (since {_clock(e.get('since'))})" if e.get("since") else "")
            for e in errors) if errors else "PROBLEM"
    lines = [text]
    leader = health.get("leader")
    if isinstance(leader, dict):
        lines.append(f"leader: {leader.get('leader') or '?'}"
                     + (" (this instance)" if leader.get("this_instance") else f" (this instance is {leader.get('identity', '?')})")
                     + f", lease {leader.get('lease', '?')}")
    out = health.get("nodes_out")
    if isinstance(out, dict) and out:
        lines.append("nodes out of the pool: " + ", ".join(f"{name} ({why})" for name, why in sorted(out.items())))
    return lines


def _clock(t: Any) -> str:
    try:
        return time.strftime("%H:%M:%S", time.localtime(float(t)))
    except (TypeError, ValueError, OverflowError):
        return str(t)


def job_text(job: dict[str, Any]) -> str:
    """describe: every field of a job, the important ones first, each escaped (another user's text is shown,
    never obeyed)."""
    order = ["id", "name", "state", "reason", "idle_since", "idle_action", "project", "user", "kind", "priority",
             "request", "preemptible", "attempts", "submitted_at", "started_at", "finished_at", "exit_code",
             "assignment", "ran_on", "command", "workdir", "labels", "lease_expires_at", "env"]
    keys = [k for k in order if k in job] + sorted(k for k in job if k not in order)
    lines = []
    for key in keys:
        value = job[key]
        if key == "ran_on":  # where a job that is not running ran last; a running one shows its assignment
            if isinstance(value, dict):
                lines.append(f"{'ran on:':<18}{ran_on_text(value)}")
            continue
        if key.endswith("_at") and isinstance(value, int | float):
            text = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(value)) + f" ({ago(value)})"
        elif key == "request":
            text = request_text(job) + "   " + json.dumps({k: v for k, v in (value or {}).items() if v})
        elif key == "assignment" and isinstance(value, dict):
            text = assignment_text(value)
        elif key == "command" and isinstance(value, list):
            text = " ".join(_shell_quote(a) for a in value)
        elif isinstance(value, dict | list):
            text = json.dumps(value) if value else "-"
        else:
            text = "-" if value is None else str(value)
        if key != "assignment":  # assignment_text escapes its own parts around its line breaks
            text = escape(text)
        lines.append(f"{escape(key) + ':':<18}{text}")
    return "\n".join(lines)


def assignment_text(assignment: dict[str, Any]) -> str:
    """``node-a: A100-80GB#0 1, ...``; a gang's: one line per replica (``replica 0 on node-a: ...``)."""

    def shares(gpus: Any) -> str:
        return escape(", ".join(f"{g.get('model')}#{g.get('index')} {gpus_text((g.get('milli') or 0) / 1000)}"
                                for g in gpus or [] if isinstance(g, dict))) or "no GPU"

    replicas = [r for r in assignment.get("replicas") or [] if isinstance(r, dict)]
    if not replicas:
        return f"{escape(str(assignment.get('node')))}: " + shares(assignment.get("gpus"))
    return f"\n{'':18}".join(f"replica {r.get('rank')} on {escape(str(r.get('node')))}: {shares(r.get('gpus'))}"
                              for r in replicas)


def ran_on_text(assignment: dict[str, Any]) -> str:
    """Where a job's last attempt ran, for people: ``GPU 0 (testhost)``, ``GPUs 0, 1 (node-a)``,
    ``0.25 of GPU 1 (testhost)``; a gang's nodes joined by ``; ``. Each part is escaped."""

    def on(node: Any, gpus: Any) -> str:
        held = [g for g in gpus or [] if isinstance(g, dict)]
        where = f"({escape(str(node))})"
        if not held:
            return f"no GPU {where}"
        indexes = ", ".join(escape(str(g.get("index"))) for g in held)
        milli = held[0].get("milli") or 0
        if len(held) == 1 and isinstance(milli, int) and 0 < milli < 1000:
            return f"{gpus_text(milli / 1000)} of GPU {indexes} {where}"
        return f"GPU{'s' if len(held) > 1 else ''} {indexes} {where}"

    replicas = [r for r in assignment.get("replicas") or [] if isinstance(r, dict)]
    if not replicas:
        return on(assignment.get("node"), assignment.get("gpus"))
    return "; ".join(on(r.get("node"), r.get("gpus")) for r in replicas)


def submitted_line(job: dict[str, Any]) -> str:
    """What `gpupool submit` prints: the job id first (scripts take it), what it holds or waits for, what next.

    A fresh job is 'queued' with the reason 'queued'; saying that twice tells
    nothing, so the line says what was asked for, for whom, and how to follow it.
    """
    state, reason = job.get("state", ""), job.get("reason") or ""
    if reason and reason not in (state, "queued", "submitted"):
        return escape(f"{job['id']} {state}: {reason}")
    who = f" as {job['user']}" if job.get("user") else ""
    hint = "where it runs" if state in ("queued", "running") else "why"
    return escape(f"{job['id']} {state}: {request_text(job)} in project {job.get('project', '?')}{who}; "
                  f"'gpupool describe {job['id']}' shows {hint}")


def _shell_quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def _clip(text: Any, width: int) -> str:
    value = "" if text is None else escape(str(text).replace("\n", " "))
    return value if len(value) <= width else value[: width - 1] + "…"
