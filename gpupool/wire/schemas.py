"""JSON shapes of the HTTP API, written once and used twice.

The same schema dicts describe the API in the OpenAPI document (OpenAPI 3.0
dialect, with ``nullable``) and validate request bodies before they reach the
core (converted to plain JSON Schema for :mod:`jsonschema`). Keeping one source
means the document cannot drift from what the service actually accepts, and a
fuzzer driven by the document exercises the real limits.

The replies' shapes, which only the document uses, are in
:mod:`gpupool.wire.replies`; ``COMPONENTS`` here names both.

The limits ("absurd sizes") are deliberately generous: they exist so that a
typo such as ``gpus: 1e12`` gets a clear 400 instead of reaching the store.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import jsonschema

from gpupool.wire.errors import InvalidRequest
from gpupool.wire.limits import (
    ENV_KEY_RE,
    IDLE_ACTIONS,
    IMAGE_PATTERN,
    IMAGE_RULE,
    MAX_CLIENT_KEY,
    MAX_IDLE_WINDOW_S,
    MAX_IMAGE,
    MAX_JOB_NAME,
    MAX_MAP_ENTRIES,
    MAX_MAP_KEY,
    MAX_MAP_VALUE,
    MAX_PRIORITY,
    MAX_PROJECT_NAME,
    MAX_QUOTA_GPUS,
    MAX_REPLICAS,
    MAX_USER_NAME,
    USER_PATTERN,
)
from gpupool.wire.placement import (
    AFFINITY_RULE,
    NODE_AFFINITY,
    NODE_SELECTOR,
    SELECTOR_RULE,
    TOLERATIONS,
    TOLERATIONS_RULE,
)
from gpupool.wire.plain_text import PLAIN_TEXT_PATTERN, escape, unsafe_problem
from gpupool.wire.replies import (
    ERROR,
    EVENT,
    EVENTS,
    HISTORY,
    JOB,
    JOB_KINDS,
    LOGS,
    POOL,
    PROJECT,
    REPORT,
    REPORT_SERIES,
    STATUS,
    TOKEN,
    WHOAMI,
)

# Largest values the API accepts. Beyond these a request is a mistake, not a plan.
MAX_GPUS = 4096
MAX_GPU_MEMORY = 2**50  # 1 PiB of GPU memory on one GPU
MAX_HOST_MEMORY = 2**60
MAX_CPU = 100_000
# The length limits of names, keys and map entries are the core's own (gpupool.service.validation),
# imported above, so that the schema and the enforcement cannot differ. The ones below exist only here.
MAX_MODEL_NAME = 256  # gpu_model (the core also checks the model is in the pool)
MAX_STRING = 65_536  # a command argument or a workdir
MAX_ITEMS = 4096
# Query parameters: the handlers enforce these and the OpenAPI document states them.
MAX_LIST = 10_000  # jobs in one GET /jobs
MAX_LOG_CHUNK = 16 * 2**20  # bytes in one GET /jobs/{id}/logs
MAX_SEQ = 2**62  # event sequence numbers are SQLite integers (int64)
MAX_WAIT_S = 60.0  # longest long-poll of GET /events

# The sentence a person reads when a value breaks a field's rules; an OpenAPI extension keyword
# (kept in the document, where it states the rule), dropped from the JSON Schema that validates.
RULE = "x-rule"

NO_NUL = "^[^\\x00]*$"  # process arguments and paths cannot hold NUL bytes
ENV_NAME = ENV_KEY_RE.pattern  # the core's own rule (the limits too), so the two cannot drift apart


def _str(max_length: int, *, min_length: int = 0, nullable: bool = False, plain: bool = False) -> dict[str, Any]:
    """A string field; ``plain``: text other users read, so no control characters (the core's rule too)."""
    schema: dict[str, Any] = {"type": "string", "maxLength": max_length,
                              "pattern": PLAIN_TEXT_PATTERN if plain else NO_NUL}
    if min_length:
        schema["minLength"] = min_length
    if nullable:
        schema["nullable"] = True
    return schema


def _string_map(key_pattern: str | None = None, plain: bool = False) -> dict[str, Any]:
    """env and labels: string to string, with the core's limits on keys, values and entries.

    ``plain`` (labels, which every user reads): keys and values without control characters.
    """
    names: dict[str, Any] = {"maxLength": MAX_MAP_KEY}
    if key_pattern or plain:
        names["pattern"] = key_pattern or PLAIN_TEXT_PATTERN
    return {
        "type": "object",
        "maxProperties": MAX_MAP_ENTRIES,
        "propertyNames": names,
        "additionalProperties": _str(MAX_MAP_VALUE, plain=plain),
    }


KERNEL_POD_LABEL = "gpupool.kernel_pod"
"""The label the service puts on a share submitted with a kernel_pod ("true"): it says so after a restart too."""
MAX_PORT = 65_535
_PORT = {"type": "integer", "minimum": 1, "maximum": MAX_PORT}
KERNEL_POD: dict[str, Any] = {
    "type": "object", "nullable": True, "additionalProperties": False,
    "required": ["argv", "connection"],
    "description": "Build jobs, where GET /status says kernel_pods: run the share's kernel in a pod the scheduler "
                   "makes and binds (docs/kubernetes.md). connection (with its HMAC key) and secret_env are kept "
                   "in a Secret owned by the pod, never stored or shown.",
    "properties": {
        "argv": {"type": "array", "minItems": 1, "maxItems": MAX_ITEMS, "items": _str(MAX_STRING),
                 "description": "The kernel's command; {connection_file} names the mounted connection file."},
        "env": _string_map(ENV_NAME),
        "secret_env": _string_map(ENV_NAME),
        "connection": {"type": "object", "additionalProperties": False,
                       "required": ["key", "shell_port", "iopub_port", "stdin_port", "control_port", "hb_port"],
                       "properties": {"key": _str(1024), "signature_scheme": _str(64), "transport": {
                           "type": "string", "enum": ["tcp"]}, "kernel_name": _str(MAX_JOB_NAME),
                           **{f"{c}_port": _PORT for c in ("shell", "iopub", "stdin", "control", "hb")}}},
        "image": {"type": "string", "minLength": 1, "maxLength": MAX_IMAGE, "pattern": IMAGE_PATTERN,
                  "nullable": True},
        "uid": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1, "nullable": True},
        "gid": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1, "nullable": True},
        "workdir": _str(MAX_STRING, nullable=True),
    },
    RULE: "kernel_pod must be {argv: [strings], connection: {key, shell_port, iopub_port, stdin_port, control_port, "
          "hb_port}, env, secret_env, image, uid, gid, workdir}",
}

