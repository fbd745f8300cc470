"""Promote a notebook to a training job that runs it headless with papermill.

The notebook is snapshotted at promote time, so later edits do not change the
run. A job's id is only known after submit, but its run directory is named by
it (``<nb dir>/<name>.runs/<job-id>/``); so the snapshot is first written to a
staging file in ``<name>.runs/``, the job's working directory, and moved into
``<job-id>/input.ipynb`` by whichever comes first: the server right after
submit, or :mod:`jupyter_gpupool.runner` when the job starts (an atomic
rename; the loser finds the file already in place).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import nbformat

from gpupool.wire.errors import Forbidden, GpupoolError, InvalidRequest
from gpupool.wire.limits import MAX_PROJECT_NAME
from jupyter_gpupool.kernelspecs import base_kernel
from jupyter_gpupool.paths import inside_root, relative_to_root, resolve_notebook

IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
STAGING_PREFIX = ".staging-"
# The parameters travel as one JSON argument of the job's command line, and the scheduler
# takes arguments of at most 64 KiB (gpupool.wire.schemas.MAX_STRING); refusing here
# gives the notebook user a sentence about parameters instead of one about "command.9".
MAX_PARAMETERS_KIB = 64
# papermill writes each value as a Python literal, and Python's parser stops at 200
# nested brackets: a deeper value would be accepted, then fail the job when it starts.
MAX_PARAMETER_DEPTH = 32
# A gang's replicas (docs/design.md "Multi-node gangs"); the scheduler checks the same bound,
# checked here too so a dialog's bad value is a sentence about the field before anything is written.
MAX_REPLICAS = 64


def _depth(value: Any) -> int:
    """Levels of lists and objects in a JSON value (0 for a scalar), without recursion."""
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict):
            item = list(item.values())
        if isinstance(item, list):
            deepest = max(deepest, depth + 1)
            stack.extend((child, depth + 1) for child in item)
    return deepest


def check_parameters(parameters: dict[str, Any]) -> None:
    """Names that are identifiers, values papermill can write, all of it small enough for the command line."""
    for name, value in parameters.items():
        if not IDENTIFIER.match(name):
            raise InvalidRequest(f"parameter name '{name[:80]}' is not a Python identifier")
        depth = _depth(value)
        if depth > MAX_PARAMETER_DEPTH:
            raise InvalidRequest(f"parameter '{name}' is nested too deeply: {depth} levels, "
                                 f"at most {MAX_PARAMETER_DEPTH}")
    size = len(json.dumps(parameters))  # as papermill_args puts them on the command line
    if size > MAX_PARAMETERS_KIB * 1024:
        raise InvalidRequest(f"parameters are too large: {-(-size // 1024)} KiB, at most {MAX_PARAMETERS_KIB} KiB")


@dataclass
class PromoteRequest:
    """A validated promote request (the POST /gpupool/api/promote body)."""

    path: str
    project: str | None = None
    gpus: int | None = None
    gpu_fraction: float | None = None
    priority: int = 0
    parameters: dict[str, Any] = field(default_factory=dict)
    replicas: int = 1

    @classmethod
    def from_body(cls, body: Any) -> PromoteRequest:
        """Check types and ranges; every problem is a one-line InvalidRequest."""
        if not isinstance(body, dict):
            raise InvalidRequest("the request body must be a JSON object")
        unknown = set(body) - {"path", "project", "gpus", "gpu_fraction", "priority", "parameters", "replicas"}
        if unknown:
            raise InvalidRequest(f"unknown field(s): {', '.join(sorted(unknown))}")
        path = body.get("path")
        if not isinstance(path, str) or not path:
            raise InvalidRequest("'path' (the notebook, relative to the server root) is required")
        project = body.get("project")
        if project is not None and (not isinstance(project, str) or not project):
            raise InvalidRequest("'project' must be a non-empty string")
        if project is not None and len(project) > MAX_PROJECT_NAME:
            raise InvalidRequest(f"'project' is too long: {len(project)} characters, at most {MAX_PROJECT_NAME}")
        gpus, fraction = body.get("gpus"), body.get("gpu_fraction")
        if gpus is not None and fraction is not None:
            raise InvalidRequest("give either 'gpus' or 'gpu_fraction', not both")
        if gpus is not None:
            if isinstance(gpus, bool) or not isinstance(gpus, (int, float)) or gpus <= 0:
                raise InvalidRequest("'gpus' must be a positive number")
            if gpus < 1:
                fraction, gpus = float(gpus), None
            elif not float(gpus).is_integer():
                raise InvalidRequest("'gpus' above 1 must be a whole number")
            else:
                gpus = int(gpus)
        if fraction is not None:
            if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not 0 < fraction <= 1:
                raise InvalidRequest("'gpu_fraction' must be a number with 0 < fraction <= 1")
            if fraction == 1:
                gpus, fraction = 1, None
            else:
                fraction = float(fraction)
        if gpus is None and fraction is None:
            gpus = 1
        priority = body.get("priority", 0)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise InvalidRequest("'priority' must be an integer")
        parameters = body.get("parameters") or {}
        if not isinstance(parameters, dict):
            raise InvalidRequest("'parameters' must be an object of name: value")
        check_parameters(parameters)
        replicas = check_replicas(1 if body.get("replicas") is None else body["replicas"], gpus)
        return cls(path, project, gpus, fraction, priority, parameters, replicas)


def check_replicas(replicas: Any, gpus: int | None) -> int:
    """A whole number 1..MAX_REPLICAS; above 1 only with whole GPUs (each replica holds its own GPUs)."""
    if isinstance(replicas, bool) or not isinstance(replicas, (int, float)) or not float(replicas).is_integer():
        raise InvalidRequest(f"'replicas' must be a whole number from 1 to {MAX_REPLICAS}")
    replicas = int(replicas)
    if not 1 <= replicas <= MAX_REPLICAS:
        raise InvalidRequest(f"'replicas' must be from 1 to {MAX_REPLICAS}, not {replicas}")
    if replicas > 1 and gpus is None:
        raise InvalidRequest("'replicas' above 1 needs whole GPUs per replica ('gpus' of 1 or more), "
                             "not a fraction of one GPU")
    return replicas


def notebook_kernel(full_path: str) -> str:
    """The kernel a promoted notebook runs on: its own, or the plain one behind a GPU kernelspec.

    A headless run must not start one of our GPU kernelspecs: it would take a
    second share on top of the job's GPUs.
    """
    nb = nbformat.read(full_path, as_version=4)
    spec = nb.metadata.get("kernelspec") or {}
    name = spec.get("name") or "python3"
    return base_kernel(name, spec.get("metadata"))


def papermill_args(parameters: dict[str, Any], kernel: str, cwd: str) -> list[str]:
    """papermill's arguments after 'python -m papermill' (parameters as JSON: types survive)."""
    args = ["input.ipynb", "output.ipynb"]
    if parameters:
        args += ["-y", json.dumps(parameters)]
    args += ["--kernel", kernel, "--cwd", cwd, "--log-output", "--no-progress-bar"]
    return args


