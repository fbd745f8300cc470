"""The start of gpupool's own pods: create each Pending, then bind it to its node; a gang's all before any bind.

This is the half of the pod executor (:class:`gpupool.backends.kubernetes.executor.PodExecutor`)
that talks to the API server on a worker thread while the core goes on: the
create (a refusal by the API server, such as a ResourceQuota, is an answer
given at once: :class:`gpupool.backends.kubernetes.calls.Refused`), the bind
through ``pods/binding``, the back-off after starts that failed in a row, and
the clean-up of a start that failed half-way (a pod created but never bound is
deleted with no grace: nothing ran). The other half, the watch and what it
says of each attempt, stays in the executor; both read the same
:class:`PodAttempt` records, under the executor's lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpupool.backends.kubernetes.calls import (
    START_GIVE_UP_S,
    Calls,
    Refused,
    StartBackoff,
    bind_pod,
    pods_path,
    post_json,
    raw_json,
    refusal,
)
from gpupool.backends.kubernetes.health import describe
from gpupool.backends.kubernetes.names import pod_name
from gpupool.backends.kubernetes.objects import Obj
from gpupool.backends.kubernetes.pods import PodEnd, PodHandle


@dataclass
class PodAttempt:
    """What we know of one attempt's pod (guarded by the executor's lock)."""

    handle: PodHandle
    start: Any = None  # the create+bind future (None for an adopted pod)
    adopted: bool = False  # found by recovery: a list without its pod means it is gone
    created_rv: int | None = None  # resourceVersion of the created pod: a later list without it means gone
    uid: str | None = None  # the pod's uid: events of an earlier pod of the same name (a refused start) are not its
    seen: bool = False
    gone: bool = False
    end: PodEnd | None = None
    stuck: str | None = None  # why its container cannot start (ImagePullBackOff: ...), while it cannot
    stuck_since: float = 0.0  # (time.monotonic) since when
    never_starts: bool = False  # no retry can cure it (an invalid image name): give up at once
    disrupted: str = ""  # its pod shows a disruption (deleted, evicted), in words: a gang stops its other replicas
    disrupted_since: Any = None  # (datetime) when that disruption began, where the pod says
    extra: dict[str, Any] = field(default_factory=dict)
    main: bool = field(init=False)  # the attempt's own pod, not a gang replica's (live logs follow these)

    def __post_init__(self) -> None:
        self.main = self.handle.name == pod_name(self.handle.job_id, self.handle.attempt)


def rv_number(text: str | None) -> int | None:
    """A resourceVersion as a number to compare (None when absent or not a number)."""
    try:
        return int(text) if text else None
    except ValueError:
        return None


def start_error(a: PodAttempt) -> str | None:
    """Why the attempt's start failed, in words; None while it runs or once it succeeded."""
    f = a.start
    if f is None or not f.done() or f.cancelled():
        return "the start was cancelled" if f is not None and f.cancelled() else None
    e = f.exception()
    return None if e is None else describe(e) if not isinstance(e, RuntimeError) else str(e)


def start_refused(a: PodAttempt) -> bool:
    """Whether the attempt's start ended in the API server's refusal of its pod (see :class:`Refused`)."""
    f = a.start
    return f is not None and f.done() and not f.cancelled() and isinstance(f.exception(), Refused)


