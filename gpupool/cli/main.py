"""`gpupool`: the command line of the scheduler.

Every command but ``serve`` is a thin layer over :class:`gpupool.client.GpupoolClient`:
parse arguments, make one or two calls, print a table (or JSON with ``--json``).
Failures print one line, ``gpupool: error: <message>``, on stderr and exit with
2 (bad usage), 1 (the scheduler refused: the server's own message) or 3 (the
scheduler cannot be reached).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from gpupool.cli.parser import (
    EXIT_SERVER,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    UsageError,
    _command_in,
    _node_agent,
    _split_command,
    build_parser,
    parse_size,
    version,
)
from gpupool.client import GpupoolClient, config_path, with_submit_dir
from gpupool.wire.errors import GpupoolError, Unavailable
from gpupool.wire.plain_text import escape
from gpupool.wire.states import FINAL_STATES, LIVE_STATES

__all__ = ["UsageError", "build_parser", "main", "parse_size", "submit_spec", "version"]

# Every call imports this module: the service (serve) and the Kubernetes node agent are imported
# only by their commands.


def _tables() -> Any:
    """:mod:`gpupool.cli.tables`, imported only by the commands that print a table."""
    from gpupool.cli import tables as cli_tables

    return cli_tables


def _print_json(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, sort_keys=False)
    sys.stdout.write("\n")


def _print_job_line(job: dict[str, Any], args: argparse.Namespace) -> None:
    """A job after submit or an action: JSON with --json, else 'ID STATE[: reason]'."""
    if args.json:
        _print_json(job)
    else:
        reason = f": {job['reason']}" if job.get("reason") else ""
        print(escape(f"{job['id']} {job['state']}{reason}"))


def _who(me: dict[str, Any]) -> str:
    """'alice' or 'admin (admin)', from a whoami reply."""
    return f"{escape(str(me['user']))}{' (admin)' if me.get('admin') else ''}"


# ------------------------------------------------------------------ commands
def cmd_status(client: GpupoolClient, args: argparse.Namespace) -> None:
    status = client.status()
    _print_json(status) if args.json else print(_tables().status_text(client.url, status))


def cmd_whoami(client: GpupoolClient, args: argparse.Namespace) -> None:
    me = client.whoami()
    _print_json(me) if args.json else print(f"{_who(me)} at {client.url}")


def cmd_projects(client: GpupoolClient, args: argparse.Namespace) -> None:
    if args.projects_command == "set":
        fields: dict[str, Any] = {}
        for arg, key in (("build_quota", "build_quota"), ("guarantee", "train_guarantee"),
                         ("weight", "weight")):
            if getattr(args, arg) is not None:
                fields[key] = getattr(args, arg)
        if hasattr(args, "limit"):
            fields["train_limit"] = args.limit
        if args.members is not None:
            fields["members"] = [m.strip() for m in args.members.split(",") if m.strip()]
        elif args.open:
            fields["members"] = None
        for rule in args.idle or []:  # --idle, in order: 'default' resets, then each kind's fields add up
            if rule is None:
                fields["idle"] = None
            else:
                idle = fields.get("idle") or {}
                fields["idle"] = {**idle, rule[0]: {**idle.get(rule[0], {}), **rule[1]}}
        project = client.set_project(args.name, **fields)
        _print_json(project) if args.json else print(_tables().projects_table([project]))
    elif args.projects_command == "delete":
        client.delete_project(args.name)
        print(f"deleted project {args.name}")
    else:
        projects = client.projects()
        _print_json(projects) if args.json else print(_tables().projects_table(projects))


def submit_spec(args: argparse.Namespace, command: list[str] | None) -> dict[str, Any]:
    """The JobSpec for `gpupool submit` arguments (only what was given, so server defaults apply)."""
    spec = spec_of_flags(args, command)
    if spec.get("project") is None:
        raise UsageError("the following arguments are required: --project/-p (see 'gpupool submit --help')")
    if spec.get("replicas", 1) > 1 and "gpus" not in spec:
        raise UsageError(f"--replicas {spec['replicas']} needs --gpus: each replica runs on whole GPUs of one node")
    if "command" not in spec and spec.get("kind", "train") == "train":
        raise UsageError("submit needs a command after '--', e.g. gpupool submit --project P --gpus 1 -- "
                         "python train.py")
    return spec


def spec_of_flags(args: argparse.Namespace, command: list[str] | None) -> dict[str, Any]:
    """What the `gpupool submit` flags (and the command after ``--``) say, each value checked on its own.

    The whole JobSpec of a plain submit (:func:`submit_spec` adds what it
    must hold); the defaults of every line with ``--from``.
    """
    if command is not None and args.command_args:
        raise UsageError(f"unexpected argument {args.command_args[0]!r} before '--': give the command once, "
                         "after '--'")
    command = command if command is not None else list(args.command_args)
    spec: dict[str, Any] = {} if args.project is None else {"project": args.project}
    for key in ("kind", "name", "gpus", "gpu_fraction", "gpu_memory", "gpu_model", "priority", "workdir",
                "cpu", "memory", "client_key", "image", "replicas"):
        value = getattr(args, key)
        if value is not None:
            spec[key] = value
    if spec.get("gpus") is not None and spec["gpus"] < 1:
        raise UsageError(f"--gpus must be at least 1, not {spec['gpus']}")
    if spec.get("replicas") is not None and spec["replicas"] < 1:
        raise UsageError(f"--replicas must be at least 1, not {spec['replicas']}")
    if "gpu_fraction" in spec and not 0 < spec["gpu_fraction"] < 1:
        raise UsageError(f"--gpu-fraction must be between 0 and 1 (exclusive), not {spec['gpu_fraction']}; "
                         "use --gpus for whole GPUs")
    if "workdir" in spec:
        spec["workdir"] = os.path.abspath(spec["workdir"])
    if args.env:
        spec["env"] = dict(args.env)
    if args.label:
        spec["labels"] = dict(args.label)
    if args.node_selector:
        spec["node_selector"] = dict(args.node_selector)
    if args.toleration:
        spec["tolerations"] = list(args.toleration)
    if command:
        spec["command"] = command
    return spec


def cmd_submit(client: GpupoolClient, args: argparse.Namespace, command: list[str] | None) -> int:
    """One job from the flags, or with ``--from`` every job of a file (:mod:`gpupool.cli.submit_from`)."""
    if args.from_file is not None:
        from gpupool.cli.submit_from import submit_from

        return submit_from(client, args, spec_of_flags(args, command))
    job = client.submit(with_submit_dir(submit_spec(args, command), client.url))
    _print_json(job) if args.json else print(_tables().submitted_line(job))
    return 0


def cmd_list(client: GpupoolClient, args: argparse.Namespace) -> None:
    filters: dict[str, Any] = {}
    for key in ("project", "user", "kind", "limit"):
        if getattr(args, key) is not None:
            filters[key] = getattr(args, key)
    if args.mine:
        filters["user"] = client.whoami()["user"]
    if args.state:
        filters["state"] = args.state
    elif not args.all:
        filters["state"] = ",".join(LIVE_STATES)
    jobs = client.jobs(**filters)
    if not args.state and not args.all:
        jobs = _with_just_finished(client, jobs, filters)
    _print_json(jobs) if args.json else print(_tables().jobs_table(jobs))


JUST_FINISHED_S = 600


def _with_just_finished(client: GpupoolClient, live: list[dict[str, Any]],
                        filters: dict[str, Any]) -> list[dict[str, Any]]:
    """The live jobs and, after them, those that ended in the last 10 minutes (newest first).

    A job that failed a second after its submit would otherwise vanish from
    ``gpupool list`` before its owner looked: they see it, and its reason.
    """
    ended = client.jobs(**{**filters, "state": "succeeded,failed,cancelled,rejected", "limit": 20})
    since = time.time() - JUST_FINISHED_S
    return live + [j for j in ended if (j.get("finished_at") or 0) >= since]


def cmd_describe(client: GpupoolClient, args: argparse.Namespace) -> None:
    job = client.job(args.job)
    _print_json(job) if args.json else print(_tables().job_text(job))


def cmd_action(client: GpupoolClient, args: argparse.Namespace) -> int | None:
    if args.command == "cancel" and getattr(args, "user", None) is not None:
        return cancel_users_jobs(client, args)
    _print_job_line(getattr(client, args.command)(args.job), args)
    return None


def cancel_users_jobs(client: GpupoolClient, args: argparse.Namespace) -> int:
    """``gpupool cancel --user NAME``: cancel each unfinished job of NAME, say what happened to each; 1 if any failed.

    What a Hub admin does for a deleted user (docs/jupyterhub.md): their jobs
    are not tied to their login and would otherwise run on. Each job is
    cancelled on its own, as ``gpupool cancel JOB`` would (the server decides
    who may), so one refusal does not stop the others.
    """
    done: list[dict[str, Any]] = []
    failed: set[str] = set()
    while True:
        jobs = [j for j in client.jobs(user=args.user, state=",".join(LIVE_STATES)) if j["id"] not in failed]
        if not jobs:
            break
        for job in jobs:
            try:
                done.append(client.cancel(job["id"]))
            except GpupoolError as e:
                failed.add(job["id"])
                print(f"gpupool: error: {job['id']}: {escape(e.message)}", file=sys.stderr)
                continue
            if not args.json:
                _print_job_line(done[-1], args)
    if args.json:
        _print_json(done)
    else:
        who = escape(args.user)
        print(f"cancelled {len(done)} job{'' if len(done) == 1 else 's'} of {who}" if done or failed
              else f"{who} has no queued, running or paused job")
    return EXIT_SERVER if failed else 0


def cmd_logs(client: GpupoolClient, args: argparse.Namespace, poll_s: float = 0.5) -> None:
    offset = 0
    while True:
        chunk = client.logs(args.job, offset=offset, replica=args.replica)
        if args.json and not args.follow:
            _print_json(chunk)
            return
        if chunk.get("data"):
            sys.stdout.write(chunk["data"])
            sys.stdout.flush()
        advanced = int(chunk.get("offset", offset)) != offset
        offset = int(chunk.get("offset", offset))
        if not args.follow:
            if chunk.get("eof") or not advanced:
                return
            continue
        if not advanced:
            if chunk.get("eof") and client.job(args.job)["state"] in FINAL_STATES:
                # One last read: output written between the two calls.
                last = client.logs(args.job, offset=offset, replica=args.replica)
                sys.stdout.write(last.get("data") or "")
                sys.stdout.flush()
                return
            time.sleep(poll_s)


def event_line(event: dict[str, Any]) -> str:
    """One human line per event: time, seq, type, job and state, user/project, reason (escaped: others' text)."""
    stamp = time.strftime("%H:%M:%S", time.localtime(event.get("t") or 0))
    parts = [stamp, f"#{event.get('seq')}", str(event.get("type", ""))]
    if event.get("job_id"):
        parts.append(f"{event['job_id']} {event.get('state', '')}".rstrip())
    if event.get("user") or event.get("project"):
        parts.append(f"{event.get('project', '-')}/{event.get('user', '-')}")
    if event.get("reason"):
        parts.append(f"- {event['reason']}")
    return escape("  ".join(parts))


def cmd_events(client: GpupoolClient, args: argparse.Namespace) -> None:
    since = args.since
    while True:
        reply = client.events(since=since, timeout=25 if args.follow else 0)
        for event in reply["events"]:
            print(json.dumps(event) if args.json else event_line(event), flush=True)
        if not reply["events"] and not args.follow:
            return
        since = reply["last"]


def cmd_login(client: GpupoolClient, args: argparse.Namespace) -> None:
    if not client.token:
        raise UsageError("login needs a token: --token TOKEN or $GPUPOOL_TOKEN")
    me = client.whoami()  # refuses a wrong token or URL before anything is written
    path = config_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"url": client.url, "token": client.token}, f)
    os.replace(tmp, path)
    print(f"logged in to {client.url} as {_who(me)}; saved in {path}")


