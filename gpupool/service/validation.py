"""Check a JobSpec or project fields from the wire before anything changes.

Every rule raises :class:`gpupool.wire.errors.InvalidRequest` with one sentence
naming the field, so a bad request becomes a 400 with a message the user can
act on, and the store is never touched by bad input.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from gpupool.policy.model import MILLI
from gpupool.service.membership import validate_members
from gpupool.wire.errors import InvalidRequest
from gpupool.wire.limits import (
    MAX_JOB_NAME,
    MAX_NODE_CPU,
    MAX_NODE_GPUS,
    MAX_NODE_MEMORY,
    MAX_PROJECT_NAME,
    MAX_USER_NAME,
    NAME_RE,
    USER_RE,
    check_json_value,
)
from gpupool.wire.placement import check_placement, placement_of
from gpupool.wire.plain_text import escape
from gpupool.wire.schemas import MAX_MODEL_NAME
from gpupool.wire.schemas import validate as validate_body
from gpupool.wire.states import JobKind


@dataclass(frozen=True)
class PoolLimits:
    """What the pool can possibly give, for the "absurd size" checks."""

    models: dict[str, int]  # model -> memory bytes (largest of that model)
    max_gpus: dict[str, int]  # pool ("build"/"train") -> most GPUs on one node serving it
    cpu: float
    memory: int
    total_gpus: int
    # GPU count of each node serving the train pool: how many replicas of G GPUs the pool could ever hold
    # (() = not known: the replica count is then left to the policy, which refuses a gang that cannot fit).
    train_nodes: tuple[int, ...] = ()
    # The pool's nodes come and go (a cluster): a request is not measured against the nodes of the moment
    # (none may have joined yet, the big one may be drained); the policy makes such work wait instead.
    elastic: bool = False


@dataclass
class JobSpec:
    """A validated, normalised JobSpec."""

    project: str
    kind: str
    name: str
    gpus: int = 0
    gpu_fraction: float | None = None
    gpu_memory: int | None = None
    gpu_model: str | None = None
    priority: int = 0
    command: list[str] | None = None
    workdir: str | None = None
    # The folder the submitter was in (the CLI sends it when it shares the scheduler's machine): the
    # working directory of a local train job that names none. Not stored: it only picks the workdir.
    submit_dir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    cpu: float | None = None
    memory: int | None = None
    labels: dict[str, str] = field(default_factory=dict)
    client_key: str | None = None
    image: str | None = None  # a container image (cluster backends); None: the configured default
    replicas: int = 1  # a multi-node gang's processes (pods), each on ``gpus`` whole GPUs of one node
    # node_selector / node_affinity / tolerations as set (gpupool.wire.placement.placement_of); {} = none
    placement: dict[str, Any] = field(default_factory=dict)

    def request(self) -> dict[str, Any]:
        """The Job's ``request`` object (wire units); placement rules only when the job has some."""
        return {"gpus": self.gpus, "gpu_fraction": self.gpu_fraction, "gpu_memory": self.gpu_memory,
                "gpu_model": self.gpu_model, "cpu": self.cpu, "memory": self.memory, **self.placement}


