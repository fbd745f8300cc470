"""Check a JobSpec or project fields from the wire before anything changes.

Every rule raises :class:`gpupool.wire.errors.InvalidRequest` with one sentence
naming the field, so a bad request becomes a 400 with a message the user can
act on, and the store is never touched by bad input.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from typing import Any

from gpupool.policy.model import MILLI
from gpupool.service.membership import validate_members
from gpupool.wire.errors import InvalidRequest
from gpupool.wire.limits import (
    ENV_KEY_RE,
    IMAGE_RE,
    IMAGE_RULE,
    MAX_CLIENT_KEY,
    MAX_IMAGE,
    MAX_JOB_NAME,
    MAX_MAP_ENTRIES,
    MAX_MAP_KEY,
    MAX_MAP_VALUE,
    MAX_NODE_CPU,
    MAX_NODE_GPUS,
    MAX_NODE_MEMORY,
    MAX_PRIORITY,
    MAX_PROJECT_NAME,
    MAX_QUOTA_GPUS,
    MAX_REPLICAS,
    MAX_USER_NAME,
    NAME_RE,
    USER_RE,
    check_json_value,
)
from gpupool.wire.plain_text import escape, unsafe_problem

SPEC_FIELDS = {
    "project", "kind", "name", "gpus", "gpu_fraction", "gpu_memory", "gpu_model", "priority", "command",
    "workdir", "env", "cpu", "memory", "labels", "client_key", "image", "replicas", "submit_dir",
}
PROJECT_FIELDS = {"build_quota", "train_guarantee", "train_limit", "weight", "members"}
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

    def request(self) -> dict[str, Any]:
        """The Job's ``request`` object (wire units)."""
        return {"gpus": self.gpus, "gpu_fraction": self.gpu_fraction, "gpu_memory": self.gpu_memory,
                "gpu_model": self.gpu_model, "cpu": self.cpu, "memory": self.memory}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    """A finite JSON number that fits a float (JSON integers may be arbitrarily large)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:
        return False


def _plain(text: str, what: str) -> None:
    """Refuse text that would act on a reader's terminal (see :mod:`gpupool.wire.plain_text`), naming the field."""
    problem = unsafe_problem(text)
    if problem:
        raise InvalidRequest(f"{what} {problem}")