class PodStarts:
    """Creates and binds attempts' pods on the worker threads of ``calls``; each start's future is returned.

    ``lock``: the executor's, under which a created pod's uid and resourceVersion
    are recorded on its attempt (the watch reads them). ``delete_quietly(name,
    grace)``: the executor's delete, for a pod whose start failed half-way.
    """

    def __init__(self, api: client.CoreV1Api, namespace: str, calls: Calls, lock: threading.Lock,
                 delete_quietly: Callable[[str, int], None]) -> None:
        self.api = api
        self.namespace = namespace
        self.calls = calls
        self._lock = lock
        self._delete_quietly = delete_quietly
        self._backoff = StartBackoff()  # starts failed in a row: the next one waits
        self.claims: Callable[[dict[str, Any], str], tuple[dict[str, Any], Callable[[Obj], None] | None]] | None = None
        """On a node whose GPUs come from ResourceSlices: the manifest naming the pod's claim, and what makes and
        allocates that claim once the pod exists (dra_own_pods.py); None elsewhere."""

    def one(self, a: PodAttempt, manifest: dict[str, Any], node: str,
            before_bind: Callable[[Obj], None] | None = None) -> Future[None]:
        """Start one pod: create, ``before_bind(created pod)`` (if it raises, the pod is deleted), bind."""
        return self.calls.submit(self._create_and_bind, a, manifest, node, before_bind)

    def gang(self, attempts: list[PodAttempt], manifests: list[dict[str, Any]]) -> Future[None]:
        """Start a gang's pods (in rank order): one task that creates them all, then binds them all."""
        return self.calls.submit(self._create_all_then_bind, attempts, manifests)

    def _create_all_then_bind(self, attempts: list[PodAttempt], manifests: list[dict[str, Any]]) -> None:
        """A gang's start, after the same back-off as any start."""
        self._backed_off(lambda: self._create_all_then_bind_now(attempts, manifests))

    def _create_all_then_bind_now(self, attempts: list[PodAttempt], manifests: list[dict[str, Any]]) -> None:
        created: list[PodAttempt] = []
        at = 0  # the rank being created or bound
        try:
            for at, (a, manifest) in enumerate(zip(attempts, manifests, strict=True)):  # noqa: B007 (read in the except)
                manifest, claimed = self._claimed(manifest, a.handle.node)
                pod = self.create(a, manifest)
                created.append(a)
                if claimed is not None:
                    claimed(pod)
            for at, a in enumerate(attempts):  # noqa: B007 (read in the except)
                self.bind(a, a.handle.node)
        except BaseException as e:
            for a in created:  # refused, or a bind failed: none of the gang stays (nothing ran: grace 0)
                self._delete_quietly(a.handle.name, 0)
            if isinstance(e, Refused) or not isinstance(e, Exception):
                raise  # a refusal's message names the pod
            what = str(e) if isinstance(e, RuntimeError) else \
                f"could not create pod {attempts[at].handle.name}: {describe(e)}"
            raise RuntimeError(f"replica {at}: {what}") from e

    def _create_and_bind(self, a: PodAttempt, manifest: dict[str, Any], node: str,
                         before_bind: Callable[[Obj], None] | None = None) -> None:
        def start() -> None:
            claimed_manifest, claimed = self._claimed(manifest, node)
            created = self.create(a, claimed_manifest)
            if before_bind is not None or claimed is not None:
                try:
                    if claimed is not None:
                        claimed(created)
                    if before_bind is not None:
                        before_bind(created)
                except BaseException:
                    self._delete_quietly(a.handle.name, 0)  # never bound: nothing ran
                    raise
            self.bind(a, node)

        self._backed_off(start)

    def _claimed(self, manifest: dict[str, Any], node: str) -> tuple[dict[str, Any], Callable[[Obj], None] | None]:
        return self.claims(manifest, node) if self.claims is not None else (manifest, None)

    def _backed_off(self, start: Callable[[], object]) -> None:
        """Run ``start`` (create and bind) after the wait that starts failed in a row call for (:class:`StartBackoff`).

        A create the API server refuses (:class:`Refused`) does not count: the core backs that job off (it
        waits queued), not this thread while the job shows "running".
        """
        self._backoff.run(start, counts=lambda e: not isinstance(e, Refused))

    def create(self, a: PodAttempt, manifest: dict[str, Any]) -> Obj:
        """Create the attempt's pod (Pending, not yet bound); a refusal raises :class:`Refused` with the API
        server's message. Posted as plain JSON (post_json: no per-call argument checks), its reply read raw
        for two fields."""
        ns, name = self.namespace, a.handle.name

        def post() -> dict[str, Any]:  # a refusal is an answer: raised at once, never retried as an outage
            try:
                return raw_json(post_json(self.api, pods_path(ns), manifest))
            except ApiException as e:
                why = refusal(e)
                if why is None:
                    raise
                raise Refused(f"the API server refused pod {name}: {why}") from e

        created = self.calls.retrying("start", post, START_GIVE_UP_S)
        meta = created.get("metadata") or {}
        with self._lock:
            a.created_rv = rv_number(meta.get("resourceVersion"))
            a.uid = meta.get("uid")
        return created

    def bind(self, a: PodAttempt, node: str) -> None:
        """Bind the created pod to ``node``; a refused bind deletes it (never bound: nothing ran) and raises.
        The binding's reply is a Status the client cannot read as a V1Binding anyway: only its code is read."""
        ns, name = self.namespace, a.handle.name
        try:
            status = self.calls.retrying("start", lambda: bind_pod(self.api, ns, name, node), START_GIVE_UP_S)
            if status != 201:
                raise RuntimeError(f"binding {name} to {node} answered HTTP {status}")
        except Exception as e:
            self._delete_quietly(name, 0)  # never bound: nothing ran; free the name for nobody
            raise RuntimeError(f"could not bind pod {name} to node {node}: {describe(e)}") from e
