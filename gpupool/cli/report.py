"""``gpupool report``: allocated, used and idle GPU-hours and efficiency, as a table or CSV.

Imported only by that command (``status`` and ``submit`` stay light). The
figures are the scheduler's (``GET /api/v1/report``); this module turns
``--since 30d`` into a time and the rows into text.
"""

from __future__ import annotations

import argparse
import csv
import re
import sys
import time
from typing import Any

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$", re.IGNORECASE)
_SECONDS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
COLUMNS = ("allocated_gpu_hours", "used_gpu_hours", "idle_gpu_hours", "unmeasured_gpu_hours", "efficiency",
           "peak_memory")


def parse_since(text: str) -> float:
    """``30d`` / ``12h`` / ``90m`` / ``45s`` / ``2w`` -> seconds back from now."""
    match = _DURATION.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (examples: 30d, 12h, 90m, 2w)")
    return float(match.group(1)) * _SECONDS[match.group(2).lower()]


def _key_columns(by: str) -> list[str]:
    return ["job_id", "name", "project", "user", "kind"] if by == "job" else [by, "kind"]


def _hours(value: Any) -> str:
    return f"{float(value):.2f}"


def report_table(reply: dict[str, Any]) -> str:
    """One line per row, then per kind a total over the rows shown."""
    from gpupool.cli.tables import bytes_text, table

    by = reply.get("by", "project")
    keys = _key_columns(by)
    rows = reply.get("rows", [])
    body: list[list[Any]] = []
    totals: dict[str, list[float]] = {}
    for r in rows:
        eff = r.get("efficiency")
        body.append([r.get(k) for k in keys] + [_hours(r["allocated_gpu_hours"]), _hours(r["used_gpu_hours"]),
                                                _hours(r["idle_gpu_hours"]), _hours(r["unmeasured_gpu_hours"]),
                                                "-" if eff is None else f"{100 * eff:.0f}%",
                                                bytes_text(r.get("peak_memory") or 0)])
        t = totals.setdefault(r["kind"], [0.0, 0.0, 0.0, 0.0])
        for i, c in enumerate(COLUMNS[:4]):
            t[i] += float(r[c])
    for kind, (alloc, used, idle, unmeasured) in sorted(totals.items()):
        measured = used + idle
        eff_text = f"{100 * used / measured:.0f}%" if measured > 0 else "-"
        body.append(["(total)" if i == 0 else (kind if k == "kind" else "") for i, k in enumerate(keys)]
                    + [_hours(alloc), _hours(used), _hours(idle), _hours(unmeasured), eff_text, ""])
    since = time.strftime("%Y-%m-%d %H:%M", time.localtime(reply.get("since") or 0))
    head = [k.upper().replace("_", " ") for k in keys] + ["ALLOCATED H", "USED H", "IDLE H", "UNMEASURED H",
                                                          "EFFICIENCY", "PEAK MEM"]
    if not rows:
        return f"no GPU use recorded since {since}"
    return f"GPU-hours since {since}\n" + table(head, body)


def write_csv(reply: dict[str, Any], out: Any = None) -> None:
    """The rows as CSV with a header line (numbers unrounded beyond the reply's, efficiency empty when unknown)."""
    keys = _key_columns(reply.get("by", "project"))
    writer = csv.writer(out or sys.stdout)
    writer.writerow(keys + list(COLUMNS))
    for r in reply.get("rows", []):
        writer.writerow([r.get(k, "") for k in keys]
                        + ["" if r.get(c) is None else r.get(c) for c in COLUMNS])