def cmd_tokens(client: GpupoolClient, args: argparse.Namespace) -> None:
    reply = client.create_token(args.user)
    if args.json:
        _print_json(reply)
    else:
        print(reply["token"])
        sys.stderr.write(f"token for {escape(str(reply['user']))} (shown once; give it to them as GPUPOOL_TOKEN)\n")


def cmd_report(client: GpupoolClient, args: argparse.Namespace) -> None:
    from gpupool.cli.report import report_table, write_csv

    reply = client.report(since=time.time() - args.since, by=args.by)
    if args.json:
        _print_json(reply)
    elif args.csv:
        write_csv(reply)
    else:
        print(report_table(reply))


COMMANDS = {
    "status": cmd_status, "whoami": cmd_whoami, "projects": cmd_projects, "list": cmd_list,
    "describe": cmd_describe, "logs": cmd_logs, "pause": cmd_action, "resume": cmd_action,
    "cancel": cmd_action, "renew": cmd_action, "tokens": cmd_tokens, "events": cmd_events,
    "login": cmd_login, "report": cmd_report,
}


def where_to_look(url: str | None) -> str:
    """A hint when the URL (``--url``, else the environment) was nobody's choice: how a scheduler is found."""
    from gpupool.client import DEFAULT_URL, resolve_connection

    if url or os.environ.get("GPUPOOL_URL"):
        return ""
    try:
        if resolve_connection()[0] != DEFAULT_URL:
            return ""
    except GpupoolError:
        return ""
    from gpupool.client import runtime_file

    return (f" (no scheduler of yours is running here: none in {runtime_file.runtime_dir()}; start one with "
            "scripts/run or gpupool serve, or give --url / $GPUPOOL_URL)")


