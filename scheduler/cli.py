"""`gpupool`: the command line of the scheduler.

Every command but ``serve`` is a thin layer over :class:`scheduler.client.GpupoolClient`:
parse arguments, make one or two calls, print a table (or JSON with ``--json``).
Failures print one line, ``gpupool: error: <message>``, on stderr and exit with
2 (bad usage), 1 (the scheduler refused: the server's own message) or 3 (the
scheduler cannot be reached).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

from scheduler.cli_fast import submitted_line
from scheduler.client import GpupoolClient, config_path
from scheduler.errors import GpupoolError, Unavailable

# Every call imports this module: keep it to what `gpupool submit` needs. The tables
# (scheduler.cli_tables), the service (serve) and typing are imported where used.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any, NoReturn

EXIT_SERVER = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3

FINAL_STATES = {"succeeded", "failed", "cancelled", "rejected"}

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgtpe]?i?)b?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "p": 10**15, "e": 10**18,
          "ki": 2**10, "mi": 2**20, "gi": 2**30, "ti": 2**40, "pi": 2**50, "ei": 2**60}


class UsageError(Exception):
    """A mistake in the command line itself (exit 2)."""


def parse_size(text: str) -> int:
    """'20GiB' -> 21474836480; '20GB' or '20G' -> 20000000000; '1024' -> 1024 (bytes)."""
    match = _SIZE.match(text)
    if not match:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (examples: 20GiB, 512MiB, 16G, 1073741824)")
    number, unit = match.groups()
    value = float(number) * _UNITS[unit.lower()]
    if value < 1:
        raise argparse.ArgumentTypeError(f"size must be at least one byte, not {text!r}")
    return int(value)


def _finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value == value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def _limit(text: str) -> float | None:
    return None if text.lower() in ("none", "null", "unlimited", "") else _finite_float(text)


def _key_value(text: str) -> tuple[str, str]:
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, not {text!r}")
    return key, value


class _Formatter(argparse.HelpFormatter):
    """argparse's formatter, sized from the terminal without importing shutil.

    argparse makes a formatter for every argument it adds, and its default one
    imports shutil (and with it bz2, lzma, fnmatch) just to ask for the width.
    """

    def __init__(self, prog: str, indent_increment: int = 2, max_help_position: int = 24,
                 width: int | None = None) -> None:
        if width is None:
            width = _terminal_columns() - 2
        super().__init__(prog, indent_increment, max_help_position, width)


def _terminal_columns() -> int:
    """$COLUMNS, else the terminal's width, else 80 (what shutil.get_terminal_size does); asked once."""
    global _COLUMNS
    if _COLUMNS is None:
        try:
            _COLUMNS = int(os.environ["COLUMNS"])
        except (KeyError, ValueError):
            try:
                _COLUMNS = os.get_terminal_size(sys.__stdout__.fileno()).columns or 80
            except (AttributeError, ValueError, OSError):
                _COLUMNS = 80
    return _COLUMNS


_COLUMNS: int | None = None


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line on stderr and exit 2, and help is laid out by :class:`_Formatter`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", _Formatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        sys.stderr.write(f"gpupool: error: {message} (see '{self.prog} --help')\n")
        raise SystemExit(EXIT_USAGE)