JOB_SPEC: dict[str, Any] = {
    "type": "object",
    "description": "What to run. At most one of gpus, gpu_fraction, gpu_memory; none means CPU only.",
    "required": ["project"],
    "additionalProperties": False,
    "properties": {
        "project": {**_str(MAX_PROJECT_NAME, min_length=1), RULE: "project is required (a project name)"},
        "kind": {"type": "string", "enum": JOB_KINDS, "default": "train",
                 RULE: "kind must be 'train' or 'build'"},
        "name": {**_str(MAX_JOB_NAME, nullable=True, plain=True),
                 RULE: f"name must be a non-empty string of at most {MAX_JOB_NAME} characters"},
        "gpus": {"type": "integer", "minimum": 1, "maximum": MAX_GPUS, "nullable": True,
                 "description": "Whole GPUs.", RULE: f"gpus must be a whole number from 1 to {MAX_GPUS} (at least 1)"},
        "gpu_fraction": {"type": "number", "exclusiveMinimum": True, "minimum": 0,
                         "exclusiveMaximum": True, "maximum": 1, "nullable": True,
                         "description": "A share of one GPU, 0 < f < 1.",
                         RULE: "gpu_fraction must be a number between 0 and 1 (exclusive); use gpus for whole GPUs"},
        "gpu_memory": {"type": "integer", "minimum": 1, "maximum": MAX_GPU_MEMORY, "nullable": True,
                       "description": "Bytes of GPU memory on one GPU.",
                       RULE: "gpu_memory must be a positive whole number of bytes"},
        "gpu_model": {**_str(MAX_MODEL_NAME, nullable=True, plain=True),
                      RULE: f"gpu_model must be a string of 1-{MAX_MODEL_NAME} characters"},
        "priority": {"type": "integer", "minimum": -MAX_PRIORITY, "maximum": MAX_PRIORITY,
                     RULE: f"priority must be a whole number between -{MAX_PRIORITY} and {MAX_PRIORITY}"},
        "command": {"type": "array", "minItems": 1, "maxItems": MAX_ITEMS, "nullable": True,
                    "items": _str(MAX_STRING), RULE: f"command must be a non-empty list of strings (at most "
                    f"{MAX_ITEMS} of {MAX_STRING} characters)"},
        "workdir": {**_str(MAX_STRING, nullable=True), RULE: "workdir must be an absolute path"},
        "submit_dir": {**_str(MAX_STRING, nullable=True), "description": "Train jobs: the folder the job was "
                       "submitted from (the CLI sends it when it runs on the scheduler's machine). A local "
                       "scheduler runs a job that names no workdir there, if the job's account may enter and read "
                       "it (else a 400 naming workdir); other backends ignore it.",
                       RULE: "submit_dir must be an absolute path (the folder the job was submitted from)"},
        "env": {**_string_map(ENV_NAME), RULE: "env must map variable names (letters, digits and _, not "
                f"starting with a digit; at most {MAX_MAP_ENTRIES}) to strings"},
        "cpu": {"type": "number", "exclusiveMinimum": True, "minimum": 0, "maximum": MAX_CPU, "nullable": True,
                RULE: f"cpu must be a positive number of cores (at most {MAX_CPU})"},
        "memory": {"type": "integer", "minimum": 1, "maximum": MAX_HOST_MEMORY, "nullable": True,
                   RULE: "memory must be a positive whole number of bytes"},
        "labels": {**_string_map(plain=True),
                   RULE: f"labels must map strings to strings (at most {MAX_MAP_ENTRIES})"},
        "client_key": {**_str(MAX_CLIENT_KEY, min_length=1, nullable=True, plain=True),
                       RULE: f"client_key must be a non-empty string of at most {MAX_CLIENT_KEY} characters"},
        "image": {"type": "string", "minLength": 1, "maxLength": MAX_IMAGE, "pattern": IMAGE_PATTERN,
                  "nullable": True, "description": "The container image of the job's pods (kubernetes backend "
                  "only; a local scheduler refuses it). Default: the service's configured image.",
                  RULE: IMAGE_RULE},
        "replicas": {"type": "integer", "minimum": 1, "maximum": MAX_REPLICAS, "nullable": True, "default": 1,
                     "description": "Train jobs: processes (pods) that start together or not at all (a multi-node "
                     "gang), each on `gpus` whole GPUs of one node; more than 1 needs gpus >= 1 (no gpu_fraction "
                     "or gpu_memory).", RULE: f"replicas must be a whole number from 1 to {MAX_REPLICAS}"},
        "node_selector": {**NODE_SELECTOR, RULE: SELECTOR_RULE},
        "node_affinity": {**NODE_AFFINITY, RULE: AFFINITY_RULE},
        "tolerations": {**TOLERATIONS, RULE: TOLERATIONS_RULE},
        "kernel_pod": KERNEL_POD,
    },
}

