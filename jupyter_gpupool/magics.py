"""``%gpupool``: the pool from inside a notebook (``%load_ext jupyter_gpupool``).

``%gpupool status`` prints the pool and the projects, ``%gpupool list [--all]``
the live jobs (yours unless --all), ``%gpupool promote [--gpus N] [--replicas R]
[--priority P] [--project X] [-p name value]...`` promotes the current notebook (as last
saved) to a training job, ``%gpupool monitor`` shows the live widgets.
The kernel reaches the scheduler with the GPUPOOL_URL / GPUPOOL_TOKEN its
provisioner set.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
from typing import Any

from IPython.core.magic import Magics, line_magic, magics_class

from gpupool.wire.errors import GpupoolError
from gpupool.wire.states import LIVE_STATES
from jupyter_gpupool.kernel_share import fraction_label
from jupyter_gpupool.promote import (
    PromoteRequest,
    build_spec,
    claim_snapshot,
    run_paths,
    snapshot_dropped_on_error,
)


def _value(text: str) -> Any:
    """A parameter value from the command line: JSON if it parses, else the string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="%gpupool", add_help=False, exit_on_error=False)
    sub = parser.add_subparsers(dest="command")
    sub.add_parser("status")
    listing = sub.add_parser("list")
    listing.add_argument("--all", action="store_true")
    promote = sub.add_parser("promote")
    promote.add_argument("--gpus", type=float, default=None)
    promote.add_argument("--replicas", type=int, default=None, help="a distributed run: R replicas x N GPUs")
    promote.add_argument("--priority", type=int, default=0)
    promote.add_argument("--project", default=None)
    promote.add_argument("--notebook", default=None, help="default: this kernel's notebook")
    promote.add_argument("-p", "--parameter", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"))
    sub.add_parser("monitor")
    return parser


def format_status(status: dict[str, Any]) -> str:
    """The pool and projects as plain text."""
    lines = [f"gpupool{' (simulated GPUs)' if status.get('simulated') else ''}"]
    for node in status.get("pool", {}).get("nodes", []):
        for gpu in node.get("gpus", []):
            holders = ", ".join(
                f"{a.get('project')}/{a.get('user')} {a.get('kind')} {fraction_label(float(a.get('fraction') or 0))}"
                for a in gpu.get("allocations", [])
            ) or "free"
            lines.append(f"  {node.get('name')} GPU{gpu.get('index')} {gpu.get('model')}: "
                         f"{float(gpu.get('allocated') or 0):.2f} held ({holders})")
    for p in status.get("projects", []):
        usage = p.get("usage") or {}
        over = usage.get("train_over_quota") or 0
        lines.append(f"  project {p['name']}: build {usage.get('build', 0):g}/{p.get('build_quota', 0):g} GPU, "
                     f"train {usage.get('train', 0):g}/{p.get('train_guarantee', 0):g} GPU"
                     + (f" (+{over:g} over guarantee)" if over else "") + f", {p.get('pending', 0)} pending")
    return "\n".join(lines)


def format_jobs(jobs: list[dict[str, Any]]) -> str:
    """Jobs as an aligned text table."""
    if not jobs:
        return "no jobs"
    rows = [("ID", "STATE", "KIND", "PROJECT", "USER", "NAME")]
    rows += [(j["id"], j["state"], j.get("kind", ""), j.get("project", ""), j.get("user", ""), j.get("name", ""))
             for j in jobs]
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(str(c).ljust(wd) for c, wd in zip(r, widths, strict=True)).rstrip() for r in rows)


def promote_notebook(client: Any, notebook: str, request: PromoteRequest) -> dict[str, Any]:
    """Promote with the blocking client, paths relative to the server root as the front end sees them.

    Outside a server root (a kernel of another front end) the notebook's own
    folder serves as the root: the kernel reads only files its user can.
    """
    full = os.path.realpath(notebook)
    root = os.path.realpath(os.environ.get("GPUPOOL_SERVER_ROOT") or os.path.dirname(full))
    if not full.startswith(root.rstrip(os.sep) + os.sep):
        root = os.path.dirname(full)
    request.path = os.path.relpath(full, root)
    project = request.project or os.environ.get("GPUPOOL_PROJECT") or os.environ.get("GPUPOOL_PROJECT_DEFAULT", "")
    spec, runs, staging, _ = build_spec(request, root, project)
    with snapshot_dropped_on_error(runs, staging):
        job = client.submit(spec)
    claim_snapshot(runs, staging, job["id"])
    return {**job, **run_paths(job), "run_dir_abs": os.path.join(runs, job["id"])}


@magics_class
class GpupoolMagics(Magics):
    """The ``%gpupool`` line magic."""

    def client(self) -> Any:
        from gpupool.client import GpupoolClient

        return GpupoolClient()

    @line_magic
    def gpupool(self, line: str) -> Any:
        """%gpupool status | list [--all] | promote [...] | monitor"""
        try:
            args = _parser().parse_args(shlex.split(line) or ["status"])
        except (argparse.ArgumentError, SystemExit) as err:
            print(f"%gpupool: {err}. Usage: %gpupool status | list [--all] | promote [--gpus N] [--replicas R] "
                  "[--priority P] [--project X] [-p NAME VALUE]... | monitor")
            return None
        try:
            return getattr(self, f"_{args.command}")(args)
        except GpupoolError as err:
            print(f"%gpupool: {err.message}")
            return None

    def _status(self, _args: argparse.Namespace) -> None:
        print(format_status(self.client().status()))

    def _list(self, args: argparse.Namespace) -> None:
        client = self.client()
        filters: dict[str, Any] = {"state": ",".join(LIVE_STATES)}
        if not args.all:
            filters["user"] = client.whoami()["user"]
        print(format_jobs(client.jobs(**filters)))

    def _promote(self, args: argparse.Namespace) -> dict[str, Any] | None:
        notebook = args.notebook or os.environ.get("JPY_SESSION_NAME", "")
        if not notebook or not notebook.endswith(".ipynb"):
            print("%gpupool: this kernel does not know its notebook; pass --notebook PATH")
            return None
        body: dict[str, Any] = {"path": notebook, "priority": args.priority,
                                "parameters": {k: _value(v) for k, v in args.parameter}}
        if args.project:
            body["project"] = args.project
        if args.gpus is not None:
            body["gpus"] = args.gpus
        if args.replicas is not None:
            body["replicas"] = args.replicas
        job = promote_notebook(self.client(), notebook, PromoteRequest.from_body(body))
        print(f"promoted {os.path.basename(notebook)} as job {job['id']} ({job['state']}); "
              f"output: {os.path.join(job['run_dir_abs'], 'output.ipynb')}")
        return job

    def _monitor(self, _args: argparse.Namespace) -> None:
        from IPython.display import display

        from jupyter_gpupool.widgets import PoolMonitor, QueueMonitor

        display(PoolMonitor(), QueueMonitor())