def runs_dir_for(full_path: str) -> str:
    """``<nb dir>/<name>.runs`` for a notebook ``<nb dir>/<name>.ipynb``."""
    folder, name = os.path.split(full_path)
    return os.path.join(folder, name[: -len(".ipynb")] + ".runs")


def claim_snapshot(runs_dir: str, staging: str, job_id: str) -> str:
    """Move the staged snapshot to ``<runs>/<job-id>/input.ipynb``; idempotent and race-safe.

    Forbidden when ``<job-id>`` is not a plain folder in the runs directory (a
    symlink made in advance for a predictable job id): the input, output and
    log would otherwise be written wherever it points.
    """
    run_dir = os.path.join(runs_dir, job_id)
    os.makedirs(run_dir, mode=0o700, exist_ok=True)  # the run's input, output and log: its owner's only
    if os.path.realpath(run_dir) != os.path.join(os.path.realpath(runs_dir), job_id):
        raise Forbidden(f"the run folder '{job_id}' in '{os.path.basename(runs_dir)}' is a symbolic link; "
                        "a run's files stay in its runs folder")
    target = os.path.join(run_dir, "input.ipynb")
    try:
        os.rename(os.path.join(runs_dir, staging), target)
    except FileNotFoundError:
        if not os.path.exists(target):
            raise
    return run_dir


@contextlib.contextmanager
def snapshot_dropped_on_error(runs_dir: str, staging: str) -> Iterator[None]:
    """Around the submit: if it fails, remove the staged snapshot (no job will ever claim it)."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(os.path.join(runs_dir, staging))
        raise


# What the notebook's run takes from this Jupyter server's environment: where Jupyter and IPython
# find kernels and settings, and the Python environment the server runs in. The scheduler passes
# a job only PATH, the locale and the job's own variables (docs/service.md), so a promoted run
# would otherwise look for the notebook's kernel elsewhere than the server that ran it.
RUN_ENV = ("JUPYTER_PATH", "JUPYTER_DATA_DIR", "JUPYTER_CONFIG_DIR", "JUPYTER_CONFIG_PATH",
           "JUPYTER_PLATFORM_DIRS", "JUPYTER_PREFER_ENV_PATH", "IPYTHONDIR", "VIRTUAL_ENV", "CONDA_PREFIX",
           "CONDA_DEFAULT_ENV")


def run_environment() -> dict[str, str]:
    """The variables of :data:`RUN_ENV` this server has, as the promoted job's own environment."""
    return {k: os.environ[k] for k in RUN_ENV if os.environ.get(k)}


