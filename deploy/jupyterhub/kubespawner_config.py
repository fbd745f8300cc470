# JupyterHub on Kubernetes (KubeSpawner) with gpupool placing the user servers (docs/kubernetes.md,
# "JupyterHub on Kubernetes"). Load it as a jupyterhub_config.py fragment, or paste it into z2jh's
# hub.extraConfig (values.yaml beside this file): it reads and sets the traitlets config object `c`.
#
# The default profile is a CPU server whose GPU kernels come from the pool: "Python 3 (¼ GPU)" in the
# Launcher asks the scheduler for a share of the user's project and runs that kernel in a pod of its own,
# on a GPU node, as long as the kernel lives (docs/kubernetes.md, "GPU kernels as pods"). The server pod
# carries the labels gpupool.io/role=jupyter-server and gpupool.io/kernel-owner=<user>: the NetworkPolicy
# of each kernel pod admits connections from that pod only.
#
# Every user server becomes a pod that gpupool binds (schedulerName: gpupool) as a *build* share of the
# user's project, never paused: the profile picks its size (CPU only, a quarter of a GPU, one GPU). gpupool
# writes the pod's GPU environment into the ConfigMap gpupool-<pod name> before it binds the pod; the
# server's container reads it with envFrom, so it cannot start before its GPUs are known. GPUPOOL_URL
# points the server's Jupyter extension and `gpupool` CLI at the shared scheduler, which checks the
# user's own JUPYTERHUB_API_TOKEN (gpupool serve --hub).
#
# Settings, from the Hub's environment (z2jh: hub.extraEnv):
#   GPUPOOL_NAMESPACE   where user servers go: the namespace gpupool serve watches (default gpupool)
#   GPUPOOL_URL         the scheduler's Service (default http://gpupool-scheduler.<namespace>.svc:8765)
#   GPUPOOL_GROUP_PREFIX  the Hub-group prefix gpupool serve maps to projects (its hub_group_prefix; default "")
#   GPUPOOL_API_TOKEN   the token gpupool serve --hub uses with the Hub (registers it as an external service)
# ruff: noqa: F821  (`c` is the config object JupyterHub defines when it loads this file)

import os
import re

GPUPOOL_NAMESPACE = os.environ.get("GPUPOOL_NAMESPACE", "gpupool")
GPUPOOL_URL = os.environ.get("GPUPOOL_URL", f"http://gpupool-scheduler.{GPUPOOL_NAMESPACE}.svc:8765")
GPUPOOL_GROUP_PREFIX = os.environ.get("GPUPOOL_GROUP_PREFIX", "")

# What gpupool reads on a pod (gpupool/backends/kubernetes/foreign.py, kernel_pods.py).
PROJECT_LABEL = "gpupool.io/project"
USER_LABEL = "gpupool.io/user"
ROLE_LABEL = "gpupool.io/role"  # a Jupyter server: its user's kernel pods admit it (kernel_pods.py)
OWNER_LABEL = "gpupool.io/kernel-owner"
KIND_ANNOTATION = "gpupool.io/kind"
FRACTION_ANNOTATION = "gpupool.io/gpu-fraction"
GPU_RESOURCE = "nvidia.com/gpu"

