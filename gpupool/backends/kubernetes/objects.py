"""Reading Kubernetes objects as the API server sends them: plain JSON dicts, camelCase keys, RFC 3339 times.

The list+watch threads hand their consumers the decoded JSON itself, not the
official client's ``V1Pod``/``V1Node`` models: building a model per watch
event (decode, encode again, decode into classes) was a quarter of the
scheduler's CPU at 10,000 pods. These accessors are the one place that knows
the wire names, so the rest reads ``node_name(pod)`` rather than
``pod["spec"]["nodeName"]`` and never trips on a missing key (an absent field
is ``None``, ``""``, ``{}`` or ``[]``, as the model's default would be).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

Obj = dict[str, Any]
"""One Kubernetes object (Pod, Node, Service) as its JSON."""


def client_body(manifest: Obj) -> Any:
    """A manifest (its JSON) as the body of an official client call, which sends a dict as it is.

    The client's type hints ask for its model classes (``V1Service``, ...):
    building one costs a conversion per call and drops any field the
    client's models do not know (a newer API server's). Its serializer
    (``ApiClient.sanitize_for_serialization``) passes a dict through, so the
    manifest is sent as written; this says so once, for the type checker too.
    """
    return manifest


def meta(obj: Obj) -> Obj:
    return obj.get("metadata") or {}


def spec(obj: Obj) -> Obj:
    return obj.get("spec") or {}


def status(obj: Obj) -> Obj:
    return obj.get("status") or {}


def name(obj: Obj) -> str:
    return str(meta(obj).get("name") or "")


def namespace(obj: Obj) -> str:
    return str(meta(obj).get("namespace") or "")


def uid(obj: Obj) -> str:
    return str(meta(obj).get("uid") or "")


def resource_version(obj: Obj) -> str | None:
    return meta(obj).get("resourceVersion")


def labels(obj: Obj) -> dict[str, str]:
    return meta(obj).get("labels") or {}


def annotations_of(obj: Obj) -> dict[str, str]:
    """The object's annotations ({} when none); not named ``annotations``, which is the ``__future__`` import's name."""
    return meta(obj).get("annotations") or {}


def parse_time(text: str | None) -> dt.datetime | None:
    """An RFC 3339 time (``2026-11-25T10:00:00Z``, maybe with fractions or an offset) as an aware datetime."""
    if not text:
        return None
    try:
        t = dt.datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo is not None else t.replace(tzinfo=dt.timezone.utc)


def creation_time(obj: Obj) -> dt.datetime | None:
    return parse_time(meta(obj).get("creationTimestamp"))


def deletion_time(obj: Obj) -> dt.datetime | None:
    """When the object's deletion was asked for plus its grace (None: no deletion asked for)."""
    return parse_time(meta(obj).get("deletionTimestamp"))


def being_deleted(obj: Obj) -> bool:
    return bool(meta(obj).get("deletionTimestamp"))


def deletion_grace_s(obj: Obj) -> int:
    return int(meta(obj).get("deletionGracePeriodSeconds") or 0)


# ---------------------------------------------------------------- pods
def node_name(pod: Obj) -> str:
    """The node the pod is bound to ("" while Pending unbound)."""
    return str(spec(pod).get("nodeName") or "")


def phase(pod: Obj) -> str | None:
    return status(pod).get("phase")


def containers(pod: Obj) -> list[Obj]:
    return spec(pod).get("containers") or []


def init_containers(pod: Obj) -> list[Obj]:
    return spec(pod).get("initContainers") or []


def container_statuses(pod: Obj) -> list[Obj]:
    return status(pod).get("containerStatuses") or []


def terminated(container_status: Obj) -> Obj | None:
    """The container's ``state.terminated`` (``exitCode``, ``finishedAt``), or None while it has not ended."""
    return (container_status.get("state") or {}).get("terminated")


def waiting(container_status: Obj) -> Obj | None:
    """The container's ``state.waiting`` (``reason``, ``message``), or None when it is not waiting."""
    return (container_status.get("state") or {}).get("waiting")


def exit_code(term: Obj) -> int | None:
    code = term.get("exitCode")
    return int(code) if code is not None else None


# ---------------------------------------------------------------- nodes
def allocatable(node: Obj) -> dict[str, str]:
    return status(node).get("allocatable") or {}


def conditions(node: Obj) -> list[Obj]:
    return status(node).get("conditions") or []


def unschedulable(node: Obj) -> bool:
    return bool(spec(node).get("unschedulable"))


def taints(node: Obj) -> list[Obj]:
    return spec(node).get("taints") or []
