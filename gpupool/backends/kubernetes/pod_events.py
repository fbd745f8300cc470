"""Events on pods (what ``kubectl describe pod`` shows): why gpupool did not queue, bound or evicted a pod.

A kubectl user does not read gpupool's own event log; the pod's events are
where they look. Posting one is best effort: a failure is logged, never
raised into the scheduling that caused it.
"""

from __future__ import annotations

import datetime as dt
import logging
import uuid
from urllib.parse import quote

from kubernetes import client

from gpupool.backends.kubernetes.calls import post_json, raw_status
from gpupool.backends.kubernetes.foreign import PodRef
from gpupool.backends.kubernetes.health import describe

log = logging.getLogger("gpupool.backends.kubernetes")

COMPONENT = "gpupool"
MAX_MESSAGE = 1024


def post_event(api: client.CoreV1Api, pod: PodRef, kind: str, reason: str, message: str) -> bool:
    """Record an Event of ``kind`` (Normal or Warning) on ``pod``; False when the API server refused it.

    Posted as plain JSON and its reply read raw (calls.post_json): one per
    bound kubectl pod, so the client's per-call checks and model objects, and
    a reply left unread (its connection stranded, the next call's TLS
    handshake), would cost more than the post itself.
    """
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": f"{pod.name[:200]}.{uuid.uuid4().hex[:16]}", "namespace": pod.namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "namespace": pod.namespace, "name": pod.name,
                           "uid": pod.uid},
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "type": kind,
        "source": {"component": COMPONENT},
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        raw_status(post_json(api, f"/api/v1/namespaces/{quote(pod.namespace, safe='')}/events", body))
    except Exception as e:
        log.warning("could not record event %s on pod %s: %s", reason, pod.text, describe(e))
        return False
    return True
