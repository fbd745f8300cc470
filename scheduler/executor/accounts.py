"""Which Unix account a job runs as, and what a job must never inherit from the service.

Jobs run as the service's own user unless the service runs as root: then each
job runs as the Unix account named like its owner (as Slurm does), so the
kernel's file permissions keep a job away from the state directory (the
database, the admin token) and from other users' jobs, logs and files. A job
whose owner has no account there is refused with a clear message, and so is
a job that would run as root, unless the admin allows it.

``run_jobs_as`` (service config): ``"auto"`` (default: ``"owner"`` when the
service runs as root, else ``"service"``), ``"owner"`` or ``"service"``.
"""

from __future__ import annotations

import os
import pwd
import stat
from dataclasses import dataclass
from pathlib import Path

from scheduler.errors import Forbidden, InvalidRequest

RUN_AS_MODES = ("auto", "owner", "service")

SECRET_ENV = frozenset({
    "GPUPOOL_ADMIN_TOKEN", "GPUPOOL_TOKEN", "JUPYTERHUB_API_TOKEN", "JPY_API_TOKEN", "JUPYTER_TOKEN",
    "JUPYTERHUB_OAUTH_CLIENT_SECRET", "JUPYTERHUB_CRYPT_KEY", "CONFIGPROXY_AUTH_TOKEN",
})
"""Variables of the service's environment that hold credentials of the service (or of the Jupyter
server it is embedded in): a job's environment is built without them."""


@dataclass(frozen=True)
class RunAs:
    """A Unix account to run a job as: ids for setuid/setgid/setgroups, and what its environment says."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str

    def wrapper_arg(self) -> str:
        """``uid:gid:g1,g2``: how the service tells the wrapper whom to run the command as."""
        return f"{self.uid}:{self.gid}:{','.join(str(g) for g in self.groups)}"


def resolve_mode(mode: str) -> str:
    """``"owner"`` or ``"service"``: what ``auto`` means for this process."""
    if mode not in RUN_AS_MODES:
        raise InvalidRequest(f"run_jobs_as must be one of {', '.join(RUN_AS_MODES)}, not {mode!r}")
    if mode == "auto":
        return "owner" if os.geteuid() == 0 else "service"
    return mode


def check_account_template(template: str) -> str:
    """``job_account_template`` as given, or :class:`InvalidRequest`: it must hold ``{user}`` once and nothing else in braces."""
    if not isinstance(template, str) or template.count("{user}") != 1 or \
            template.replace("{user}", "").count("{") or template.replace("{user}", "").count("}"):
        raise InvalidRequest(f"job_account_template must contain {{user}} once and no other braces "
                             f"(e.g. 'jupyter-{{user}}' for TLJH), not {template!r}")
    return template


def job_account(user: str, mode: str, allow_root: bool, template: str = "{user}") -> RunAs | None:
    """The account a job of ``user`` runs as; None: as the service's own user (mode ``service``).

    ``template`` names the account from the user: ``{user}`` (the same name,
    as Slurm does) or e.g. ``jupyter-{user}``, the accounts The Littlest
    JupyterHub makes for its users. Raises :class:`Forbidden` when the job may
    not run: no account of that name, or an account with uid 0 while
    ``allow_root`` is off.
    """
    if resolve_mode(mode) == "service":
        return None
    name = template.replace("{user}", user)
    try:
        account = pwd.getpwnam(name)
    except KeyError:
        raise Forbidden(f"user {user!r} has no Unix account {name!r} on the scheduler's machine, and this "
                        "scheduler runs each training job as its owner's account (run_jobs_as); ask an admin "
                        "to create one") from None
    if account.pw_uid == 0 and not allow_root:
        raise Forbidden(f"user {user!r} is root: this scheduler does not run jobs as root "
                        "(an admin can allow it with allow_root_jobs)")
    groups = tuple(sorted(set(os.getgrouplist(name, account.pw_gid))))
    return RunAs(name, account.pw_uid, account.pw_gid, groups, account.pw_dir)


def job_environment(service_env: dict[str, str], run_as: RunAs | None) -> dict[str, str]:
    """The service's environment as a job may see it: no credentials, and the account's own names."""
    env = {k: v for k, v in service_env.items() if k not in SECRET_ENV}
    if run_as is not None:
        env.update(USER=run_as.name, LOGNAME=run_as.name, HOME=run_as.home)
    return env


def check_reachable(directory: Path) -> None:
    """Refuse a state directory that jobs running as other accounts could not enter.

    Each job's account must pass through every parent of its job directory:
    they all need the search bit for others (as ``/var/lib`` has, and
    ``/root`` has not).
    """
    for parent in [directory, *directory.parents]:
        try:
            mode = parent.stat().st_mode
        except OSError:
            continue
        if not mode & stat.S_IXOTH:
            raise InvalidRequest(
                f"jobs run as their owners' accounts cannot reach {directory}: {parent} is mode "
                f"{stat.S_IMODE(mode):04o} (others may not enter it); choose a state directory such as "
                "/var/lib/gpupool, or run_jobs_as 'service'")