# gpupool's project names and the label values Kubernetes allows.
_PROJECT_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_LABEL_VALUE = re.compile(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$")


def gpupool_project(username, groups, prefix=GPUPOOL_GROUP_PREFIX):
    """The user's default gpupool project, as gpupool serve --hub makes it (HubProjectMap.default_project).

    The first of the user's Hub groups (in the Hub's order) that carries the
    prefix and leaves a valid project name; else the user's personal project,
    named after them (gpupool serve's hub_personal_project must be on for it).
    """
    for group in groups:
        if group.startswith(prefix) and _PROJECT_NAME.match(group[len(prefix):]):
            return group[len(prefix):]
    return username


def kernel_owner(username):
    """The user as gpupool writes it in a label value (gpupool.backends.kubernetes.pods.label_value): the same
    on the server pod and on the NetworkPolicy of the user's kernel pods, whatever the name holds."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", username)[:63].strip("_.-") or "none"


def label_safe(value):
    """``value`` if Kubernetes accepts it as a label value; else None (the label is then left out)."""
    return value if len(value) <= 63 and _LABEL_VALUE.match(value) else None


def gpupool_pre_spawn(spawner):
    """Per-user parts of the pod: its project and user labels, and envFrom of its gpupool ConfigMap.

    A profile may name its own project (``extra_labels`` in its
    ``kubespawner_override``): profiles are applied after this hook, and their
    dicts are merged over these.
    """
    groups = [g.name for g in spawner.user.groups]
    project = gpupool_project(spawner.user.name, groups)
    labels = {PROJECT_LABEL: label_safe(project), USER_LABEL: label_safe(spawner.user.name),
              ROLE_LABEL: "jupyter-server", OWNER_LABEL: kernel_owner(spawner.user.name)}
    spawner.extra_labels.update({k: v for k, v in labels.items() if v})
    container = dict(spawner.extra_container_config)
    env_from = [e for e in container.get("envFrom", []) if "gpupool-" not in str(e)]
    env_from.append({"configMapRef": {"name": f"gpupool-{spawner.pod_name}"}})  # written by gpupool at bind
    container["envFrom"] = env_from
    spawner.extra_container_config = container


def _chain(first, then):
    """Run an existing pre_spawn_hook (e.g. one of z2jh's) before ours."""
    if first is None:
        return then

    async def both(spawner):
        out = first(spawner)
        if hasattr(out, "__await__"):
            await out
        then(spawner)

    return both


c.KubeSpawner.namespace = GPUPOOL_NAMESPACE  # gpupool serve queues the schedulerName: gpupool pods it watches there
c.KubeSpawner.scheduler_name = "gpupool"
c.KubeSpawner.extra_annotations.update({KIND_ANNOTATION: "build"})  # a user server: a build share, never paused
c.KubeSpawner.tolerations.extend([{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}])
c.KubeSpawner.environment.update({"GPUPOOL_URL": GPUPOOL_URL})
c.KubeSpawner.start_timeout = 600  # a server may queue for its share; gpupool binds it once it is free
c.KubeSpawner.profile_list = [
    {"display_name": "CPU server + GPU kernels from the pool", "slug": "cpu", "default": True,
     "description": "The server holds no GPU. Pick \"Python 3 (¼ GPU)\" (or ½, 1 GPU) in the Launcher: that "
                    "kernel runs in a pod of its own with its share of a GPU from your project's build quota, "
                    "given back when the kernel shuts down. Plain kernels, data work and training jobs: no GPU."},
    # The whole-server profiles: the server itself holds its share for its whole life.
    {"display_name": "¼ GPU for the whole server", "slug": "quarter-gpu",
     "description": "A quarter of one GPU (memory capped to a quarter) for every kernel of the server, held "
                    "while the server runs, from your project's build quota.",
     "kubespawner_override": {"extra_annotations": {FRACTION_ANNOTATION: "0.25"}}},
    {"display_name": "1 GPU for the whole server", "slug": "one-gpu",
     "description": "One whole GPU for the server, held while it runs, from your project's build quota.",
     "kubespawner_override": {"extra_resource_limits": {GPU_RESOURCE: "1"}}},
]
c.KubeSpawner.pre_spawn_hook = _chain(c.KubeSpawner.get("pre_spawn_hook"), gpupool_pre_spawn)

# The scheduler as an external Hub service: users (and their servers' tokens) may use it.
if os.environ.get("GPUPOOL_API_TOKEN"):
    c.JupyterHub.services.append({"name": "gpupool", "url": GPUPOOL_URL,
                                  "api_token": os.environ["GPUPOOL_API_TOKEN"]})
c.JupyterHub.load_roles.extend([
    {"name": "user", "scopes": ["self", "access:services!service=gpupool"]},
    {"name": "gpupool", "services": ["gpupool"], "scopes": ["list:groups", "read:groups:name"]},
])
c.Spawner.server_token_scopes = ["users:activity!user", "access:servers!server",
                                 "access:services!service=gpupool"]