def _idle_rule(kind: str) -> dict[str, Any]:
    """One kind's idle rule as PUT /projects takes it (every field optional: left out keeps its value)."""
    return {"type": "object", "additionalProperties": False, "properties": {
        "below_percent": {"type": "number", "exclusiveMinimum": True, "minimum": 0, "maximum": 100,
                          "description": "Idle below this percent of the job's share (its processes' use)."},
        "window_s": {"type": "number", "minimum": 1, "maximum": MAX_IDLE_WINDOW_S,
                     "description": "For this many seconds, every sample measured and below."},
        "action": {"type": "string", "enum": IDLE_ACTIONS[kind]}}}


PROJECT_FIELDS: dict[str, Any] = {
    "type": "object",
    "description": "Quotas in GPUs. Fields left out keep their value (or the default for a new project).",
    "additionalProperties": False,
    "properties": {
        "build_quota": {"type": "number", "minimum": 0, "maximum": MAX_QUOTA_GPUS,
                        RULE: f"build_quota must be a number of GPUs from 0 to {MAX_QUOTA_GPUS}"},
        "train_guarantee": {"type": "number", "minimum": 0, "maximum": MAX_QUOTA_GPUS,
                            RULE: f"train_guarantee must be a number of GPUs from 0 to {MAX_QUOTA_GPUS}"},
        "train_limit": {"type": "number", "minimum": 0, "maximum": MAX_QUOTA_GPUS, "nullable": True,
                        "description": "Most training GPUs the project may use; null for no limit.",
                        RULE: f"train_limit must be a number of GPUs from 0 to {MAX_QUOTA_GPUS}, or null"},
        "weight": {"type": "number", "exclusiveMinimum": True, "minimum": 0, "maximum": MAX_QUOTA_GPUS,
                   RULE: f"weight must be a positive number (at most {MAX_QUOTA_GPUS})"},
        "members": {"type": "array", "nullable": True, "maxItems": 1000,
                    "items": {"type": "string", "minLength": 1, "maxLength": 65},
                    RULE: "members must be a list (at most 1000) of user names and @groups, or null for an "
                    "open project",
                    "description": "Who may submit into the project: user names and '@group' entries; "
                                   "null (the default) leaves the project open to every user."},
        "idle": {"type": "object", "nullable": True, "additionalProperties": False,
                 "properties": {kind: _idle_rule(kind) for kind in IDLE_ACTIONS},
                 RULE: "idle is {build: {...}, train: {...}}, each with below_percent (above 0, at most 100), "
                 f"window_s (1 to {MAX_IDLE_WINDOW_S} seconds) and action (build: cull, flag or off; train: "
                 "flag, pause or off), fields left out keeping their value; or null for the defaults",
                 "description": "When a running job's GPU share counts as idle, per kind (docs/policy.md, \"Idle "
                                "GPUs\"): below below_percent of its share for window_s seconds, measured (unmeasured "
                                "time is never idle). action: build kernels are culled by their Jupyter server "
                                "(cull) or only flagged (flag); training jobs are flagged (flag) or paused with the "
                                "checkpoint signal (pause). null: back to the defaults."},
    },
}