def _str_map(value: Any, what: str, key_re: re.Pattern[str] | None = None, plain: bool = False) -> dict[str, str]:
    """env and labels: strings to strings within the limits; ``plain``: keys and values others read (labels)."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequest(f"{what} must be an object of strings")
    out = {}
    for k, v in value.items():
        if not isinstance(k, str) or not isinstance(v, str):
            raise InvalidRequest(f"{what} must map strings to strings (bad entry {k!r})")
        if key_re is not None and not key_re.fullmatch(k):
            raise InvalidRequest(f"{what} has an invalid variable name {k!r}")
        if len(k) > MAX_MAP_KEY or len(v) > MAX_MAP_VALUE:
            raise InvalidRequest(f"{what} entry {k[:40]!r} is too long (keys at most {MAX_MAP_KEY} characters, "
                                 f"values at most {MAX_MAP_VALUE})")
        if plain:
            _plain(k, f"{what}: the key {k[:40]!r}")
            _plain(v, f"{what}.{escape(k[:40])}: the value")
        out[k] = v
    if len(out) > MAX_MAP_ENTRIES:
        raise InvalidRequest(f"{what} has too many entries (at most {MAX_MAP_ENTRIES})")
    return out


def validate_spec(spec: Any, project_names: set[str], limits: PoolLimits) -> JobSpec:
    """Turn a wire JobSpec into a :class:`JobSpec`, or raise ``InvalidRequest``."""
    if not isinstance(spec, dict):
        raise InvalidRequest("the job spec must be a JSON object")
    check_json_value(spec)  # every string storable, whoever called (the API has checked already)
    unknown = sorted(set(spec) - SPEC_FIELDS)
    if unknown:
        raise InvalidRequest(f"unknown job spec field(s): {', '.join(map(str, unknown))}")
    project = spec.get("project")
    if not isinstance(project, str) or not project:
        raise InvalidRequest("project is required (a project name)")
    if project not in project_names:
        raise InvalidRequest(f"unknown project {project!r}")
    kind = spec.get("kind", "train")
    if kind not in ("train", "build"):
        raise InvalidRequest(f"kind must be 'train' or 'build', not {kind!r}")

    gpus = spec.get("gpus")
    fraction = spec.get("gpu_fraction")
    memory_req = spec.get("gpu_memory")
    given = [n for n, v in (("gpus", gpus), ("gpu_fraction", fraction), ("gpu_memory", memory_req)) if v is not None]
    if len(given) > 1:
        raise InvalidRequest(f"give at most one of gpus, gpu_fraction and gpu_memory (got {' and '.join(given)})")
    model = spec.get("gpu_model")
    if model is not None:
        if not isinstance(model, str):
            raise InvalidRequest("gpu_model must be a string")
        match = [m for m in limits.models if m.lower() == model.lower()]
        if match:
            model = match[0]
        elif not limits.elastic:
            have = ", ".join(sorted(limits.models)) or "none"
            raise InvalidRequest(f"unknown GPU model {model!r}; this pool has: {have}")
        elif not model.strip() or len(model) > 256:
            raise InvalidRequest("gpu_model must be 1-256 characters")
        else:
            _plain(model, "gpu_model")
    pool = "build" if kind == "build" else "train"
    n_gpus = 0
    if gpus is not None:
        if not _is_int(gpus):
            raise InvalidRequest(f"gpus must be a whole number, not {gpus!r}")
        if gpus < 1:
            raise InvalidRequest(f"gpus must be at least 1, not {gpus}")
        most = limits.max_gpus.get(pool, 0)
        if limits.elastic and gpus > MAX_NODE_GPUS:
            raise InvalidRequest(f"gpus={str(gpus)[:20]} is more than any node has (at most {MAX_NODE_GPUS})")
        if gpus > most and not limits.elastic:
            raise InvalidRequest(f"gpus={str(gpus)[:20]} is more than any node of the {pool} pool has ({most})")
        n_gpus = gpus
    if fraction is not None:
        if not _is_num(fraction):
            raise InvalidRequest(f"gpu_fraction must be a number, not {fraction!r}")
        if not 0 < fraction < 1:
            raise InvalidRequest(f"gpu_fraction must be between 0 and 1 (exclusive), not {fraction}; use gpus for whole GPUs")
        if round(fraction * MILLI) < 1:
            raise InvalidRequest(f"gpu_fraction {fraction} is below the smallest share (0.001)")
        fraction = float(fraction)
    if memory_req is not None:
        if not _is_int(memory_req):
            raise InvalidRequest(f"gpu_memory must be a whole number of bytes, not {memory_req!r}")
        if memory_req <= 0:
            raise InvalidRequest(f"gpu_memory must be positive, not {memory_req}")
        biggest = limits.models.get(model, 0) if model else max(limits.models.values(), default=0)
        if memory_req > biggest and not limits.elastic:
            raise InvalidRequest(f"gpu_memory={memory_req} bytes is more than any GPU here has ({biggest} bytes)")
    if (gpus or fraction or memory_req) and limits.max_gpus.get(pool, 0) == 0 and not limits.elastic:
        raise InvalidRequest(f"the {pool} pool has no GPUs")

    priority = spec.get("priority", 0)
    if not _is_int(priority) or abs(priority) > MAX_PRIORITY:
        raise InvalidRequest(f"priority must be a whole number between -{MAX_PRIORITY} and {MAX_PRIORITY}")

    command = spec.get("command")
    if kind == "train":
        if command is None:
            raise InvalidRequest("command is required for a train job (a list of strings)")
        if (not isinstance(command, list) or not command
                or not all(isinstance(c, str) for c in command) or not command[0]):
            raise InvalidRequest("command must be a non-empty list of strings")
    elif command is not None:
        raise InvalidRequest("a build job has no command (it is a share lease for a kernel)")

    name = spec.get("name")
    if name is None:
        name = default_name(command, kind, project)
    if not isinstance(name, str) or not name.strip() or len(name) > MAX_JOB_NAME:
        raise InvalidRequest(f"name must be a non-empty string of at most {MAX_JOB_NAME} characters")
    _plain(name, "name")

    workdir = spec.get("workdir")
    if workdir is not None:
        if not isinstance(workdir, str) or not os.path.isabs(workdir):
            raise InvalidRequest("workdir must be an absolute path")
        if not os.path.isdir(workdir):
            raise InvalidRequest(f"workdir {workdir!r} is not an existing directory")
    submit_dir = spec.get("submit_dir")
    if submit_dir is not None and (not isinstance(submit_dir, str) or not os.path.isabs(submit_dir)
                                   or len(submit_dir) > 65_536):
        raise InvalidRequest("submit_dir must be an absolute path (the folder the job was submitted from)")

    cpu = spec.get("cpu")
    if cpu is not None:
        if not _is_num(cpu) or cpu <= 0:
            raise InvalidRequest(f"cpu must be a positive number of cores, not {cpu!r}")
        if cpu > (MAX_NODE_CPU if limits.elastic else limits.cpu):
            where = f"any node has (at most {MAX_NODE_CPU})" if limits.elastic else f"this machine has ({limits.cpu:g})"
            raise InvalidRequest(f"cpu={cpu} is more than {where}")
        cpu = float(cpu)
    memory = spec.get("memory")
    if memory is not None:
        if not _is_int(memory) or memory <= 0:
            raise InvalidRequest(f"memory must be a positive whole number of bytes, not {memory!r}")
        if memory > (MAX_NODE_MEMORY if limits.elastic else limits.memory):
            where = (f"any node has (at most {MAX_NODE_MEMORY})" if limits.elastic
                     else f"this machine has ({limits.memory})")
            raise InvalidRequest(f"memory={memory} bytes is more than {where}")

    client_key = spec.get("client_key")
    if client_key is not None and (not isinstance(client_key, str) or not client_key
                                   or len(client_key) > MAX_CLIENT_KEY):
        raise InvalidRequest(f"client_key must be a non-empty string of at most {MAX_CLIENT_KEY} characters")
    if client_key is not None:
        _plain(client_key, "client_key")

    image = spec.get("image")
    if image is not None:
        if kind == "build":
            raise InvalidRequest("a build job has no image (it is a share lease for a kernel)")
        if (not isinstance(image, str) or len(image) > MAX_IMAGE or not IMAGE_RE.fullmatch(image)
                or not image.isprintable()):
            raise InvalidRequest(IMAGE_RULE)

    replicas = _replicas(spec.get("replicas", 1), kind, gpus, fraction, memory_req, limits)

    return JobSpec(
        project=project, kind=kind, name=name.strip(), replicas=replicas, gpus=n_gpus, gpu_fraction=fraction, gpu_memory=memory_req,
        gpu_model=model, priority=priority, command=list(command) if command else None, workdir=workdir,
        submit_dir=submit_dir if kind == "train" else None,
        env=_str_map(spec.get("env"), "env", ENV_KEY_RE), cpu=cpu, memory=memory,
        labels=_str_map(spec.get("labels"), "labels", plain=True), client_key=client_key, image=image,
    )


def _replicas(value: Any, kind: str, gpus: Any, fraction: Any, memory_req: Any, limits: PoolLimits) -> int:
    """Check ``replicas``: a whole number 1..MAX_REPLICAS; more than 1 only for training on whole GPUs.

    A gang's replicas each hold whole GPUs of one node (a fraction or a memory
    share of one GPU cannot be split across machines), and a build share is a
    kernel's lease, never several processes. When the pool's nodes are known,
    a gang that could not fit even on an empty pool is refused here, with
    the count it could have.
    """
    if value is None:
        return 1
    if not _is_int(value) or not 1 <= value <= MAX_REPLICAS:
        raise InvalidRequest(f"replicas must be a whole number from 1 to {MAX_REPLICAS}, not {str(value)[:20]}")
    if value == 1:
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


def _gpus_to_milli(value: Any, what: str, total_gpus: int | None, allow_none: bool = False) -> int | None:
    """GPUs on the wire to milli-GPU; more than the pool holds is refused unless the pool is elastic (None)."""
    if value is None and allow_none:
        return None
    if not _is_num(value) or value < 0:
        raise InvalidRequest(f"{what} must be a number of GPUs >= 0{' or null' if allow_none else ''}, not {value!r}")
    if value > MAX_QUOTA_GPUS:
        raise InvalidRequest(f"{what}={value:g} GPUs is more than any pool holds (at most {MAX_QUOTA_GPUS})")
    if total_gpus is not None and value > total_gpus:
        raise InvalidRequest(f"{what}={value:g} GPUs is more than the whole pool ({total_gpus} GPUs)")
    return int(round(value * MILLI))


def validate_project(name: Any, fields: Any, total_gpus: int | None) -> dict[str, Any]:
    """Check ``PUT /projects/{name}`` input; returns the changes in milli-GPU.

    ``total_gpus``: the pool's size, which no quota may exceed; None on an
    elastic pool (a cluster), where an admin sets guarantees for the nodes
    to come and the pool of the moment may be smaller (or empty).
    """
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise InvalidRequest(f"project names are 1-{MAX_PROJECT_NAME} letters, digits, '.', '_' or '-', "
                             "starting with a letter or digit")
    if not isinstance(fields, dict):
        raise InvalidRequest("project fields must be a JSON object")
    check_json_value(fields)
    unknown = sorted(set(fields) - PROJECT_FIELDS)
    if unknown:
        raise InvalidRequest(f"unknown project field(s): {', '.join(map(str, unknown))}")
    out: dict[str, Any] = {}
    if "build_quota" in fields:
        out["build_quota_milli"] = _gpus_to_milli(fields["build_quota"], "build_quota", total_gpus)
    if "train_guarantee" in fields:
        out["train_guarantee_milli"] = _gpus_to_milli(fields["train_guarantee"], "train_guarantee", total_gpus)
    if "train_limit" in fields:
        out["train_limit_milli"] = _gpus_to_milli(fields["train_limit"], "train_limit", total_gpus, allow_none=True)
    if "weight" in fields:
        w = fields["weight"]
        if not _is_num(w) or w <= 0 or w > 1e6:
            raise InvalidRequest(f"weight must be a positive number, not {w!r}")
        out["weight"] = float(w)
    if "members" in fields:
        out["members"] = validate_members(fields["members"], validate_user)
    return out


def validate_user(user: Any) -> str:
    """Check a user name for a new token; the name becomes the owner of jobs, so it is kept short and plain."""
    if not isinstance(user, str) or len(user) > MAX_USER_NAME or not USER_RE.fullmatch(user):
        raise InvalidRequest(f"user names are 1-{MAX_USER_NAME} letters, digits, '.', '_', '@' or '-', "
                             "starting with a letter or digit")
    return user
