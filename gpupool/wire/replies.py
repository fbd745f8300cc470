"""JSON shapes of what the HTTP API answers: the OpenAPI document's reply schemas.

Request bodies (:mod:`gpupool.wire.schemas`) are checked against their
schemas before they reach the core; replies are not checked at run time, they
are the contract a client reads (the OpenAPI document, and the tests that hold
real replies to it). So they live apart from the request shapes and their
validation: a change here changes only what the document promises.

Replies are described loosely (extra fields allowed) so that the core may add
fields without breaking clients; the fields named here are the contract.
"""

from __future__ import annotations

from typing import Any

from gpupool.wire.states import ALL_STATES, JobKind

JOB_STATES = [state.value for state in ALL_STATES]
JOB_KINDS = [kind.value for kind in JobKind]

ERROR: dict[str, Any] = {
    "type": "object",
    "required": ["error", "status"],
    "properties": {"error": {"type": "string"}, "status": {"type": "integer"},
                   "type": {"type": "string", "description": "The gpupool.wire.errors class name."},
                   "held_milli": {"type": "integer", "description": "QuotaExceeded: milli-GPU of the build quota "
                                  "the project's live build work holds (0: the request alone is too big)."}},
}

_GPU_SHARE = {"type": "object", "properties": {
    "id": {"type": "string"}, "index": {"type": "integer"}, "model": {"type": "string"},
    "milli": {"type": "integer"}, "memory_limit": {"type": "integer", "nullable": True}}}

JOB: dict[str, Any] = {
    "type": "object",
    "required": ["id", "project", "user", "kind", "state"],
    "properties": {
        "id": {"type": "string"}, "name": {"type": "string"}, "project": {"type": "string"},
        "user": {"type": "string"}, "kind": {"type": "string", "enum": JOB_KINDS},
        "state": {"type": "string", "enum": JOB_STATES},
        "request": {"type": "object", "properties": {
            "replicas": {"type": "integer", "description": "The spec's replicas (1 for a one-process job)."},
            "node_selector": {"type": "object", "description": "Only when set: the spec's (with its pool's and "
                              "project's settings added; a kubectl pod's nodeSelector)."},
            "node_affinity": {"type": "object", "description": "Only when set, as node_selector."},
            "tolerations": {"type": "array", "items": {"type": "object"},
                            "description": "Only when set, as node_selector."}}},
        "priority": {"type": "integer"},
        "submitted_at": {"type": "number"},
        "started_at": {"type": "number", "nullable": True},
        "finished_at": {"type": "number", "nullable": True},
        "attempts": {"type": "integer"}, "preemptible": {"type": "boolean"},
        "reason": {"type": "string", "nullable": True},
        "assignment": {"type": "object", "nullable": True, "properties": {
            "node": {"type": "string", "description": "Where it runs (a gang: rank 0's node)."},
            "gpus": {"type": "array", "items": _GPU_SHARE, "description": "Its GPUs (a gang: every replica's, "
                     "in rank order)."},
            "replicas": {"type": "array", "description": "A gang only: each replica's node and GPUs.",
                         "items": {"type": "object", "properties": {
                             "rank": {"type": "integer"}, "node": {"type": "string"},
                             "gpus": {"type": "array", "items": _GPU_SHARE}}}}}},
        "ran_on": {"type": "object", "nullable": True, "description": "Where the job's last attempt ran, in the "
                   "shape of assignment, while it is not running (finished, paused, queued again); null while it "
                   "runs (see assignment) and for a job that never ran."},
        "exit_code": {"type": "integer", "nullable": True},
        "workdir": {"type": "string", "nullable": True},
        "command": {"type": "array", "nullable": True, "items": {"type": "string"}},
        "labels": {"type": "object"},
        "kernel_pod": {"type": "object", "nullable": True, "description": "A share with a kernel pod (owner and "
                       "admin only): the pod's name, ip, phase, ready, restarts, the kubelet's reason its container is "
                       "not running (CrashLoopBackOff, ImagePullBackOff, ...; '' when it runs), its container's last exit "
                       "code (null if it never exited), and why it is not "
                       "running yet in words (with the exit code and last lines of a container that exited).",
                       "properties": {"name": {"type": "string"}, "ip": {"type": "string"},
                                      "phase": {"type": "string"}, "ready": {"type": "boolean"},
                                      "restarts": {"type": "integer"}, "reason": {"type": "string"},
                                      "last_exit_code": {"type": "integer", "nullable": True},
                                      "message": {"type": "string"}}},
        "lease_expires_at": {"type": "number", "nullable": True},
        "image": {"type": "string", "description": "The spec's container image; absent when it named none."},
        "env": {"type": "object", "nullable": True},
        "idle_since": {"type": "string", "nullable": True, "description": "A running job whose share its "
                       "project counts idle (below its idle rule's percent for the whole window, measured): since "
                       "when, ISO 8601 UTC; null otherwise (busy, unmeasured, not running, or the rule is off)."},
        "idle_action": {"type": "string", "nullable": True, "enum": ["cull", "flag", "pause"],
                        "description": "With idle_since: what its project's rule does (cull: its Jupyter server "
                                       "shuts the kernel down after a notice; pause: paused with the checkpoint "
                                       "signal; flag: shown only)."},
        "recent_use": {
            "type": "object", "nullable": True,
            "description": "A running job's use over the last minute (window_s; the 10 s buckets begun in it): "
                           "null when it is not running or was not sampled in the window.",
            "properties": {
                "window_s": {"type": "number"},
                "busy": {"type": "number", "nullable": True, "minimum": 0, "maximum": 1,
                         "description": "The part of its share its processes kept busy, where measured; null when "
                                        "nothing was measured (unmeasured is not idle)."},
                "measured": {"type": "number", "minimum": 0, "maximum": 1,
                             "description": "The part of what it holds whose use could be measured."},
                "peak_memory": {"type": "integer", "minimum": 0,
                                "description": "The most GPU memory its processes held at once (bytes)."}}},
    },
}