def _connection_options(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """--url/--token/--timeout, accepted after the command too (gpupool status --url ...).

    Added to each command's parser directly: a shared parent parser would be one
    more parser to build, and copied, on every call.
    """
    parser.add_argument("--url", default=argparse.SUPPRESS, help="scheduler URL")
    parser.add_argument("--token", default=argparse.SUPPRESS, help="API token")
    parser.add_argument("--timeout", type=float, default=argparse.SUPPRESS, help="seconds to wait for a reply")
    return parser


def _reader(sub: Any, name: str, help_text: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help_text, description=help_text)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return p


def _add_serve(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the scheduler service", description="Run the scheduler service "
                       "(core + HTTP API) until interrupted.")
    p.add_argument("--state-dir", help="where state lives (default: the user data dir)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8765, help="port (default 8765; 0 picks a free one)")
    p.add_argument("--simulate", metavar="SPEC",
                   help="simulate GPUs, e.g. 4xA100-80GB or 2xA100-80GB,2xT4; several nodes: "
                        "'node-a@rack1=8xA100-80GB;node-b@rack1=8xA100-80GB' (NAME[@GROUP]=SPEC;...)")
    p.add_argument("--admin-token-file", metavar="FILE",
                   help="file holding the admin token (default: $GPUPOOL_ADMIN_TOKEN, else generated into "
                        "<state-dir>/admin_token); never on the command line, which every user can read")
    p.add_argument("--admin-token", help=argparse.SUPPRESS)  # refused with a message saying why
    p.add_argument("--config", metavar="FILE", help="JSON file of service settings (tick_s, min_runtime_s, ...)")
    p.add_argument("--hub", action="store_true", help="accept JupyterHub users' API tokens (run as a Hub service; "
                   "docs/jupyterhub.md); Hub groups become projects")
    p.add_argument("--hub-api-url", metavar="URL", help="the Hub's API, e.g. http://127.0.0.1:8081/hub/api "
                   "(default: $JUPYTERHUB_API_URL, which the Hub sets for its services)")
    p.add_argument("--backend", choices=["local", "kubernetes"], help="where jobs run: this machine (default) or "
                   "a Kubernetes cluster (its GPU nodes are the pool, each job a pod; docs/kubernetes.md)")
    p.add_argument("--kubeconfig", metavar="PATH", help="with --backend kubernetes: the cluster's kubeconfig "
                   "(default: the in-cluster service account, else $KUBECONFIG or ~/.kube/config)")
    p.add_argument("--namespace", metavar="NS", help="with --backend kubernetes: where job pods go (default gpupool)")
    p.add_argument("--image", metavar="IMAGE", help="with --backend kubernetes: a job pod's default image")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])


def _add_status(sub: Any) -> None:
    _reader(sub, "status", "pool, GPUs, quotas and use at a glance")


def _add_whoami(sub: Any) -> None:
    _reader(sub, "whoami", "who the token belongs to, and which scheduler answers")


def _add_projects(sub: Any) -> None:
    p = _reader(sub, "projects", "list projects (or: projects set NAME ..., projects delete NAME)")
    psub = p.add_subparsers(dest="projects_command", metavar="ACTION", parser_class=_Parser, prog="gpupool projects")
    ps = _connection_options(psub.add_parser("set", help="create or change a project (admin)"))
    ps.add_argument("name")
    ps.add_argument("--build-quota", type=_finite_float, help="GPUs for interactive (build) work")
    ps.add_argument("--guarantee", type=_finite_float, help="guaranteed training GPUs")
    ps.add_argument("--limit", type=_limit, default=argparse.SUPPRESS,
                    help="most training GPUs ('none' for no limit)")
    ps.add_argument("--weight", type=_finite_float, help="share of idle GPUs beyond guarantees")
    who = ps.add_mutually_exclusive_group()
    who.add_argument("--members", metavar="LIST", help="who may submit: users and @groups, comma-separated "
                     "(e.g. alice,bob,@ml-team; '' for admins only)")
    who.add_argument("--open", action="store_true", help="let every user submit (remove the members list)")
    ps.add_argument("--json", action="store_true", help="print JSON")
    pd = _connection_options(psub.add_parser("delete", help="delete a project with no live jobs (admin)"))
    pd.add_argument("name")


def _add_submit(sub: Any) -> None:
    p = _reader(sub, "submit", "submit a job: gpupool submit --project P --gpus 1 -- python train.py")
    p.add_argument("--project", "-p", required=True)
    amount = p.add_mutually_exclusive_group()
    amount.add_argument("--gpus", type=int, help="whole GPUs")
    amount.add_argument("--gpu-fraction", type=_finite_float, help="a share of one GPU, 0 < F < 1")
    amount.add_argument("--gpu-memory", type=parse_size, help="GPU memory on one GPU, e.g. 20GiB")
    p.add_argument("--gpu-model", help="GPU model, e.g. A100-80GB")
    p.add_argument("--priority", type=int, default=None, help="higher runs first (default 0)")
    p.add_argument("--name", help="job name (default: from the command)")
    p.add_argument("--workdir", help="working directory (default: a fresh one on the scheduler)")
    p.add_argument("--kind", choices=["train", "build"], default=None, help=argparse.SUPPRESS)
    p.add_argument("--env", type=_key_value, action="append", default=[], metavar="K=V", help="extra environment")
    p.add_argument("--label", type=_key_value, action="append", default=[], metavar="K=V", help="free-form label")
    p.add_argument("--cpu", type=_finite_float, help="CPU cores")
    p.add_argument("--memory", type=parse_size, help="host memory, e.g. 16GiB")
    p.add_argument("--client-key", help="idempotency key: resubmitting returns the live job")
    p.add_argument("--image", metavar="REF", help="container image of the job's pods (kubernetes backend; "
                   "default: the service's configured image)")
    p.add_argument("--replicas", type=int, metavar="N", help="a multi-node job: N processes that start together, "
                   "each on --gpus whole GPUs of one node (default 1)")
    p.add_argument("command_args", nargs="*", metavar="-- COMMAND", help="the command to run, after --")