TOKEN_REQUEST: dict[str, Any] = {
    "type": "object",
    "required": ["user"],
    "additionalProperties": False,
    "properties": {"user": {"type": "string", "minLength": 1, "maxLength": MAX_USER_NAME,
                            "pattern": USER_PATTERN}},
}

MAX_NODE_GPUS = 64  # GPUs in one node agent's report
MAX_NODE_PODS = 1024  # pods on one GPU in one report
POD_UID_PATTERN = "^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$|^[0-9a-f]{32}$"
_PERCENT = {"type": "number", "minimum": 0, "maximum": 100}
NODE_USE: dict[str, Any] = {
    "type": "object", "required": ["gpus"], "additionalProperties": False,
    "description": "What a node agent measured on its node's GPUs over its last interval, per pod",
    "properties": {
        "interval_s": {"type": "number", "minimum": 0.1, "maximum": 3600,
                       "description": "Seconds between the agent's reports: the report is stale after 3 of them"},
        "gpus": {"type": "array", "maxItems": MAX_NODE_GPUS, "items": {
            "type": "object", "required": ["id", "measured", "pods"], "additionalProperties": False,
            "properties": {
                "id": _str(256, min_length=1, plain=True),
                "index": {"type": "integer", "minimum": 0, "maximum": MAX_GPUS},
                "utilization": {**_PERCENT, "nullable": True, "description": "The whole GPU's utilisation"},
                "memory_used": {"type": "integer", "minimum": 0, "maximum": MAX_GPU_MEMORY, "nullable": True},
                "measured": {"type": "boolean", "description": "Whether per-process use could be read on this "
                                                              "GPU (false: its pods are unmeasured, not idle)"},
                "pods": {"type": "array", "maxItems": MAX_NODE_PODS, "items": {
                    "type": "object", "required": ["uid", "sm", "memory"], "additionalProperties": False,
                    "properties": {
                        "uid": {"type": "string", "pattern": POD_UID_PATTERN, "maxLength": 36},
                        "sm": {**_PERCENT, "description": "Percent of the GPU's SMs its processes kept busy"},
                        "memory": {"type": "integer", "minimum": 0, "maximum": MAX_GPU_MEMORY}}}}}}}},
}

COMPONENTS: dict[str, dict[str, Any]] = {
    "JobSpec": JOB_SPEC, "ProjectFields": PROJECT_FIELDS, "TokenRequest": TOKEN_REQUEST,
    "Error": ERROR, "Job": JOB, "Project": PROJECT, "Pool": POOL, "Status": STATUS,
    "Event": EVENT, "Events": EVENTS, "Logs": LOGS, "WhoAmI": WHOAMI, "Token": TOKEN,
    "History": HISTORY, "Report": REPORT, "ReportSeries": REPORT_SERIES, "NodeUse": NODE_USE,
}