PROJECT: dict[str, Any] = {
    "type": "object",
    "required": ["name"],
    "properties": {
        "name": {"type": "string"},
        "build_quota": {"type": "number"}, "train_guarantee": {"type": "number"},
        "train_limit": {"type": "number", "nullable": True}, "weight": {"type": "number"},
        "usage": {"type": "object"},
        "pending": {"type": "integer", "description": "Its queued jobs (paused ones are counted in paused)."},
        "paused": {"type": "integer", "description": "Its paused jobs."},
        "members": {"type": "array", "nullable": True, "items": {"type": "string"}},
        "member": {"type": "boolean", "description": "Whether the caller may submit into this project."},
        "idle": {"type": "object", "description": "The idle rules in force, per kind (build, train): "
                 "below_percent, window_s, action (defaults filled in)."},
        "recent_gpu_hours": {"type": "object", "description": "GPU-hours held by kind (build, train), decayed "
                             "by the service's usage half-life: a half-life ago counts half."},
        "fair_share": {
            "type": "object",
            "description": "The project's long-run share of the train pool when every project wants it all (gpus), "
                           "the GPUs it held for training on average lately (recent_gpus), and how much of the "
                           "share it uses by the policy's measure (percent).",
            "properties": {"gpus": {"type": "number"}, "recent_gpus": {"type": "number"},
                           "percent": {"type": "integer", "nullable": True, "description": "The training GPUs the "
                                       "project runs now plus recent_gpus, as a percentage of gpus: the measure by "
                                       "which idle GPUs beyond guarantees are handed out, lowest first. Null when "
                                       "no history is kept or the share is 0."}},
        },
    },
}

POOL: dict[str, Any] = {
    "type": "object",
    "required": ["nodes"],
    "properties": {"simulated": {"type": "boolean"}, "nodes": {"type": "array", "items": {"type": "object"}}},
}

STATUS: dict[str, Any] = {
    "type": "object",
    "properties": {"simulated": {"type": "boolean"}, "pool": POOL,
                   "projects": {"type": "array", "items": PROJECT}, "queue": {"type": "object"},
                   "usage_half_life_s": {"type": "number", "description": "The half-life of recent_gpu_hours"},
                   "idle_running": {"type": "integer", "description": "Running jobs whose share their project's "
                                    "idle rule counts idle now (Job.idle_since set)."},
                   "kernel_pods": {"type": "boolean", "description": "Whether build shares may ask for a "
                                   "kernel_pod (the kubernetes backend)"}},
}