def _add_list(sub: Any) -> None:
    p = _reader(sub, "list", "list jobs, newest first")
    p.add_argument("--project")
    p.add_argument("--user")
    p.add_argument("--mine", action="store_true", help="only my jobs")
    p.add_argument("--state", help="comma-separated states, e.g. queued,running,paused")
    p.add_argument("--kind", choices=["train", "build"])
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--all", "-a", action="store_true", help="include finished jobs (default: live ones)")


def _add_describe(sub: Any) -> None:
    p = _reader(sub, "describe", "everything about one job")
    p.add_argument("job")


def _add_logs(sub: Any) -> None:
    p = sub.add_parser("logs", help="print a job's output", description="Print a job's output.")
    p.add_argument("job")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    p.add_argument("--json", action="store_true", help="print the reply chunk as JSON")
    p.add_argument("--replica", type=int, metavar="K",
                   help="a multi-node job's replica K alone (0 to replicas-1); without it every replica's "
                        "lines, each prefixed [K]")


def _job_action(name: str, text: str) -> Callable[[Any], None]:
    def add(sub: Any) -> None:
        p = _reader(sub, name, text)
        p.add_argument("job")

    return add


def _add_login(sub: Any) -> None:
    sub.add_parser("login", help="check --url/--token (or $GPUPOOL_URL/$GPUPOOL_TOKEN) and save them "
                   "in the client config", description="Check the URL and token work, then save them in "
                   "$XDG_CONFIG_HOME/gpupool/client.json (mode 0600) so later commands need neither.")


def _add_events(sub: Any) -> None:
    p = sub.add_parser("events", help="print scheduler events (job state changes, pool, projects)",
                       description="Print scheduler events, oldest first; -f keeps following.")
    p.add_argument("--since", type=int, default=0, help="only events after this sequence number")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new events until interrupted")
    p.add_argument("--json", action="store_true", help="one JSON object per line")


def _add_tokens(sub: Any) -> None:
    p = sub.add_parser("tokens", help="API tokens (admin)", description="Manage API tokens (admin).")
    tsub = p.add_subparsers(dest="tokens_command", metavar="ACTION", parser_class=_Parser, prog="gpupool tokens")
    tsub.required = True
    tc = _connection_options(tsub.add_parser("create", help="create a token for a user"))
    tc.add_argument("user")
    tc.add_argument("--json", action="store_true")