def _fail(message: str, code: int) -> int:
    """One line on stderr; the server's message may quote other users' text, so it is escaped."""
    sys.stderr.write(f"gpupool: error: {escape(message)}\n")
    return code


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `gpupool` script; returns the exit status."""
    arguments = list(sys.argv[1:] if argv is None else argv)
    arguments, command = _split_command(arguments)
    parser = build_parser(_command_in(arguments))
    try:
        args = parser.parse_args(arguments)
    except SystemExit as e:
        return int(e.code or 0)
    if command is not None and args.command != "submit":
        return _fail(f"'--' and a command only go with submit, not {args.command}", EXIT_USAGE)
    try:
        if args.command == "serve":
            from gpupool.cli.serve import cmd_serve

            return cmd_serve(args)
        if args.command == "node-agent":
            return int(_node_agent().main(args))
        with GpupoolClient(args.url, args.token, timeout=args.timeout) as client:
            if args.command == "submit":
                return cmd_submit(client, args, command)
            if (code := COMMANDS[args.command](client, args)) is not None:
                return int(code)
    except UsageError as e:
        return _fail(str(e), EXIT_USAGE)
    except Unavailable as e:
        return _fail(e.message + where_to_look(args.url), EXIT_UNREACHABLE)
    except GpupoolError as e:
        return _fail(e.message, EXIT_SERVER)
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
