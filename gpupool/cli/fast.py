"""The `gpupool` entry point, with a fast path for the common ``gpupool submit``.

Why: a sweep script calls ``gpupool submit`` once per job, so a call's start
is paid per job. The interpreter itself costs about 11 ms of CPU; ``argparse``
(with ``re``, ``enum`` and ``gettext``), ``json`` and ``socket`` add about as
much again, which capped 8 parallel callers on 2 cores near 45 submits/s. A
plain submit (project, GPUs or a fraction, replicas, name, priority, working directory,
environment, labels, connection options, ``--`` and the command) is read here
by hand and sent with :mod:`gpupool.client` on the C modules alone; any
other command line (other options, ``--help``, ``--json``, a mistake) goes to
the full CLI (:mod:`gpupool.cli.main`), which parses it with ``argparse`` and
gives the usual messages. Both print the same line for a submitted job.
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

_VALUED = {"--project": "project", "-p": "project", "--gpus": "gpus", "--gpu-fraction": "gpu_fraction",
           "--name": "name", "--priority": "priority", "--workdir": "workdir", "--env": "env",
           "--label": "labels", "--url": "url", "--token": "token", "--replicas": "replicas"}
EXIT_SERVER, EXIT_UNREACHABLE = 1, 3


def parse_submit(argv: list[str]) -> tuple[dict[str, Any], str | None, str | None] | None:
    """``(spec, url, token)`` for a plain ``submit ... -- COMMAND``; None for anything else (the full CLI's).

    The spec is the one :func:`gpupool.cli.main.submit_spec` builds from the same
    arguments; anything this cannot read exactly as the full CLI would gives None.
    """
    if "--" not in argv:
        return None
    cut = argv.index("--")
    options, command = argv[:cut], argv[cut + 1:]
    if not command:
        return None
    found: dict[str, Any] = {}
    word = None  # the one positional argument: the command's name
    i = 0
    while i < len(options):
        if not options[i].startswith("-"):
            if word is not None:
                return None
            word = options[i]
            i += 1
            continue
        flag, eq, value = options[i].partition("=")
        if flag not in _VALUED or flag == "-p" and eq:
            return None
        if not eq:
            if i + 1 >= len(options) or _looks_like_an_option(options[i + 1]):
                return None
            value = options[i + 1]
            i += 1
        i += 1
        key = _VALUED[flag]
        if key in ("env", "labels"):
            name, sep, val = value.partition("=")
            if not sep or not name:
                return None
            found.setdefault(key, {})[name] = val
        elif key in found:
            return None  # given twice: argparse's rules decide
        else:
            found[key] = value
    if word != "submit":
        return None
    try:
        spec = _spec(found, command)
    except ValueError:
        return None
    return spec, found.get("url"), found.get("token")


def _looks_like_an_option(value: str) -> bool:
    """What argparse would not take as an option's value: ``-x``, ``--y`` (a negative number it would)."""
    if not value.startswith("-") or value == "-":
        return False
    try:
        float(value)
    except ValueError:
        return True
    return False


def _spec(found: dict[str, Any], command: list[str]) -> dict[str, Any]:
    """The JobSpec of the options found; ValueError where the full CLI must read them (and say why)."""
    if "project" not in found or ("gpus" in found and "gpu_fraction" in found):
        raise ValueError("not a plain submit")
    spec: dict[str, Any] = {"project": found["project"]}
    if "name" in found:
        spec["name"] = found["name"]
    if "gpus" in found:
        spec["gpus"] = int(found["gpus"])
        if spec["gpus"] < 1:
            raise ValueError("the full CLI says why")
    if "gpu_fraction" in found:
        fraction = float(found["gpu_fraction"])
        if not 0 < fraction < 1:
            raise ValueError("the full CLI says why")
        spec["gpu_fraction"] = fraction
    if "priority" in found:
        spec["priority"] = int(found["priority"])
    if "replicas" in found:
        spec["replicas"] = int(found["replicas"])
        if spec["replicas"] < 1 or spec["replicas"] > 1 and "gpus" not in spec:
            raise ValueError("the full CLI says why")
    if "workdir" in found:
        spec["workdir"] = os.path.abspath(found["workdir"])
    for key in ("env", "labels"):
        if key in found:
            spec[key] = found[key]
    spec["command"] = command
    return spec


def submitted_line(job: dict[str, Any]) -> str:
    """What `gpupool submit` prints: the job id first (scripts take it), what it holds or waits for, what next.

    A fresh job is 'queued' with the reason 'queued'; saying that twice tells
    nothing, so the line says what was asked for, for whom, and how to follow it.
    """
    from gpupool.cli.tables import request_text
    from gpupool.wire.plain_text import escape

    state, reason = job.get("state", ""), job.get("reason") or ""
    if reason and reason not in (state, "queued", "submitted"):
        return escape(f"{job['id']} {state}: {reason}")
    who = f" as {job['user']}" if job.get("user") else ""
    hint = "where it runs" if state in ("queued", "running") else "why"
    return escape(f"{job['id']} {state}: {request_text(job)} in project {job.get('project', '?')}{who}; "
                  f"'gpupool describe {job['id']}' shows {hint}")


def _submit(parsed: tuple[dict[str, Any], str | None, str | None]) -> int:
    from gpupool.client import GpupoolClient, with_submit_dir
    from gpupool.wire.errors import GpupoolError, Unavailable

    spec, url, token = parsed
    try:
        client = GpupoolClient(url, token)
        job = client.submit(with_submit_dir(spec, client.url))
    except Unavailable as e:
        from gpupool.cli.main import _fail, where_to_look

        return _fail(e.message + where_to_look(url), EXIT_UNREACHABLE)
    except GpupoolError as e:
        from gpupool.wire.plain_text import escape

        sys.stderr.write(f"gpupool: error: {escape(e.message)}\n")  # as the full CLI's _fail: escaped
        return EXIT_SERVER
    print(submitted_line(job))
    return 0


def main() -> int:
    """Entry point of the `gpupool` script: the fast path when it applies, else the full CLI."""
    parsed = parse_submit(sys.argv[1:])
    if parsed is not None:
        try:
            return _submit(parsed)
        except KeyboardInterrupt:
            return 130
        except BrokenPipeError:
            return 0
    from gpupool.cli.main import main as full_cli

    return full_cli()