SUBCOMMANDS: dict[str, Callable[[Any], None]] = {
    "serve": _add_serve, "status": _add_status, "whoami": _add_whoami, "projects": _add_projects,
    "submit": _add_submit, "list": _add_list, "describe": _add_describe, "logs": _add_logs,
    "pause": _job_action("pause", "pause a running job (it resumes later)"),
    "resume": _job_action("resume", "resume a paused job"),
    "cancel": _job_action("cancel", "cancel a job"),
    "renew": _job_action("renew", "renew a build job's lease"),
    "login": _add_login, "events": _add_events, "tokens": _add_tokens,
    "node-agent": lambda sub: _node_agent().add_parser(sub),
}
"""Each command's arguments, in the order ``gpupool --help`` lists them."""


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or with ``only`` just that command's part.

    ``main`` builds only the command it was given: making all fifteen parsers
    costs more than the rest of a ``gpupool submit`` on the client side.
    """
    parser = _Parser(prog="gpupool", description="Share a pool of GPUs: quotas, a fair training queue, "
                                                 "fractional GPUs.")
    parser.add_argument("--url", help="scheduler URL (default: $GPUPOOL_URL, the client config, the "
                                      "runtime file of a scheduler running here, or http://127.0.0.1:8765)")
    parser.add_argument("--token", help="API token (default: $GPUPOOL_TOKEN, the client config, or that "
                                        "runtime file)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for a reply")
    parser.add_argument("--version", action=_VersionAction)
    # prog given, so argparse need not lay out a usage line (and import shutil) to make one.
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser, prog="gpupool")
    sub.required = True
    original_add_parser = sub.add_parser

    def add_parser(name: str, **kwargs: Any) -> argparse.ArgumentParser:
        made = original_add_parser(name, **kwargs)
        return made if name in ("serve", "node-agent") else _connection_options(made)

    sub.add_parser = add_parser  # type: ignore[method-assign]
    for name, add in SUBCOMMANDS.items():
        if only is None or name == only:
            add(sub)
    return parser


class _VersionAction(argparse.Action):
    """``--version``: the installed version, looked up only when asked (importlib.metadata is slow to import)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest=argparse.SUPPRESS, default=argparse.SUPPRESS, nargs=0,
                         help="print the version and exit")

    def __call__(self, parser: argparse.ArgumentParser, *args: Any) -> None:
        print(f"{parser.prog} {version()}")
        parser.exit()


def version() -> str:
    """This package's version, from its installed metadata."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("jupyter-gpupool")
    except PackageNotFoundError:
        return "(not installed; running from a checkout)"


def _command_in(arguments: list[str]) -> str | None:
    """The command word in ``arguments`` (skipping the global options and their values), if it is one we know."""
    i = 0
    while i < len(arguments):
        word = arguments[i]
        if word in ("--url", "--token", "--timeout"):
            i += 2
            continue
        if word.startswith("-"):
            i += 1
            continue
        return word if word in SUBCOMMANDS else None
    return None


def _split_command(argv: list[str]) -> tuple[list[str], list[str] | None]:
    """Split `... submit [options] -- cmd args` at the first '--' so the command's own options stay its own."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, None


def _tables() -> Any:
    """:mod:`scheduler.cli_tables`, imported only by the commands that print a table."""
    from scheduler import cli_tables

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
        print(f"{job['id']} {job['state']}{reason}")


def _who(me: dict[str, Any]) -> str:
    """'alice' or 'admin (admin)', from a whoami reply."""
    return f"{me['user']}{' (admin)' if me.get('admin') else ''}"


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
    if command is not None and args.command_args:
        raise UsageError(f"unexpected argument {args.command_args[0]!r} before '--': give the command once, "
                         "after '--'")
    command = command if command is not None else list(args.command_args)
    spec: dict[str, Any] = {"project": args.project}
    for key in ("kind", "name", "gpus", "gpu_fraction", "gpu_memory", "gpu_model", "priority", "workdir",
                "cpu", "memory", "client_key", "image", "replicas"):
        value = getattr(args, key)
        if value is not None:
            spec[key] = value
    if spec.get("gpus") is not None and spec["gpus"] < 1:
        raise UsageError(f"--gpus must be at least 1, not {spec['gpus']}")
    if spec.get("replicas") is not None and spec["replicas"] < 1:
        raise UsageError(f"--replicas must be at least 1, not {spec['replicas']}")
    if spec.get("replicas", 1) > 1 and "gpus" not in spec:
        raise UsageError(f"--replicas {spec['replicas']} needs --gpus: each replica runs on whole GPUs of one node")
    if "gpu_fraction" in spec and not 0 < spec["gpu_fraction"] < 1:
        raise UsageError(f"--gpu-fraction must be between 0 and 1 (exclusive), not {spec['gpu_fraction']}; "
                         "use --gpus for whole GPUs")
    if "workdir" in spec:
        spec["workdir"] = os.path.abspath(spec["workdir"])
    if args.env:
        spec["env"] = dict(args.env)
    if args.label:
        spec["labels"] = dict(args.label)
    if command:
        spec["command"] = command
    elif spec.get("kind", "train") == "train":
        raise UsageError("submit needs a command after '--', e.g. gpupool submit --project P --gpus 1 -- "
                         "python train.py")
    return spec


