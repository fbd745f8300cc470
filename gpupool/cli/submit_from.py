"""`gpupool submit --from FILE`: a sweep's thousands of jobs from one process, over one connection.

Why: a sweep script that calls ``gpupool submit`` once per job pays a Python
start and a TCP connection per job. With ``--from``, each line of FILE (or of
standard input, ``--from -``) is one JSON object shaped like the submit API's
body (a JobSpec, docs/design.md); blank lines and lines starting with ``#``
are skipped. The flags given with ``--from`` are every line's defaults.

What happens, so that nothing is lost and every outcome is said:

1. Every line is read and checked first (JSON, an object, a project and a
   command once the defaults are added). Any bad line: each is named by its
   number on stderr, nothing is submitted, exit 2.
2. The jobs are submitted in file order. Each submitted job prints the line
   plain ``gpupool submit`` prints (``--json``: the job as one JSON line).
   A job the scheduler refuses (a 4xx or 5xx) prints ``gpupool: error: line N:
   <message>`` on stderr and the others go on; at the end a summary names the
   refused lines and the exit status is 1.
3. Two failures are about the caller, not the job, and would refuse every
   line alike: the scheduler cannot be reached (exit 3) and the token is not
   valid (exit 1). They stop the run at once, saying which lines were not
   submitted (the lines before were).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, TextIO

from gpupool.cli.parser import EXIT_SERVER, EXIT_UNREACHABLE, EXIT_USAGE, UsageError
from gpupool.client import GpupoolClient, with_submit_dir
from gpupool.wire.errors import GpupoolError, Unauthorized, Unavailable
from gpupool.wire.plain_text import escape

AMOUNT_KEYS = ("gpus", "gpu_fraction", "gpu_memory")
"""A line naming any of these replaces the flags' amount: the three are exclusive."""

MERGED_KEYS = ("env", "labels")
"""Dicts a line adds to (its keys win) rather than replaces."""

MAX_REPORTED = 20
"""Bad lines named one by one before the rest are counted: a wrong file should not flood the terminal."""


def merged(defaults: dict[str, Any], line: dict[str, Any]) -> dict[str, Any]:
    """The JobSpec of one line: the flags' values, then the line's (which win).

    ``env`` and ``labels`` are merged key by key; a GPU amount on the line
    replaces the flags' amount of any kind; a relative ``workdir`` is taken
    from the current folder, as ``--workdir`` is.
    """
    spec = dict(defaults)
    if any(key in line for key in AMOUNT_KEYS):
        for key in AMOUNT_KEYS:
            spec.pop(key, None)
    for key, value in line.items():
        if key in MERGED_KEYS and isinstance(value, dict) and isinstance(spec.get(key), dict):
            spec[key] = {**spec[key], **value}
        else:
            spec[key] = value
    workdir = spec.get("workdir")
    if isinstance(workdir, str) and workdir and not os.path.isabs(workdir):
        spec["workdir"] = os.path.abspath(workdir)
    return spec


def read_jobs(source: TextIO, defaults: dict[str, Any]) -> tuple[list[tuple[int, dict[str, Any]]], list[str]]:
    """``(jobs, problems)``: each job's line number and JobSpec, and one sentence per bad line."""
    jobs: list[tuple[int, dict[str, Any]]] = []
    problems: list[str] = []
    for number, text in enumerate(source, start=1):
        text = text.strip()
        if not text or text.startswith("#"):
            continue
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            problems.append(f"line {number}: not JSON ({e.msg} at column {e.colno})")
            continue
        if not isinstance(value, dict):
            problems.append(f"line {number}: a job is a JSON object ({{\"project\": ..., \"command\": [...]}}), "
                            f"not {_json_kind(value)}")
            continue
        spec = merged(defaults, value)
        if spec.get("project") is None:
            problems.append(f"line {number}: no project: give \"project\" on the line, or --project")
        elif "command" not in spec and spec.get("kind", "train") == "train":
            problems.append(f"line {number}: no command: give \"command\" on the line, or one after '--'")
        else:
            jobs.append((number, spec))
    return jobs, problems


def _json_kind(value: Any) -> str:
    """'a list', 'a string', ...: what a line held instead of an object."""
    if value is None:
        return "null"
    names = {bool: "true or false", list: "a list", str: "a string", int: "a number", float: "a number"}
    return names.get(type(value), type(value).__name__)