def validate_spec(spec: Any, project_names: set[str], limits: PoolLimits) -> JobSpec:
    """Turn a wire JobSpec into a :class:`JobSpec`, or raise ``InvalidRequest``.

    The shape (fields, types, lengths, patterns, plain text) is the wire
    model's: :func:`gpupool.wire.schemas.validate` checks it with the same
    schema the OpenAPI document publishes, for every caller (the HTTP API,
    adopted kubectl pods). What is checked here is what the schema cannot
    know: the projects and the pool of the moment, and rules between fields.
    """
    check_json_value(spec)  # every string storable and every number finite, whoever called
    validate_body("JobSpec", spec, "job spec")
    project = spec["project"]
    if project not in project_names:
        raise InvalidRequest(f"unknown project {project!r}")
    kind = spec.get("kind", JobKind.TRAIN)

    gpus = spec.get("gpus")
    fraction = spec.get("gpu_fraction")
    memory_req = spec.get("gpu_memory")
    given = [n for n, v in (("gpus", gpus), ("gpu_fraction", fraction), ("gpu_memory", memory_req)) if v is not None]
    if len(given) > 1:
        raise InvalidRequest(f"give at most one of gpus, gpu_fraction and gpu_memory (got {' and '.join(given)})")
    model = _pool_model(spec.get("gpu_model"), limits)
    pool = "build" if kind == JobKind.BUILD else "train"
    if gpus is not None:
        most = limits.max_gpus.get(pool, 0)
        if limits.elastic and gpus > MAX_NODE_GPUS:
            raise InvalidRequest(f"gpus={gpus} is more than any node has (at most {MAX_NODE_GPUS})")
        if gpus > most and not limits.elastic:
            raise InvalidRequest(f"gpus={gpus} is more than any node of the {pool} pool has ({most})")
    if fraction is not None:
        if round(fraction * MILLI) < 1:
            raise InvalidRequest(f"gpu_fraction {fraction} is below the smallest share (0.001)")
        fraction = float(fraction)
    if memory_req is not None:
        biggest = limits.models.get(model, 0) if model else max(limits.models.values(), default=0)
        if memory_req > biggest and not limits.elastic:
            raise InvalidRequest(f"gpu_memory={memory_req} bytes is more than any GPU here has ({biggest} bytes)")
    if (gpus or fraction or memory_req) and limits.max_gpus.get(pool, 0) == 0 and not limits.elastic:
        raise InvalidRequest(f"the {pool} pool has no GPUs")

    command = spec.get("command")
    if kind == JobKind.TRAIN:
        if command is None:
            raise InvalidRequest("command is required for a train job (a list of strings)")
        if not command[0]:
            raise InvalidRequest("command must be a non-empty list of strings")
    elif command is not None:
        raise InvalidRequest("a build job has no command (it is a share lease for a kernel)")

    name = spec.get("name")
    if name is None:
        name = default_name(command, kind, project)
    if not name.strip():
        raise InvalidRequest(f"name must be a non-empty string of at most {MAX_JOB_NAME} characters")

    workdir = spec.get("workdir")
    if workdir is not None:
        if not os.path.isabs(workdir):
            raise InvalidRequest("workdir must be an absolute path")
        if not os.path.isdir(workdir):
            raise InvalidRequest(f"workdir {workdir!r} is not an existing directory")
    submit_dir = spec.get("submit_dir")
    if submit_dir is not None and not os.path.isabs(submit_dir):
        raise InvalidRequest("submit_dir must be an absolute path (the folder the job was submitted from)")

    cpu = spec.get("cpu")
    if cpu is not None:
        if cpu > (MAX_NODE_CPU if limits.elastic else limits.cpu):
            where = f"any node has (at most {MAX_NODE_CPU})" if limits.elastic else f"this machine has ({limits.cpu:g})"
            raise InvalidRequest(f"cpu={cpu} is more than {where}")
        cpu = float(cpu)
    memory = spec.get("memory")
    if memory is not None and memory > (MAX_NODE_MEMORY if limits.elastic else limits.memory):
        where = f"any node has (at most {MAX_NODE_MEMORY})" if limits.elastic else f"this machine has ({limits.memory})"
        raise InvalidRequest(f"memory={memory} bytes is more than {where}")

    image = spec.get("image")
    if image is not None and kind == JobKind.BUILD:
        raise InvalidRequest("a build job has no image (it is a share lease for a kernel)")

    replicas = _replicas(spec.get("replicas"), kind, gpus, fraction, memory_req, limits)
    check_placement(spec)

    return JobSpec(
        project=project, kind=kind, name=name.strip(), replicas=replicas, gpus=gpus or 0,
        gpu_fraction=fraction, gpu_memory=memory_req, gpu_model=model, priority=spec.get("priority", 0),
        command=list(command) if command else None, workdir=workdir,
        submit_dir=submit_dir if kind == JobKind.TRAIN else None, env=dict(spec.get("env") or {}), cpu=cpu,
        memory=memory, labels=dict(spec.get("labels") or {}), client_key=spec.get("client_key"), image=image,
        placement=placement_of(spec),
    )


def _pool_model(model: str | None, limits: PoolLimits) -> str | None:
    """``gpu_model`` as the pool spells it (matched case-blind); an elastic pool takes models still to come."""
    if model is None:
        return None
    match = [m for m in limits.models if m.lower() == model.lower()]
    if match:
        return match[0]
    if not limits.elastic:
        have = ", ".join(sorted(limits.models)) or "none"
        raise InvalidRequest(f"unknown GPU model {model!r}; this pool has: {have}")
    if not model.strip():
        raise InvalidRequest(f"gpu_model must be 1-{MAX_MODEL_NAME} characters")
    return model


