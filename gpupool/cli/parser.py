"""The `gpupool` command line's grammar: its commands, their options and how values are read.

Kept apart from the commands (:mod:`gpupool.cli.main`) so each file has one job.
Exit codes and the usage error live here because parsing is where most usage
errors are found.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable
from typing import Any, NoReturn

EXIT_SERVER = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3


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


def _toleration(text: str) -> dict[str, str]:
    """``KEY[=VALUE][:EFFECT]`` -> a toleration: Equal with a value, Exists without; no effect: every effect."""
    rest, colon, effect = text.rpartition(":") if ":" in text else (text, "", "")
    key, eq, value = rest.partition("=")
    if not key or (colon and effect not in ("NoSchedule", "PreferNoSchedule", "NoExecute")):
        raise argparse.ArgumentTypeError(f"expected KEY[=VALUE][:NoSchedule|PreferNoSchedule|NoExecute], not {text!r}")
    out = {"key": key, "operator": "Equal" if eq else "Exists"}
    if eq:
        out["value"] = value
    if effect:
        out["effect"] = effect
    return out


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one line on stderr (not the usage text) and exit 2."""

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


def _json_option(parser: argparse.ArgumentParser, help_text: str) -> None:
    """A command's ``--json``; also accepted before the command (``gpupool --json status``), as --url is after it.

    Left unset when not given here (SUPPRESS), so that a ``--json`` before the command is not reset by the
    command's own parser (argparse copies a subparser's defaults over the main parser's values).
    """
    parser.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help=help_text)


