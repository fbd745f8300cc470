"""The wire's shared rules: limits on fields and how a request body is read. Imports nothing of the service.

Why a module of its own: the scheduler's service and HTTP API, the OpenAPI
document and the Jupyter extension all read bodies and quote limits, and the
extension (a client of the scheduler) must not import the service to do so
(issue 23: dependencies point one way). The limits are defined once here:
enforced by :mod:`gpupool.service.validation`, published by
:mod:`gpupool.wire.schemas`, so the document cannot promise more or less than
the service accepts.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from gpupool.wire.errors import InvalidRequest

# Limits on wire fields. Stored data respects these values.
MAX_PROJECT_NAME = 64  # project names (also in paths and JobSpec.project)
MAX_USER_NAME = 64  # user names (token requests)
MAX_JOB_NAME = 200  # JobSpec.name
MAX_CLIENT_KEY = 200  # JobSpec.client_key
MAX_IMAGE = 512  # JobSpec.image (a container image reference)
MAX_MAP_KEY = 256  # a key of env or labels
MAX_MAP_VALUE = 65_536  # a value of env or labels
MAX_MAP_ENTRIES = 256  # entries in env or labels
MAX_PRIORITY = 1_000_000

# Idle GPUs by use (gpupool.service.idle; docs/policy.md, "Idle GPUs"): a project's rules per job kind.
IDLE_ACTIONS: dict[str, list[str]] = {"build": ["cull", "flag", "off"], "train": ["flag", "pause", "off"]}
"""What may happen to a job whose share is idle, per kind; "off": not watched."""
MAX_IDLE_WINDOW_S = 30 * 86400
IDLE_DEFAULTS: dict[str, dict[str, Any]] = {
    "build": {"below_percent": 5.0, "window_s": 1800.0, "action": "cull"},
    "train": {"below_percent": 5.0, "window_s": 3600.0, "action": "off"},
}
"""Kernels: culled after 30 min below 5 % of their share; training jobs: not watched until the admin says so."""
MAX_REPLICAS = 64  # JobSpec.replicas: processes (pods) of one multi-node gang
MAX_QUOTA_GPUS = 1_000_000  # a quota, guarantee or limit in GPUs: bounds what an elastic pool accepts
MAX_NODE_GPUS = 1024  # whole GPUs one replica may ask for when the pool's nodes are not known in advance
MAX_NODE_CPU = 65_536  # cores, likewise
MAX_NODE_MEMORY = 1 << 50  # bytes (1 PiB), likewise
NAME_RE = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9_.-]{{0,{MAX_PROJECT_NAME - 1}}}$")
USER_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.@-]*$"  # with at most MAX_USER_NAME characters; the schema's pattern too
USER_RE = re.compile(USER_PATTERN)
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
IMAGE_PATTERN = r"^[^\s\x00-\x1f\x7f-\x9f]+$"  # no whitespace or control characters; the schema's pattern too
IMAGE_RE = re.compile(IMAGE_PATTERN)
IMAGE_RULE = (f"image must be a container image reference such as registry.example/train:1: "
              f"1-{MAX_IMAGE} characters, no spaces or control characters")
# Arrays and objects inside one another in a request body. Our own bodies need three or
# four levels; deeper ones are mistakes or attacks, and Python code that walks them
# (schema checks, papermill, the store's JSON) would hit the recursion limit.
MAX_JSON_DEPTH = 64


def _reject_constant(name: str) -> Any:
    raise InvalidRequest(f"malformed JSON: {name} is not a JSON number")


def decode_json(raw: bytes | str) -> Any:
    """Parse a request body, refusing what Python's JSON accepts but the rest of the system cannot hold.

    ``json.loads`` takes NaN and Infinity, lone surrogates such as ``"\\ud800"``
    (which cannot be encoded as UTF-8, so SQLite, files and process arguments
    fail on them later) and nesting until the interpreter's recursion limit: each
    becomes an InvalidRequest here, where the body enters, instead of a crash
    further in. Used by the scheduler's API and the Jupyter extension's handlers.
    """
    try:
        value = json.loads(raw, parse_constant=_reject_constant)
    except UnicodeDecodeError:
        raise InvalidRequest("malformed JSON: the body is not UTF-8") from None
    except RecursionError:
        raise InvalidRequest(_too_deep()) from None
    except ValueError as e:
        raise InvalidRequest(f"malformed JSON: {e}") from None
    check_json_value(value)
    return value


def _too_deep() -> str:
    return f"malformed JSON: nested too deeply (at most {MAX_JSON_DEPTH} levels of arrays and objects)"


def _where(path: tuple[Any, ...]) -> str:
    """``env.PATH``-like: where in a body the problem is; a key with a newline or the like is quoted
    (``project.'\\n'``) so the message stays one readable line."""
    parts = []
    for p in path:
        text = str(p)[:40]
        parts.append(text if text.isprintable() else ascii(text))
    return ".".join(parts) or "the body"


def _unicode_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored (a lone surrogate and where), or None when it can."""
    if text.isascii():
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"is not valid Unicode (a lone surrogate {ascii(text[e.start])[1:-1]} at character {e.start})"
    return None


def check_json_value(value: Any, max_depth: int = MAX_JSON_DEPTH) -> None:
    """InvalidRequest unless every string (keys too) is valid Unicode and nesting stays within ``max_depth``.

    Iterative, so a deep value cannot exhaust the stack while being checked.
    """
    stack: list[tuple[Any, int, tuple[Any, ...]]] = [(value, 0, ())]
    while stack:
        item, depth, path = stack.pop()
        if isinstance(item, str):
            problem = _unicode_problem(item)
            if problem:
                raise InvalidRequest(f"{_where(path)}: the string {problem}")
        elif isinstance(item, float) and not math.isfinite(item):  # JSON has no NaN or Infinity
            raise InvalidRequest(f"{_where(path)}: must be a finite number, not {item}")
        elif isinstance(item, (dict, list)):
            if depth >= max_depth:
                raise InvalidRequest(_too_deep())
            if isinstance(item, dict):
                for key, child in item.items():
                    problem = _unicode_problem(key)
                    if problem:
                        raise InvalidRequest(f"{_where(path)}: a key {problem}")
                    stack.append((child, depth + 1, (*path, key)))
            else:
                stack.extend((child, depth + 1, (*path, i)) for i, child in enumerate(item))
