"""Service configuration: one dataclass, loadable from a JSON file or a dict.

Every knob has a default that suits a single workstation, so
``ServiceConfig()`` alone gives a working service whose state lives under the
user's data directory. Tests and the embedded scheduler pass a ``state_dir``
in a temporary directory instead.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpupool.backends.settings import (
    check_account_template,
    check_lease,
    check_passthrough,
    pod_namespace_rules,
)
from gpupool.service.placement_config import check_placement_settings
from gpupool.wire.errors import InvalidRequest

_SHUTDOWN_MODES = ("stop", "leave")
_WATCHDOG_MODES = ("off", "warn", "stop")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def default_state_dir() -> Path:
    """Where state lives when nothing is configured: the platform's user data dir; /var/lib/gpupool for root.

    Root's data dir sits under /root (0700), where jobs running as their
    owners' accounts could never reach their own job directories.
    """
    if os.geteuid() == 0:
        return Path("/var/lib/gpupool")
    import platformdirs

    return Path(platformdirs.user_data_dir("gpupool", appauthor=False))



def check_kernel_home(claim: str, path: str, backend: str) -> None:
    """kube_kernel_home_claim / _path: a claim-name template with at most {user} in it, an absolute path."""
    if backend != "kubernetes":
        raise InvalidRequest("kube_kernel_home_claim is for the kubernetes backend (GPU kernels as pods)")
    try:
        example = str(claim).format(user="alice")
    except (KeyError, IndexError, ValueError) as e:
        raise InvalidRequest(f"kube_kernel_home_claim may hold {{user}} and nothing else in braces, not "
                             f"{claim!r} ({e})") from None
    if not _DNS_LABEL.fullmatch(example):
        raise InvalidRequest(f"kube_kernel_home_claim must name a PersistentVolumeClaim (lower case letters, "
                             f"digits and '-'), not {claim!r}")
    if not (isinstance(path, str) and path.startswith("/")):
        raise InvalidRequest(f"kube_kernel_home_path must be an absolute path, not {path!r}")

@dataclass
class ServiceConfig:
    """All settings of one scheduler service.

    ``simulate``: ``None`` uses NVML when it works and otherwise falls back to
    ``default_simulation``; a spec string such as ``"4xA100-80GB"`` or
    ``"2xA100-80GB,2xT4"`` always simulates (even on a GPU machine);
    ``"node-a@rack1=8xA100-80GB;node-b=4xT4"`` simulates a pool of several
    nodes (``NAME[@GROUP]=SPEC`` separated by ``;``).

    ``build_gpus``: ``None`` puts every GPU in one node serving both pools;
    an integer N makes the first N GPUs a build-only node (``<host>-build``)
    and the rest a train-only node (``<host>``).

    ``on_shutdown``: ``"stop"`` pauses running jobs at :meth:`stop` (they are
    resumed automatically on the next start: the embedded Jupyter case, where
    the processes must not outlive the server); ``"leave"`` leaves them
    running and the next start re-adopts them (``gpupool serve`` restarts).
    """

    state_dir: Path = field(default_factory=default_state_dir)
    db_path: Path | None = None  # default: <state_dir>/state.db
    simulate: str | None = None
    default_simulation: str = "2xA100-80GB"
    node_name: str = field(default_factory=socket.gethostname)
    build_gpus: int | None = None
    cpu: float | None = None  # default: os.cpu_count()
    memory: int | None = None  # bytes; default: MemTotal from /proc/meminfo
    admin_token: str | None = None  # default: generated into <state_dir>/admin_token
    admin_user: str = "admin"
    tick_s: float = 5.0  # periodic scheduling cycle, lease expiry, watchdog
    # Train submits and exits within this of a cycle share the next one. 20 ms, not less: a burst of 1,000
    # submits then takes 2.4 s instead of 3.2 s (docs/benchmarks.md, cli); a quiet service decides at once.
    cycle_min_interval_s: float = 0.02
    # The most of its time a busy service spends on deferred cycles: one at most every last cycle / this share.
    cycle_busy_share: float = 0.5
    poll_s: float = 0.2  # how often running processes are checked for exit
    pause_grace_s: float = 10.0  # SIGTERM -> SIGKILL delay when pausing or cancelling
    reply_wait_s: float = 2.0  # pause/cancel calls wait this long for the process to stop
    lease_s: float = 120.0  # build-job lease length; renew() extends it
    history_interval_s: float = 10.0
    history_max_rows: int = 8640  # one day at 10 s
    events_max_rows: int = 10000
    on_shutdown: str = "stop"
    watchdog: str = "warn"
    watchdog_grace_s: float = 30.0
    mps: bool | None = None  # None: detect a running MPS daemon
    min_runtime_s: float = 60.0  # policy knobs (gpupool.policy.PolicyConfig)
    resume_backoff_s: float = 30.0
    starvation_s: float = 300.0
    placement: str = "default"
    max_list: int = 1000  # most jobs a list call returns
    # NORMAL (WAL): commits are not fsynced one by one; a killed or crashed service loses nothing,
    # an OS crash or power loss may lose the last commits. FULL: every commit survives power loss too.
    sqlite_synchronous: str = "NORMAL"
    # Which Unix account runs a training job: "owner" (the account named like the job's owner; a
    # root service only), "service" (the service's own user), "auto" (owner when root, else service).
    # The default comes from $GPUPOOL_RUN_JOBS_AS when set (e.g. the test suite's "service").
    run_jobs_as: str = field(default_factory=lambda: os.environ.get("GPUPOOL_RUN_JOBS_AS", "auto"))
    allow_root_jobs: bool = False  # with "owner": may a job of a user whose account is root run (as root)?
    # With "owner": the account a user's jobs run as, from the user name ("jupyter-{user}" on TLJH).
    job_account_template: str = "{user}"
    # With "owner": system accounts (uid outside login.defs' UID_MIN..UID_MAX: daemon, www-data, nobody) a
    # user's jobs may still run as, by name. None by default: a token for "daemon" runs nothing.
    allowed_system_accounts: list[str] = field(default_factory=list)
    # What a job takes from the service's environment besides PATH, LANG, LC_*, TZ (and its account's HOME,
    # USER, LOGNAME, SHELL): names passed on purpose, "NCCL_*" for a prefix. Nothing else of the service's
    # environment (cloud keys, tokens) reaches a job.
    job_env_passthrough: list[str] = field(default_factory=list)
    # Each project's GPU use is kept decayed by this half-life (default 7 days; 0 keeps none).
    usage_half_life_s: float = 7 * 86400.0
    # Allocated vs used (docs/service.md): each job's 10 s rows are kept this long, its 5 min rows this long.
    use_fine_keep_s: float = 86400.0
    use_coarse_keep_s: float = 90 * 86400.0
    # Where jobs run (docs/kubernetes.md): "local" (this machine's GPUs, jobs as processes) or
    # "kubernetes" (the cluster's GPU nodes are the pool, each attempt a Pod that gpupool binds).
    backend: str = "local"
    kubeconfig: str | None = None  # None: the in-cluster service account, else $KUBECONFIG / ~/.kube/config
    namespace: str = "gpupool"  # where job pods are created
    image: str = "python:3.12-slim"  # a job pod's image when its spec names none
    kube_scheduler_name: str = "gpupool"  # spec.schedulerName of our pods (and of kubectl pods we bind)
    kube_workdir_pvc: str | None = None  # a PVC mounted at each job's working directory (checkpoints survive)
    # GPU kernels as pods (docs/kubernetes.md): the user's home, a PersistentVolumeClaim named by this template
    # ("{user}": the share's user, e.g. "home-{user}" on ReadWriteMany storage), mounted at kube_kernel_home_path.
    kube_kernel_home_claim: str | None = None
    kube_kernel_home_path: str = "/home/jovyan"
    # A job pod whose container cannot start (its image cannot be pulled, a missing ConfigMap or Secret) fails
    # its job after this many seconds of trying, freeing its GPUs; an invalid image name fails it at once.
    kube_start_timeout_s: float = 300.0
    # A job pod the API server refuses to create (a namespace ResourceQuota, PodSecurity, a policy webhook):
    # the job waits queued, its GPUs free, the server's message as its reason, for kube_refused_backoff_s
    # (doubling with each refusal in a row, at most 5 min); the kube_refusals_before_failure-th in a row fails it.
    kube_refused_backoff_s: float = 10.0
    kube_refusals_before_failure: int = 5
    # Namespaces whose kubectl pods (schedulerName ours) are queued, each with the projects its pods may use
    # ({"team-a": ["vision"], "gpupool": ["*"]}; "*" any namespace / project). None: `namespace` only, any project.
    kube_pod_namespaces: dict[str, list[str]] | None = None
    # Placement rules added to gpupool's own jobs (docs/kubernetes.md, "Placement rules"): per pool ("train",
    # "build") and per project, {node_selector, node_affinity, tolerations} as a job spec gives them.
    kube_pool_placement: dict[str, dict[str, Any]] = field(default_factory=dict)
    kube_project_placement: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Leader election (docs/kubernetes.md, "One leader"): the kubernetes backend acts only while this instance
    # holds the Lease kube_lease_name in kube_lease_namespace (None: `namespace`); a standby waits for it and takes
    # over kube_lease_duration_s after the leader's last renewal. A leader stops writing kube_renew_deadline_s after
    # its last renewal; renewals every kube_retry_period_s. Identity None: $POD_NAME, else <hostname>_<pid>.
    kube_leader_election: bool = True
    kube_lease_name: str = "gpupool-scheduler"
    kube_lease_namespace: str | None = None
    kube_lease_duration_s: float = 15.0
    kube_renew_deadline_s: float = 10.0
    kube_retry_period_s: float = 2.0
    kube_leader_identity: str | None = None
    # JupyterHub (docs/jupyterhub.md): with hub on, a request whose token is a Hub API token is that Hub
    # user (Hub admins are admins), checked with the Hub at hub_api_url (default $JUPYTERHUB_API_URL) and
    # cached hub_cache_s. hub_group_prefix: which Hub groups are projects ("" every group, "gpu-" those
    # starting with it, the project named without it; None: none). hub_group_project: the quotas (wire
    # fields, GPUs) a group's project is created with; hub_personal_project: those of the personal
    # project of a user in no such group (None: no personal project).
    hub: bool = False
    hub_api_url: str = ""
    hub_cache_s: float = 60.0
    hub_group_prefix: str | None = ""
    hub_group_project: dict[str, Any] = field(default_factory=dict)
    hub_personal_project: dict[str, Any] | None = None
    hub_access_scopes: list[str] | None = None  # None: $JUPYTERHUB_OAUTH_ACCESS_SCOPES (a managed service's)
    hub_sync_s: float = 300.0  # gpupool serve lists the Hub's groups (projects up front) this often; 0: at start

    def __post_init__(self) -> None:
        self.state_dir = Path(self.state_dir).expanduser()
        if self.db_path is not None:
            self.db_path = Path(self.db_path).expanduser()
        if self.on_shutdown not in _SHUTDOWN_MODES:
            raise InvalidRequest(f"on_shutdown must be one of {', '.join(_SHUTDOWN_MODES)}, not {self.on_shutdown!r}")
        if self.watchdog not in _WATCHDOG_MODES:
            raise InvalidRequest(f"watchdog must be one of {', '.join(_WATCHDOG_MODES)}, not {self.watchdog!r}")
        if self.build_gpus is not None and (not isinstance(self.build_gpus, int) or self.build_gpus < 0):
            raise InvalidRequest(f"build_gpus must be a non-negative integer, not {self.build_gpus!r}")
        if self.simulate:
            from gpupool.inventory.simulated import is_multi_node, parse_nodes

            parse_nodes(self.simulate)  # a bad spec is refused here, before a state dir is locked
            if is_multi_node(self.simulate) and self.build_gpus is not None:
                raise InvalidRequest("build_gpus splits one machine into a build node and a train node; a simulated "
                                     "pool of several nodes has no such split (leave build_gpus out: every "
                                     "simulated node serves both pools)")
        if self.run_jobs_as not in ("auto", "owner", "service"):
            raise InvalidRequest(f"run_jobs_as must be auto, owner or service, not {self.run_jobs_as!r}")
        if self.run_jobs_as == "owner" and os.geteuid() != 0:
            raise InvalidRequest("run_jobs_as 'owner' needs a scheduler running as root (to start jobs as "
                                 "other accounts); use 'service' or 'auto'")
        check_account_template(self.job_account_template)
        check_passthrough(self.job_env_passthrough)
        if not isinstance(self.allowed_system_accounts, list) or \
                not all(isinstance(n, str) and n for n in self.allowed_system_accounts):
            raise InvalidRequest(f"allowed_system_accounts must be a list of account names, "
                                 f"not {self.allowed_system_accounts!r}")
        if self.sqlite_synchronous not in ("FULL", "NORMAL"):
            raise InvalidRequest(f"sqlite_synchronous must be FULL or NORMAL, not {self.sqlite_synchronous!r}")
        if not isinstance(self.usage_half_life_s, int | float) or self.usage_half_life_s < 0:
            raise InvalidRequest(f"usage_half_life_s must be a number >= 0, not {self.usage_half_life_s!r}")
        if not (isinstance(self.use_fine_keep_s, int | float) and isinstance(self.use_coarse_keep_s, int | float)
                and 600 <= self.use_fine_keep_s <= self.use_coarse_keep_s):
            raise InvalidRequest(f"use_fine_keep_s must be at least 600 (seconds) and use_coarse_keep_s at least "
                                 f"that, not {self.use_fine_keep_s!r} and {self.use_coarse_keep_s!r}")
        if self.hub:
            from gpupool.service.hub_config import check_hub_settings

            check_hub_settings(self)
        if self.backend not in ("local", "kubernetes"):
            raise InvalidRequest(f"backend must be local or kubernetes, not {self.backend!r}")
        if self.backend == "kubernetes":  # jobs run in pods, not as Unix accounts of the service's machine
            if self.run_jobs_as == "owner":
                raise InvalidRequest("run_jobs_as 'owner' is for the local backend; on Kubernetes jobs run in pods")
            self.run_jobs_as = "service"
        if not _DNS_LABEL.fullmatch(str(self.namespace)):
            raise InvalidRequest(f"namespace must be a Kubernetes name (lower case letters, digits and '-', "
                                 f"at most 63), not {self.namespace!r}")
        if self.kube_pod_namespaces is not None:
            if self.backend != "kubernetes":
                raise InvalidRequest("kube_pod_namespaces is for the kubernetes backend (pods created with kubectl)")
            pod_namespace_rules(self.namespace, self.kube_pod_namespaces)  # refused here, with a message
        if (self.kube_pool_placement or self.kube_project_placement) and self.backend != "kubernetes":
            raise InvalidRequest("kube_pool_placement and kube_project_placement are for the kubernetes backend "
                                 "(its nodes have the labels and taints they name)")
        check_placement_settings(self.kube_pool_placement, self.kube_project_placement)
        if self.kube_kernel_home_claim is not None:
            check_kernel_home(self.kube_kernel_home_claim, self.kube_kernel_home_path, self.backend)
        check_lease(self.kube_lease_name, self.kube_lease_namespace or self.namespace, self.kube_lease_duration_s,
                    self.kube_renew_deadline_s, self.kube_retry_period_s)
        for name in ("tick_s", "poll_s", "history_interval_s", "lease_s", "kube_start_timeout_s"):
            if not getattr(self, name) > 0:
                raise InvalidRequest(f"{name} must be > 0")
        if not 0 < self.cycle_busy_share <= 1:
            raise InvalidRequest("cycle_busy_share must be > 0 and <= 1 (the most of its time the service spends "
                                 "on scheduling cycles while busy)")
        if not self.kube_refused_backoff_s >= 0:
            raise InvalidRequest("kube_refused_backoff_s must be >= 0")
        if not (isinstance(self.kube_refusals_before_failure, int) and self.kube_refusals_before_failure >= 1):
            raise InvalidRequest("kube_refusals_before_failure must be a whole number >= 1")

    @property
    def database(self) -> Path:
        """The SQLite file."""
        return self.db_path or self.state_dir / "state.db"

    @property
    def jobs_dir(self) -> Path:
        """Per-job directories (logs, run files, default working dirs)."""
        return self.state_dir / "jobs"

    def host_cpu(self) -> float:
        return float(self.cpu if self.cpu is not None else (os.cpu_count() or 1))

    def host_memory(self) -> int:
        if self.memory is not None:
            return int(self.memory)
        try:
            with open("/proc/meminfo") as f:
                for line in f:
                    if line.startswith("MemTotal:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 16 * 1024**3

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ServiceConfig:
        """Build from a dict, refusing unknown keys so typos do not pass silently."""
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise InvalidRequest(f"unknown service setting(s): {', '.join(unknown)}")
        return cls(**data)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> ServiceConfig:
        """Load a JSON config file (keys are the field names of this class)."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as e:
            raise InvalidRequest(f"cannot read service config {path}: {e}") from e
        if not isinstance(data, dict):
            raise InvalidRequest(f"service config {path} must hold a JSON object")
        return cls.from_dict(data)