def _reader(sub: Any, name: str, help_text: str) -> argparse.ArgumentParser:
    p = sub.add_parser(name, help=help_text, description=help_text)
    _json_option(p, "print JSON instead of a table")
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
    p.add_argument("--pod-namespaces", metavar="SPEC", help="with --backend kubernetes: the namespaces whose pods "
                   "with schedulerName gpupool are queued, each with the projects they may use, e.g. "
                   "'team-a=vision;ml=nlp,speech;gpupool=*' ('*': any namespace or project; default: --namespace only)")
    p.add_argument("--leader-elect", action=argparse.BooleanOptionalAction, default=None,
                   help="with --backend kubernetes: act only while holding the Lease --lease-name, a standby "
                        "otherwise (default on; docs/kubernetes.md, One leader)")
    p.add_argument("--lease-name", metavar="NAME", help="with --backend kubernetes: the leader election's Lease "
                   "in --namespace (default gpupool-scheduler)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])


def _add_status(sub: Any) -> None:
    _reader(sub, "status", "pool, GPUs, quotas and use at a glance")


def _add_whoami(sub: Any) -> None:
    _reader(sub, "whoami", "who the token belongs to, and which scheduler answers")


def _idle_rule(text: str) -> tuple[str, dict[str, Any]] | None:
    """``--idle train=pause,below=5,window=2h`` -> ("train", {...}); ``default`` -> None (the defaults)."""
    from gpupool.cli.report import parse_since

    if text.strip() == "default":
        return None
    head, *rest = [part.strip() for part in text.split(",")]
    kind, _, action = head.partition("=")
    if kind not in ("build", "train"):
        raise argparse.ArgumentTypeError(f"{text!r}: an idle rule starts with build or train (e.g. train=pause)")
    rule: dict[str, Any] = {"action": action} if action else {}
    for part in rest:
        key, _, value = part.partition("=")
        if key == "below":
            try:
                rule["below_percent"] = float(value.rstrip("%"))
            except ValueError:
                raise argparse.ArgumentTypeError(f"{text!r}: below is a percent of the share, e.g. below=5") from None
        elif key == "window":
            rule["window_s"] = parse_since(value)
        else:
            raise argparse.ArgumentTypeError(f"{text!r}: {key!r} is not below=PERCENT or window=DURATION")
    return kind, rule


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
    ps.add_argument("--idle", type=_idle_rule, action="append", metavar="RULE",
                    help="when a running job's GPU share counts idle: KIND[=ACTION][,below=PERCENT][,window=DURATION], "
                    "KIND build or train, ACTION cull|flag|off (build) or flag|pause|off (train), e.g. "
                    "train=pause,window=2h; repeatable; 'default' for the defaults (docs/policy.md, Idle GPUs)")
    _json_option(ps, "print JSON")
    pd = _connection_options(psub.add_parser("delete", help="delete a project with no live jobs (admin)"))
    pd.add_argument("name")


def _add_submit(sub: Any) -> None:
    p = _reader(sub, "submit", "submit a job: gpupool submit --project P --gpus 1 -- python train.py")
    p.add_argument("--project", "-p", help="the job's project (required, unless every --from line names one)")
    p.add_argument("--from", dest="from_file", metavar="FILE",
                   help="submit every job of FILE ('-': standard input), one JSON object (a JobSpec) per line, "
                        "over one connection; the other options are each line's defaults (docs/cli.md)")
    amount = p.add_mutually_exclusive_group()
    amount.add_argument("--gpus", type=int, help="whole GPUs")
    amount.add_argument("--gpu-fraction", type=_finite_float, help="a share of one GPU, 0 < F < 1")
    amount.add_argument("--gpu-memory", type=parse_size, help="GPU memory on one GPU, e.g. 20GiB")
    p.add_argument("--gpu-model", help="GPU model, e.g. A100-80GB")
    p.add_argument("--priority", type=int, default=None, help="higher runs first (default 0)")
    p.add_argument("--name", help="job name (default: from the command)")
    p.add_argument("--workdir", help="working directory (default: the current folder when the scheduler runs on "
                   "this machine, else a fresh one on the scheduler)")
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
    p.add_argument("--node-selector", type=_key_value, action="append", default=[], metavar="K=V",
                   help="kubernetes backend: run only on nodes with this label (repeatable; all must match)")
    p.add_argument("--toleration", type=_toleration, action="append", default=[], metavar="KEY[=VALUE][:EFFECT]",
                   help="kubernetes backend: accept nodes with this taint, e.g. dedicated=inference:NoSchedule "
                        "(repeatable)")
    p.add_argument("command_args", nargs="*", metavar="-- COMMAND", help="the command to run, after --")


def _add_list(sub: Any) -> None:
    p = _reader(sub, "list", "list jobs, newest first")
    p.add_argument("--project")
    p.add_argument("--user")
    p.add_argument("--mine", action="store_true", help="only my jobs")
    p.add_argument("--state", help="comma-separated states, e.g. queued,running,paused")
    p.add_argument("--kind", choices=["train", "build"])
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--all", "-a", action="store_true", help="every finished job too (default: live ones and those that ended in the last 10 minutes)")


def _add_describe(sub: Any) -> None:
    p = _reader(sub, "describe", "everything about one job")
    p.add_argument("job")


def _add_logs(sub: Any) -> None:
    p = sub.add_parser("logs", help="print a job's output", description="Print a job's output.")
    p.add_argument("job")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the job ends")
    _json_option(p, "print the reply chunk as JSON")
    p.add_argument("--replica", type=int, metavar="K",
                   help="a multi-node job's replica K alone (0 to replicas-1); without it every replica's "
                        "lines, each prefixed [K]")


def _job_action(name: str, text: str) -> Callable[[Any], None]:
    def add(sub: Any) -> None:
        p = _reader(sub, name, text)
        p.add_argument("job")

    return add


def _add_cancel(sub: Any) -> None:
    p = _reader(sub, "cancel", "cancel a job, or every unfinished job of a user")
    which = p.add_mutually_exclusive_group(required=True)
    which.add_argument("job", nargs="?", help="the job to cancel")
    which.add_argument("--user", metavar="NAME", help="cancel every queued, running and paused job of NAME "
                       "(an admin's way to settle a departed user's work; yours with your own name)")


def _add_report(sub: Any) -> None:
    from gpupool.cli.report import parse_since

    p = _reader(sub, "report", "allocated, used and idle GPU-hours and efficiency, build and train apart")
    p.add_argument("--since", type=parse_since, default=30 * 86400.0, metavar="DURATION",
                   help="how far back, e.g. 30d (default), 12h, 90m, 2w")
    p.add_argument("--by", choices=["project", "user", "job"], default="project", help="one row per (default: project)")
    p.add_argument("--csv", action="store_true", help="print CSV")


def _add_login(sub: Any) -> None:
    sub.add_parser("login", help="check --url/--token (or $GPUPOOL_URL/$GPUPOOL_TOKEN) and save them "
                   "in the client config", description="Check the URL and token work, then save them in "
                   "$XDG_CONFIG_HOME/gpupool/client.json (mode 0600) so later commands need neither.")


def _add_events(sub: Any) -> None:
    p = sub.add_parser("events", help="print scheduler events (job state changes, pool, projects)",
                       description="Print scheduler events, oldest first; -f keeps following.")
    p.add_argument("--since", type=int, default=0, help="only events after this sequence number")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing new events until interrupted")
    _json_option(p, "one JSON object per line")


def _add_tokens(sub: Any) -> None:
    p = sub.add_parser("tokens", help="API tokens (admin)", description="Manage API tokens (admin).")
    tsub = p.add_subparsers(dest="tokens_command", metavar="ACTION", parser_class=_Parser, prog="gpupool tokens")
    tsub.required = True
    tc = _connection_options(tsub.add_parser("create", help="create a token for a user"))
    tc.add_argument("user")
    _json_option(tc, "print JSON")


SUBCOMMANDS: dict[str, Callable[[Any], None]] = {
    "serve": _add_serve, "status": _add_status, "whoami": _add_whoami, "projects": _add_projects,
    "submit": _add_submit, "list": _add_list, "describe": _add_describe, "logs": _add_logs,
    "pause": _job_action("pause", "pause a running job (it resumes later)"),
    "resume": _job_action("resume", "resume a paused job"),
    "cancel": lambda sub: _add_cancel(sub),
    "renew": _job_action("renew", "renew a build job's lease"),
    "login": _add_login, "events": _add_events, "tokens": _add_tokens, "report": _add_report,
    "node-agent": lambda sub: _node_agent().add_parser(sub),
}
"""Each command's arguments, in the order ``gpupool --help`` lists them."""


def _node_agent() -> Any:
    """gpupool.backends.kubernetes.node_agent, imported only for its command (it is a cluster-side tool)."""
    from gpupool.backends.kubernetes import node_agent

    return node_agent


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The whole command line, or with ``only`` just that command's part.

    ``main`` builds only the command it was given: a call then never imports
    what another command's options need (``node-agent``'s module is the
    Kubernetes backend's), nor spends time on parsers it will not use.
    """
    parser = _Parser(prog="gpupool", description="Share a pool of GPUs: quotas, a fair training queue, "
                                                 "fractional GPUs.")
    parser.add_argument("--url", help="scheduler URL (default: $GPUPOOL_URL, the client config, the "
                                      "runtime file of a scheduler running here, or http://127.0.0.1:8765)")
    parser.add_argument("--token", help="API token (default: $GPUPOOL_TOKEN, the client config, or that "
                                        "runtime file)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for a reply")
    parser.add_argument("--json", action="store_true", help="print JSON (also accepted after the command)")
    parser.add_argument("--version", action=_VersionAction)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser, prog="gpupool")
    sub.required = True
    original_add_parser = sub.add_parser

    def add_parser(name: str, **kwargs: Any) -> argparse.ArgumentParser:
        made = original_add_parser(name, **kwargs)
        return made if name in ("serve", "node-agent") else _connection_options(made)

    sub.add_parser = add_parser  # type: ignore[method-assign,assignment]
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