EVENT: dict[str, Any] = {
    "type": "object",
    "required": ["seq", "type"],
    "properties": {"seq": {"type": "integer"}, "t": {"type": "number"}, "type": {"type": "string"},
                   "job_id": {"type": "string"}, "state": {"type": "string"}},
}

EVENTS: dict[str, Any] = {
    "type": "object",
    "required": ["events", "last"],
    "properties": {"events": {"type": "array", "items": EVENT}, "last": {"type": "integer"}},
}

LOGS: dict[str, Any] = {
    "type": "object",
    "required": ["data", "offset", "eof"],
    "properties": {"data": {"type": "string"}, "offset": {"type": "integer"}, "eof": {"type": "boolean"}},
}

WHOAMI: dict[str, Any] = {
    "type": "object", "required": ["user", "admin"],
    "properties": {"user": {"type": "string"}, "admin": {"type": "boolean"},
                   "project": {"type": "string", "description": "default project, where known (Hub users)"}},
}

TOKEN: dict[str, Any] = {
    "type": "object", "required": ["user", "token"],
    "properties": {"user": {"type": "string"}, "token": {"type": "string"}},
}

HISTORY: dict[str, Any] = {
    "type": "object", "required": ["samples"],
    "properties": {"samples": {"type": "array", "items": {"type": "object"}}},
}

_GPU_HOURS = {"type": "number", "minimum": 0}
REPORT_ROW: dict[str, Any] = {
    "type": "object", "required": ["kind", "allocated_gpu_hours", "used_gpu_hours", "idle_gpu_hours",
                                   "unmeasured_gpu_hours", "efficiency", "peak_memory"],
    "properties": {
        "project": {"type": "string"}, "user": {"type": "string"}, "job_id": {"type": "string"},
        "name": {"type": "string"}, "kind": {"type": "string", "enum": ["build", "train"]},
        "allocated_gpu_hours": {**_GPU_HOURS, "description": "GPU-hours held"},
        "used_gpu_hours": {**_GPU_HOURS, "description": "GPU-hours of SM use by the holder's processes, each "
                                                      "GPU's at most its share"},
        "idle_gpu_hours": {**_GPU_HOURS, "description": "measured GPU-hours held but not used"},
        "unmeasured_gpu_hours": {**_GPU_HOURS, "description": "GPU-hours held where use could not be measured"},
        "efficiency": {"type": "number", "nullable": True, "minimum": 0, "maximum": 1,
                       "description": "used over measured; null when nothing was measured"},
        "peak_memory": {"type": "integer", "minimum": 0, "description": "most GPU memory held at once (bytes)"},
    },
}
REPORT: dict[str, Any] = {
    "type": "object", "required": ["since", "until", "by", "rows"],
    "properties": {"since": {"type": "number"}, "until": {"type": "number"},
                   "by": {"type": "string", "enum": ["project", "user", "job"]},
                   "rows": {"type": "array", "items": REPORT_ROW}},
}

_GPUS_OVER_TIME = {"type": "array", "items": {"type": "number", "minimum": 0}}
REPORT_SERIES: dict[str, Any] = {
    "type": "object", "required": ["since", "until", "step", "by", "series"],
    "properties": {
        "since": {"type": "number", "description": "The first bucket's start"},
        "until": {"type": "number", "description": "Where the series ends: the last 10 s boundary the "
                                                  "samples passed (the last bucket may be shorter)"},
        "step": {"type": "integer", "description": "Seconds per bucket"},
        "by": {"type": "string", "enum": ["project", "user", "job"]},
        "series": {"type": "array", "items": {
            "type": "object", "required": ["kind", "t", "allocated", "measured", "used"],
            "properties": {
                "project": {"type": "string"}, "user": {"type": "string"}, "job_id": {"type": "string"},
                "kind": {"type": "string", "enum": ["build", "train"]},
                "t": {"type": "array", "items": {"type": "integer"}, "description": "Each bucket's start"},
                "allocated": {**_GPUS_OVER_TIME, "description": "Mean GPUs held in each bucket"},
                "measured": {**_GPUS_OVER_TIME, "description": "Of those, the GPUs whose use was measured "
                                                               "(the rest is unknown, not idle)"},
                "used": {**_GPUS_OVER_TIME, "description": "Mean GPUs used (idle: measured - used)"}}}}},
}