def _replicas(value: Any, kind: str, gpus: Any, fraction: Any, memory_req: Any, limits: PoolLimits) -> int:
    """Check ``replicas``: a whole number 1..MAX_REPLICAS; more than 1 only for training on whole GPUs.

    A gang's replicas each hold whole GPUs of one node (a fraction or a memory
    share of one GPU cannot be split across machines), and a build share is a
    kernel's lease, never several processes. When the pool's nodes are known,
    a gang that could not fit even on an empty pool is refused here, with
    the count it could have.
    """
    if value is None or value == 1:  # the schema has checked it is a whole number 1..MAX_REPLICAS
        return 1
    if kind != "train":
        raise InvalidRequest("replicas is for train jobs; a build job is one kernel's GPU share")
    if fraction is not None or memory_req is not None:
        which = "gpu_fraction" if fraction is not None else "gpu_memory"
        raise InvalidRequest(f"replicas={value} needs whole GPUs per replica (gpus >= 1), not {which}: "
                             "a share of one GPU cannot be spread over several nodes")
    if gpus is None:
        raise InvalidRequest(f"replicas={value} needs gpus (whole GPUs per replica, at least 1)")
    if limits.train_nodes and not limits.elastic:
        room = sum(n // gpus for n in limits.train_nodes)
        if room < value:
            raise InvalidRequest(f"replicas={value} × gpus={gpus} does not fit this pool: its train nodes could "
                                 f"hold at most {_count(room, 'replica')} of {_count(gpus, 'GPU')} even when idle")
    return int(value)


def _count(n: int, noun: str) -> str:
    """``1 GPU``, ``2 GPUs``, ``0 replicas``: a count people read, not ``GPU(s)``."""
    return f"{n} {noun}{'' if n == 1 else 's'}"


def default_name(command: list[str] | None, kind: str, project: str) -> str:
    """A short name from the command: ``python train.py`` -> ``train.py``, ``python -m pkg`` -> ``pkg``.

    Control characters of the command (which may hold them) come out escaped: a name is shown to others.
    """
    return escape(_name_from(command, kind, project))[:MAX_JOB_NAME]


def _name_from(command: list[str] | None, kind: str, project: str) -> str:
    if not command:
        return f"{kind}-{project}"
    prog = os.path.basename(command[0]) or command[0]
    if prog.startswith("python"):
        args = iter(command[1:])
        for arg in args:
            if arg == "-m":
                return (next(args, "") or prog)[:80]
            if arg == "-c":
                return f"{prog} -c"
            if not arg.startswith("-") and not any(c.isspace() for c in arg):
                return (os.path.basename(arg) or arg)[:80]
    return prog[:80]


def _gpus_to_milli(value: float | None, what: str, total_gpus: int | None) -> int | None:
    """GPUs on the wire to milli-GPU; more than the pool holds is refused unless the pool is elastic (None)."""
    if value is None:  # only train_limit may be null (the schema): no limit
        return None
    if total_gpus is not None and value > total_gpus:
        raise InvalidRequest(f"{what}={value:g} GPUs is more than the whole pool ({total_gpus} GPUs)")
    return int(round(value * MILLI))


def validate_project(name: Any, fields: Any, total_gpus: int | None) -> dict[str, Any]:
    """Check ``PUT /projects/{name}`` input; returns the changes in milli-GPU.

    The fields' shape is the wire model's (``ProjectFields``); checked here is
    what it cannot know. ``total_gpus``: the pool's size, which no quota may
    exceed; None on an elastic pool (a cluster), where an admin sets
    guarantees for the nodes to come and the pool of the moment may be
    smaller (or empty).
    """
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise InvalidRequest(f"project names are 1-{MAX_PROJECT_NAME} letters, digits, '.', '_' or '-', "
                             "starting with a letter or digit")
    check_json_value(fields)
    validate_body("ProjectFields", fields, "project")
    out: dict[str, Any] = {}
    for field_name in ("build_quota", "train_guarantee", "train_limit"):
        if field_name in fields:
            out[f"{field_name}_milli"] = _gpus_to_milli(fields[field_name], field_name, total_gpus)
    if "weight" in fields:
        out["weight"] = float(fields["weight"])
    if "members" in fields:
        out["members"] = validate_members(fields["members"], validate_user)
    return out


def validate_user(user: Any) -> str:
    """Check a user name for a new token; the name becomes the owner of jobs, so it is kept short and plain."""
    if not isinstance(user, str) or len(user) > MAX_USER_NAME or not USER_RE.fullmatch(user):
        raise InvalidRequest(f"user names are 1-{MAX_USER_NAME} letters, digits, '.', '_', '@' or '-', "
                             "starting with a letter or digit")
    return user