def cmd_submit(client: GpupoolClient, args: argparse.Namespace, command: list[str] | None) -> None:
    job = client.submit(submit_spec(args, command))
    _print_json(job) if args.json else print(submitted_line(job))


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
        filters["state"] = "queued,running,paused"
    jobs = client.jobs(**filters)
    _print_json(jobs) if args.json else print(_tables().jobs_table(jobs))


def cmd_describe(client: GpupoolClient, args: argparse.Namespace) -> None:
    job = client.job(args.job)
    _print_json(job) if args.json else print(_tables().job_text(job))


def cmd_action(client: GpupoolClient, args: argparse.Namespace) -> None:
    _print_job_line(getattr(client, args.command)(args.job), args)


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
    """One human line per event: time, seq, type, job and state, user/project, reason."""
    stamp = time.strftime("%H:%M:%S", time.localtime(event.get("t") or 0))
    parts = [stamp, f"#{event.get('seq')}", str(event.get("type", ""))]
    if event.get("job_id"):
        parts.append(f"{event['job_id']} {event.get('state', '')}".rstrip())
    if event.get("user") or event.get("project"):
        parts.append(f"{event.get('project', '-')}/{event.get('user', '-')}")
    if event.get("reason"):
        parts.append(f"- {event['reason']}")
    return "  ".join(parts)


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
        sys.stderr.write(f"token for {reply['user']} (shown once; give it to them as GPUPOOL_TOKEN)\n")


def _jobs_run_as(core: Any) -> str:
    """The banner's line on which account runs jobs, and what that means for a shared service."""
    if core.owner_jobs:
        return "jobs run as: their owners' Unix accounts (docs/service.md, Isolation)"
    import pwd

    me = pwd.getpwuid(os.geteuid()).pw_name
    return (f"jobs run as: {me}, this service's own account: every token holder's jobs can read its state "
            "directory; trust them all, or run the service as root to run each job as its owner "
            "(docs/service.md, Isolation)")


def _admin_token_from_file(path: str | None) -> str | None:
    """The admin token in ``path`` (first line), with a clear error for a missing, empty or open file."""
    if path is None:
        return None
    try:
        with open(path) as f:
            token = f.readline().strip()
        mode = os.stat(path).st_mode
    except OSError as e:
        raise UsageError(f"cannot read the admin token file {path}: {e.strerror}") from None
    if not token:
        raise UsageError(f"the admin token file {path} is empty")
    if mode & 0o077:
        raise UsageError(f"the admin token file {path} may be read by others (mode {mode & 0o777:04o}); "
                         f"chmod 600 {path}")
    return token


