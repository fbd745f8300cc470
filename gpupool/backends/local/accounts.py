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

import fnmatch
import os
import pwd
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gpupool.backends.settings import (  # the rules the service's config checks too
    RUN_AS_MODES,
    SECRET_ENV,
    check_account_template,
    check_passthrough,
    resolve_mode,
)
from gpupool.wire.errors import Forbidden

__all__ = ["RUN_AS_MODES", "SECRET_ENV", "RunAs", "blocked_at", "check_account_template", "check_passthrough",
           "job_account", "job_environment", "resolve_mode"]

JOB_ENV_ALLOWED = ("PATH", "LANG", "LANGUAGE", "LC_*", "TZ")
"""What a job takes from the service's environment unless the admin names more (``job_env_passthrough``).

An allow-list, not a deny-list: whatever else the service was started with
(cloud keys, ``HF_TOKEN``, a database password) is the admin's, not every
user's. The account's own names (HOME, USER, LOGNAME, SHELL) are set per job,
and the job's own variables and its GPU variables come on top."""

ACCOUNT_ENV = ("HOME", "USER", "LOGNAME", "SHELL")


@dataclass(frozen=True)
class RunAs:
    """A Unix account to run a job as: ids for setuid/setgid/setgroups, and what its environment says."""

    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str
    shell: str = "/bin/sh"

    def wrapper_arg(self) -> str:
        """``uid:gid:g1,g2``: how the service tells the wrapper whom to run the command as."""
        return f"{self.uid}:{self.gid}:{','.join(str(g) for g in self.groups)}"


def login_uid_range(login_defs: str = "/etc/login.defs") -> tuple[int, int]:
    """``(UID_MIN, UID_MAX)``: the uids of people's accounts, as ``useradd`` reads them (default 1000..60000).

    Below are system accounts (``daemon``, ``bin``, ``www-data``), above them
    ``nobody`` (65534) and uids kept for containers: services, not people, whose
    files and rights a user's job must not get by naming them.
    """
    bounds = {"UID_MIN": 1000, "UID_MAX": 60000}
    try:
        with open(login_defs) as f:
            for line in f:
                parts = line.split()
                if len(parts) >= 2 and parts[0] in bounds and parts[1].isdigit():
                    bounds[parts[0]] = int(parts[1])
    except OSError:
        pass
    return bounds["UID_MIN"], bounds["UID_MAX"]


def job_account(user: str, mode: str, allow_root: bool, template: str = "{user}",
                allowed_system_accounts: Iterable[str] = ()) -> RunAs | None:
    """The account a job of ``user`` runs as; None: as the service's own user (mode ``service``).

    ``template`` names the account from the user: ``{user}`` (the same name,
    as Slurm does) or e.g. ``jupyter-{user}``, the accounts The Littlest
    JupyterHub makes for its users. Raises :class:`Forbidden` when the job may
    not run: no account of that name, an account with uid 0 while
    ``allow_root`` is off, or a system account (uid outside login.defs'
    ``UID_MIN``..``UID_MAX``, e.g. ``daemon``, ``www-data``, ``nobody``) that the
    admin did not name in ``allowed_system_accounts``.
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
    low, high = login_uid_range()
    if account.pw_uid != 0 and not low <= account.pw_uid <= high and name not in set(allowed_system_accounts):
        raise Forbidden(f"user {user!r} maps to the system account {name!r} (uid {account.pw_uid}, outside "
                        f"{low}..{high} of /etc/login.defs): this scheduler runs jobs only as people's "
                        "accounts (an admin can allow this one by name with allowed_system_accounts)")
    groups = tuple(sorted(set(os.getgrouplist(name, account.pw_gid))))
    return RunAs(name, account.pw_uid, account.pw_gid, groups, account.pw_dir, account.pw_shell or "/bin/sh")


def job_environment(service_env: dict[str, str], run_as: RunAs | None,
                    passthrough: Iterable[str] = ()) -> dict[str, str]:
    """What a job takes from the service's environment: the allow-list, and its account's own names.

    ``passthrough``: the admin's ``job_env_passthrough``, names (``NCCL_*``: a
    prefix) passed on purpose besides :data:`JOB_ENV_ALLOWED`. With ``run_as``
    HOME, USER, LOGNAME and SHELL are that account's; without it the job runs
    as the service's own account, whose values it keeps.
    """
    patterns = [*JOB_ENV_ALLOWED, *passthrough]
    if run_as is None:
        patterns += ACCOUNT_ENV
    env = {k: v for k, v in service_env.items()
           if k not in SECRET_ENV and any(fnmatch.fnmatchcase(k, p) for p in patterns)}
    if run_as is not None:
        env.update(USER=run_as.name, LOGNAME=run_as.name, HOME=run_as.home, SHELL=run_as.shell)
    return env


def blocked_at(directory: str, run_as: RunAs | None) -> str | None:
    """Where ``run_as`` (None: this process's account) could not enter and read ``directory``; None if it can.

    Read from the permission bits as the kernel applies them (owner, else
    group, else others; root passes), so a root service can tell at submit
    whether a job's account may work in a folder, instead of the job failing
    at start. ACLs are not read: a folder an ACL opens still fails at start.
    """
    if run_as is None:
        return None if os.access(directory, os.R_OK | os.X_OK) else directory
    if run_as.uid == 0:
        return None
    path = Path(directory)
    for folder in [*reversed(path.parents), path]:
        try:
            st = folder.stat()
        except OSError:
            return str(folder)
        if st.st_uid == run_as.uid:
            bits = (st.st_mode >> 6) & 7
        elif st.st_gid in run_as.groups or st.st_gid == run_as.gid:
            bits = (st.st_mode >> 3) & 7
        else:
            bits = st.st_mode & 7
        need = 5 if folder == path else 1  # read+enter the folder itself, enter every parent
        if bits & need != need:
            return str(folder)
    return None