def to_json_schema(schema: Any) -> Any:
    """Turn an OpenAPI 3.0 schema into plain JSON Schema (draft 2020-12).

    Only the two differences we use matter: ``nullable: true`` becomes a
    ``null`` alternative, and the boolean ``exclusiveMinimum``/``exclusiveMaximum``
    of OpenAPI 3.0 become the numeric form.
    """
    if isinstance(schema, list):
        return [to_json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: to_json_schema(v) for k, v in schema.items()
           if k not in ("nullable", "description", "default") and not k.startswith("x-")}
    for bound, limit in (("exclusiveMinimum", "minimum"), ("exclusiveMaximum", "maximum")):
        if out.get(bound) is True:
            out[bound] = out.pop(limit)
        elif out.get(bound) is False:
            del out[bound]
    if schema.get("nullable"):
        kind = out.get("type")
        if isinstance(kind, str):
            out["type"] = [kind, "null"]
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
    return out


def _pattern(validator: Any, pattern: str, instance: Any, schema: Any) -> Any:
    """``pattern`` as JSON Schema means it (ECMA-262): a final ``$`` is the end of the string.

    Python's ``$`` also matches before a final newline, so with :func:`re.search`
    alone ``"alice\\n"`` would pass ``^[a-z]+$``: a name that looks like
    another, or a line break in text others read. Our patterns are anchored,
    so a match must reach the end.
    """
    if not validator.is_type(instance, "string"):
        return
    match = re.search(pattern, instance)
    if match is None or (pattern.endswith("$") and match.end() != len(instance)):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


_Validator = jsonschema.validators.extend(jsonschema.Draft202012Validator, {"pattern": _pattern})
_VALIDATORS: dict[str, jsonschema.protocols.Validator] = {}  # built once per component, then only read


def _validator(name: str) -> jsonschema.protocols.Validator:
    if name not in _VALIDATORS:
        _VALIDATORS[name] = _Validator(copy.deepcopy(to_json_schema(COMPONENTS[name])))
    return _VALIDATORS[name]


def _describe(component: str, error: jsonschema.ValidationError) -> str:
    """One sentence naming the field and the problem, for a human: the field's own rule where it has one."""
    where = ".".join(str(p) for p in error.absolute_path)
    validator = error.validator
    if validator == "additionalProperties":
        return error.message.replace("Additional properties are not allowed", "unknown field")
    if validator == "required":
        return error.message.replace("is a required property", "is required")
    if validator == "pattern" and error.schema.get("pattern") == NO_NUL:
        return f"{where}: must not contain NUL characters"
    if validator == "pattern" and error.schema.get("pattern") == PLAIN_TEXT_PATTERN:
        text = str(error.instance)
        if "propertyNames" in error.relative_schema_path or "propertyNames" in error.schema_path:
            return f"{where}: the key {text[:40]!r} {unsafe_problem(text)}"
        if len(error.absolute_path) > 1:  # a value in labels
            return f"{escape(where)}: the value {unsafe_problem(text)}"
        return f"{where} {unsafe_problem(text)}"
    field = error.absolute_path[0] if error.absolute_path else None
    rule = COMPONENTS[component].get("properties", {}).get(field, {}).get(RULE) if isinstance(field, str) else None
    if rule:
        inside = f" ({escape(where)})" if len(error.absolute_path) > 1 else ""
        return f"{rule}, not {_shown(error.instance)}{inside}"
    if validator == "propertyNames":
        return f"{where or 'object'}: bad key: {error.message}"
    text = error.message
    if len(text) > 200:
        text = text[:200] + "..."
    return f"{where}: {text}" if where else text


def _shown(value: Any) -> str:
    """A value as the message quotes it: JSON-like, cut short (a bad value may be huge)."""
    text = str(value)
    return text if len(text) <= 40 else text[:40] + "..."


def validate(name: str, body: Any, what: str) -> dict[str, Any]:
    """Check ``body`` against component ``name``; raise InvalidRequest naming the first problem."""
    errors = sorted(_validator(name).iter_errors(body), key=lambda e: (len(e.absolute_path), str(e.path)))
    if errors:
        best = jsonschema.exceptions.best_match(errors)
        if not best.absolute_path and best.validator == "type":
            raise InvalidRequest(f"the {what} must be a JSON object")
        raise InvalidRequest(f"invalid {what}: {_describe(name, best)}")
    return body