def _backend_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The serve flags that choose the backend, as ServiceConfig fields (only those given: the config file's stay)."""
    out: dict[str, Any] = {}
    if args.backend:
        out["backend"] = args.backend
    for flag in ("kubeconfig", "namespace", "image"):
        if getattr(args, flag):
            out[flag] = getattr(args, flag)
    return out


def _check_backend(args: argparse.Namespace, settings: dict[str, Any]) -> None:
    """Flags of one backend with the other chosen (by flag or config file) are a usage error, not ignored."""
    kube = settings.get("backend") == "kubernetes"
    if not kube and any(getattr(args, flag) for flag in ("kubeconfig", "namespace", "image")):
        raise UsageError("--kubeconfig, --namespace and --image go with --backend kubernetes")
    if kube and args.simulate:
        raise UsageError("--simulate is for the local backend; a cluster's GPUs are its nodes'")


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the scheduler in this process until SIGINT/SIGTERM."""
    import asyncio
    import logging
    import signal

    from scheduler.service.config import ServiceConfig, default_state_dir
    from scheduler.service.embedded import EmbeddedScheduler

    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings: dict[str, Any] = {"on_shutdown": "leave"}  # a restart re-adopts running jobs
    if args.config:
        from_file = ServiceConfig.from_file(args.config)  # validates, with a clear message
        with open(args.config) as f:
            given = json.load(f)
        settings.update({k: v for k, v in given.items() if k != "state_dir"})
        if args.state_dir is None and "state_dir" in given:
            args.state_dir = str(from_file.state_dir)
    if args.hub or args.hub_api_url:
        settings["hub"] = True
    if args.hub_api_url:
        settings["hub_api_url"] = args.hub_api_url
    if args.admin_token is not None:
        raise UsageError("--admin-token puts the token on the command line, where every user of this machine "
                         "can read it (/proc/PID/cmdline); use --admin-token-file FILE or $GPUPOOL_ADMIN_TOKEN")
    settings.update(_backend_settings(args))
    _check_backend(args, settings)
    state_dir = args.state_dir or str(default_state_dir())
    from scheduler.service.hardening import make_undumpable

    make_undumpable()  # our environment (a token in it) and memory: not readable by jobs of our own user
    admin_token = _admin_token_from_file(args.admin_token_file) or os.environ.get("GPUPOOL_ADMIN_TOKEN") or None
    scheduler = EmbeddedScheduler(state_dir, simulate=args.simulate, admin_token=admin_token,
                                  host=args.host, port=args.port, config=settings)

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await scheduler.start()
        tasks: list[asyncio.Future[None]] = []  # the Hub group sync, when on
        try:
            simulated = " with SIMULATED GPUs" if getattr(scheduler.core, "simulated", False) else ""
            where = ("as given (--admin-token-file / $GPUPOOL_ADMIN_TOKEN)" if admin_token
                     else f"in {scheduler.admin_token_path}")
            print(f"gpupool scheduler listening on {scheduler.url}{simulated}", flush=True)
            print(f"state directory: {scheduler.state_dir}", flush=True)
            if args.host not in ("127.0.0.1", "localhost", "::1"):
                print(f"warning: listening on {args.host} over plain HTTP: tokens cross the network "
                      "unencrypted; put a TLS proxy in front", flush=True)
            print(_jobs_run_as(scheduler.core), flush=True)
            hub = getattr(scheduler.core, "hub", None)
            if hub is not None:
                print(f"JupyterHub users' tokens accepted (checked with {hub.auth.api_url}, cached "
                      f"{scheduler.core.config.hub_cache_s:g} s)", flush=True)
                from scheduler.service.hub_sync import sync_groups_forever

                tasks.append(asyncio.ensure_future(sync_groups_forever(hub, scheduler.core.config.hub_sync_s)))
            print(f"admin token: {where}", flush=True)
            print(f"  export GPUPOOL_URL={scheduler.url}", flush=True)
            if not admin_token:
                print(f"  export GPUPOOL_TOKEN=$(cat {scheduler.admin_token_path})", flush=True)
            if scheduler.runtime_path:
                print(f"gpupool commands run here by this user find it with no flags "
                      f"(runtime file {scheduler.runtime_path})", flush=True)
            await stop.wait()
            print("gpupool scheduler stopping", flush=True)
        finally:
            for task in tasks:
                task.cancel()
            await scheduler.stop()

    asyncio.run(run())
    return 0


COMMANDS = {
    "status": cmd_status, "whoami": cmd_whoami, "projects": cmd_projects, "list": cmd_list,
    "describe": cmd_describe, "logs": cmd_logs, "pause": cmd_action, "resume": cmd_action,
    "cancel": cmd_action, "renew": cmd_action, "tokens": cmd_tokens, "events": cmd_events,
    "login": cmd_login,
}


def where_to_look(url: str | None) -> str:
    """A hint when the URL (``--url``, else the environment) was nobody's choice: how a scheduler is found."""
    from scheduler.client import DEFAULT_URL, resolve_connection

    if url or os.environ.get("GPUPOOL_URL"):
        return ""
    try:
        if resolve_connection()[0] != DEFAULT_URL:
            return ""
    except GpupoolError:
        return ""
    from scheduler import runtime_file

    return (f" (no scheduler of yours is running here: none in {runtime_file.runtime_dir()}; start one with "
            "scripts/run or gpupool serve, or give --url / $GPUPOOL_URL)")


def _node_agent() -> Any:
    """scheduler.kube.node_agent, imported only for its command (it is a cluster-side tool)."""
    from scheduler.kube import node_agent

    return node_agent


def _fail(message: str, code: int) -> int:
    sys.stderr.write(f"gpupool: error: {message}\n")
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
            return cmd_serve(args)
        if args.command == "node-agent":
            return int(_node_agent().main(args))
        client = GpupoolClient(args.url, args.token, timeout=args.timeout)
        if args.command == "submit":
            cmd_submit(client, args, command)
        else:
            COMMANDS[args.command](client, args)
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