def _open(path: str) -> TextIO:
    """The file named by ``--from`` (``-``: standard input); a usage error when it cannot be read."""
    if path == "-":
        return sys.stdin
    try:
        return open(path, encoding="utf-8")
    except OSError as e:
        raise UsageError(f"cannot read --from {path}: {e.strerror or e}") from None


def _fail(message: str) -> None:
    sys.stderr.write(f"gpupool: error: {escape(message)}\n")


def submit_from(client: GpupoolClient, args: argparse.Namespace, defaults: dict[str, Any]) -> int:
    """Check every line of ``args.from_file``, then submit its jobs in order; the exit status (module doc)."""
    if "client_key" in defaults:
        raise UsageError("--client-key with --from would give every line the same key (and so one job); "
                         "put a \"client_key\" on each line instead")
    source = _open(args.from_file)
    try:
        jobs, problems = read_jobs(source, defaults)
    except UnicodeDecodeError as e:
        raise UsageError(f"--from {args.from_file} is not UTF-8 text: {e.reason} at byte {e.start}") from None
    finally:
        if source is not sys.stdin:
            source.close()
    where = "standard input" if args.from_file == "-" else args.from_file
    if problems:
        for problem in problems[:MAX_REPORTED]:
            _fail(problem)
        more = len(problems) - MAX_REPORTED
        _fail(f"{len(problems)} bad line{'s' if len(problems) > 1 else ''} in {where}"
              f"{f' ({more} not shown)' if more > 0 else ''}; nothing submitted")
        return EXIT_USAGE
    if not jobs:
        sys.stderr.write(f"gpupool: no jobs in {where} (only blank lines and # comments); nothing submitted\n")
        return 0
    return _submit_all(client, jobs, as_json=bool(getattr(args, "json", False)))


def _submit_all(client: GpupoolClient, jobs: list[tuple[int, dict[str, Any]]], as_json: bool) -> int:
    """Submit in order, one line out per job; refusals are reported and skipped, a caller's failure stops."""
    from gpupool.cli.tables import submitted_line

    refused: list[int] = []
    for index, (number, spec) in enumerate(jobs):
        try:
            job = client.submit(with_submit_dir(spec, client.url))
        except (Unavailable, Unauthorized) as e:
            _fail(f"line {number}: {e.message}")
            left = [n for n, _ in jobs[index:]]
            before = f"; refused before: {_lines_text(refused)}" if refused else ""
            _fail(f"stopped: {_lines_text(left, span=True)} not submitted ({len(left)} of {len(jobs)} jobs); "
                  f"{index - len(refused)} submitted before{before}; a \"client_key\" on each line makes "
                  "a rerun of the file safe")
            return EXIT_UNREACHABLE if isinstance(e, Unavailable) else EXIT_SERVER
        except GpupoolError as e:
            _fail(f"line {number}: {e.message}")
            refused.append(number)
            continue
        _print(json.dumps(job) if as_json else submitted_line(job))
    if refused:
        _fail(f"{len(refused)} of {len(jobs)} jobs refused ({_lines_text(refused)}); "
              f"the other {len(jobs) - len(refused)} were submitted")
        return EXIT_SERVER
    return 0


def _print(line: str) -> None:
    """Print one job's line; when the reader has gone (``| head -3``), go on submitting, printing to nowhere.

    Stopping there (as a plain submit does) would leave the rest of the file unsubmitted without a word.
    """
    try:
        print(line)
    except BrokenPipeError:
        nowhere = os.open(os.devnull, os.O_WRONLY)
        os.dup2(nowhere, sys.stdout.fileno())  # what is still buffered, and later lines, go there
        os.close(nowhere)


def _lines_text(numbers: list[int], span: bool = False) -> str:
    """'line 3', 'lines 3, 9' (the first MAX_REPORTED, then a count), or with ``span`` 'lines 3-9'."""
    if len(numbers) == 1:
        return f"line {numbers[0]}"
    if span:
        return f"lines {numbers[0]}-{numbers[-1]}"
    shown = ", ".join(str(n) for n in numbers[:MAX_REPORTED])
    if len(numbers) > MAX_REPORTED:
        shown += f" and {len(numbers) - MAX_REPORTED} more"
    return f"lines {shown}"
