"""The backends' settings that the service's config checks when it is read (pure: no I/O but ``geteuid``).

Why a module of its own: ``ServiceConfig`` (gpupool.service.config) refuses a
bad setting when the config is read, before any state directory is locked or
cluster reached, so a typo in ``job_account_template`` or
``kube_pod_namespaces`` is a clear error at ``gpupool serve``. The service may
not import a backend (docs/design.md, "Package layout and the one-way
imports"), and the backends may not import the service: the rules both read
live here, once.
"""

from __future__ import annotations

import fnmatch
import os
import re
from typing import Any

from gpupool.wire.errors import InvalidRequest

RUN_AS_MODES = ("auto", "owner", "service")
"""``run_jobs_as``: which Unix account runs a local training job (gpupool.backends.local.accounts)."""

SECRET_ENV = frozenset({
    "GPUPOOL_ADMIN_TOKEN", "GPUPOOL_TOKEN", "JUPYTERHUB_API_TOKEN", "JPY_API_TOKEN", "JUPYTER_TOKEN",
    "JUPYTERHUB_OAUTH_CLIENT_SECRET", "JUPYTERHUB_CRYPT_KEY", "CONFIGPROXY_AUTH_TOKEN",
})
"""Variables that hold credentials of the service (or of the Jupyter server it is embedded in): never
passed to a job, not even when an admin names them in ``job_env_passthrough``."""

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\*?")

ANY = "*"
"""In ``kube_pod_namespaces``: every namespace not named (as a key), every project (in a list)."""
POD_NAMESPACES_SETTING = "kube_pod_namespaces"
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def resolve_mode(mode: str) -> str:
    """``"owner"`` or ``"service"``: what ``run_jobs_as`` (``auto`` included) means for this process."""
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


def check_passthrough(names: object) -> list[str]:
    """``job_env_passthrough`` as given, or :class:`InvalidRequest`: variable names, ``PREFIX_*`` allowed.

    The service's own credentials cannot be named: passing them would hand
    the admin token or the Hub's secrets to every user's job.
    """
    if not isinstance(names, list) or not all(isinstance(n, str) and _ENV_NAME.fullmatch(n) for n in names):
        raise InvalidRequest("job_env_passthrough must be a list of environment variable names (a trailing * "
                             f"matches a prefix, e.g. 'NCCL_*'), not {names!r}")
    leaked = sorted(s for s in SECRET_ENV if any(fnmatch.fnmatchcase(s, n) for n in names))
    if leaked:
        raise InvalidRequest(f"job_env_passthrough would pass the service's credentials {', '.join(leaked)} to "
                             "every job; name the variables a job needs instead")
    return names


def pod_namespace_rules(own: str, setting: Any) -> dict[str, frozenset[str]]:
    """``kube_pod_namespaces`` checked: namespace (or ``*``) -> its projects (``*``: every project).

    None: the scheduler's own namespace only, any project. The rules are
    answered by :class:`gpupool.backends.kubernetes.pod_namespaces.PodNamespaces`.
    """
    if setting is None:
        return {own: frozenset({ANY})}
    if not isinstance(setting, dict) or not setting:
        raise InvalidRequest(f"{POD_NAMESPACES_SETTING} must map namespaces to lists of projects, e.g. "
                             f'{{"team-a": ["vision"], "{own}": ["*"]}}, not {setting!r}')
    allowed: dict[str, frozenset[str]] = {}
    for ns, projects in setting.items():
        if ns != ANY and not (isinstance(ns, str) and _NAMESPACE.fullmatch(ns)):
            raise InvalidRequest(f"{POD_NAMESPACES_SETTING}: {ns!r} is not a namespace name (lower case letters, "
                                 "digits and '-', at most 63) or '*'")
        if (not isinstance(projects, list) or not projects
                or not all(isinstance(p, str) and p.strip() for p in projects)):
            raise InvalidRequest(f"{POD_NAMESPACES_SETTING}: namespace {ns!r} needs a non-empty list of project "
                                 f"names (or [\"*\"] for every project), not {projects!r}")
        allowed[ns] = frozenset(p.strip() for p in projects)
    return allowed


def check_lease(name: object, namespace: object, duration_s: object, renew_deadline_s: object,
                retry_period_s: object) -> None:
    """The leader election's Lease settings (``kube_lease_*``), or :class:`InvalidRequest` saying what is wrong.

    The fence depends on the order of the three times: a leader stops
    writing ``renew_deadline_s`` after its last renewal, a standby takes over
    ``duration_s`` after it saw one; the deadline must come first, and a
    leader must get a few tries (``retry_period_s``) before it.
    """
    for what, value in (("kube_lease_name", name), ("kube_lease_namespace", namespace)):
        if not (isinstance(value, str) and _NAMESPACE.fullmatch(value)):
            raise InvalidRequest(f"{what} must be a Kubernetes name (lower case letters, digits and '-', "
                                 f"at most 63), not {value!r}")
    times = (duration_s, renew_deadline_s, retry_period_s)
    if not all(isinstance(t, int | float) and not isinstance(t, bool) and t > 0 for t in times):
        raise InvalidRequest("kube_lease_duration_s, kube_renew_deadline_s and kube_retry_period_s must be "
                             f"numbers > 0, not {duration_s!r}, {renew_deadline_s!r}, {retry_period_s!r}")
    if not float(duration_s) > float(renew_deadline_s) > float(retry_period_s):  # type: ignore[arg-type]
        raise InvalidRequest(f"the lease times must be kube_lease_duration_s ({duration_s}) > kube_renew_deadline_s "
                             f"({renew_deadline_s}) > kube_retry_period_s ({retry_period_s}): a leader stops "
                             "writing at the deadline, before a standby may take over at the duration")