def build_spec(
    request: PromoteRequest, root_dir: str, default_project: str
) -> tuple[dict[str, Any], str, str, str]:
    """(JobSpec, runs dir, staging file name, notebook full path); writes the snapshot."""
    full = resolve_notebook(root_dir, request.path)
    try:
        kernel = notebook_kernel(full)
    except Exception as err:
        raise InvalidRequest(f"cannot read notebook '{request.path}': {err}") from err
    runs = runs_dir_for(full)
    shown = os.path.relpath(runs, os.path.realpath(root_dir))
    # The run's input, output and log go there: checked like the notebook, symlinks followed.
    runs = inside_root(root_dir, runs, shown, "the run's files must stay under it")
    # Private whatever the server's umask: on a shared machine a run's notebook, outputs and log
    # are its owner's (docs/jupyterhub.md, "Privacy on a shared server").
    os.makedirs(runs, mode=0o700, exist_ok=True)
    staging = f"{STAGING_PREFIX}{uuid.uuid4().hex}.ipynb"
    shutil.copyfile(full, os.path.join(runs, staging))
    os.chmod(os.path.join(runs, staging), 0o600)
    rel = relative_to_root(root_dir, full)
    command = [
        sys.executable,
        "-m",
        "jupyter_gpupool.runner",
        "--staging",
        staging,
        "--",
        *papermill_args(request.parameters, kernel, os.path.dirname(full)),
    ]
    spec: dict[str, Any] = {
        "project": request.project or default_project,
        "kind": "train",
        "name": f"{os.path.basename(full)[: -len('.ipynb')]} (notebook)",
        "priority": request.priority,
        "command": command,
        "workdir": runs,
        "labels": {"notebook": rel, "runs_dir": relative_to_root(root_dir, runs), "promoted": "1"},
    }
    env = run_environment()
    if env:
        spec["env"] = env
    if request.gpus is not None:
        spec["gpus"] = request.gpus
    else:
        spec["gpu_fraction"] = request.gpu_fraction
    if request.replicas > 1:
        # Left out for one replica, so a one-process promote reads as before.
        spec["replicas"] = request.replicas
    return spec, runs, staging, full


def replica_file(name: str, rank: int) -> str:
    """Replica ``rank``'s copy of a run file: rank 0 keeps ``name`` (the job's output), others
    ``output.ipynb`` -> ``output.replica-1.ipynb``, so replicas sharing a run folder never write one file."""
    if rank == 0:
        return name
    stem, dot, ext = name.rpartition(".")
    return f"{stem}.replica-{rank}.{ext}" if dot else f"{name}.replica-{rank}"


def run_paths(job: dict[str, Any]) -> dict[str, Any]:
    """``{"run_dir", "output_notebook"}`` (root-relative) for a promoted job, else {}.

    A gang (``request.replicas`` > 1) also gets ``replica_output_notebooks``, one per
    rank in rank order; rank 0's is the job's ``output_notebook``.
    """
    labels = job.get("labels") or {}
    runs = labels.get("runs_dir")
    if not runs or labels.get("promoted") != "1":
        return {}
    run_dir = f"{runs}/{job['id']}" if runs != "." else job["id"]
    paths: dict[str, Any] = {"run_dir": run_dir, "output_notebook": f"{run_dir}/output.ipynb"}
    replicas = (job.get("request") or {}).get("replicas") or 1
    if isinstance(replicas, int) and replicas > 1:
        paths["replica_output_notebooks"] = [f"{run_dir}/{replica_file('output.ipynb', k)}" for k in range(replicas)]
    return paths


async def promote(client: Any, root_dir: str, request: PromoteRequest, default_project: str) -> dict[str, Any]:
    """Snapshot the notebook, submit its training job, place the snapshot; returns Job + paths."""
    spec, runs, staging, _full = build_spec(request, root_dir, default_project)
    with snapshot_dropped_on_error(runs, staging):
        job = await client.submit(spec)
        try:
            claim_snapshot(runs, staging, job["id"])
        except Forbidden:
            with contextlib.suppress(GpupoolError):  # it must not start and write through the link
                await client.cancel(job["id"])
            raise
    return {**job, **run_paths(job)}
