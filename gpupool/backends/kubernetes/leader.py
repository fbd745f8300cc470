"""Leader election with a ``coordination.k8s.io/v1`` Lease: one scheduler acts, the others wait.

Why: two schedulers on one namespace (``replicas: 2``, a second install)
each see the other's pods as strays and delete them. Like kube-scheduler and
KAI-Scheduler, gpupool takes a Lease before it acts; a standby waits for it.

The protocol (our own code; client-go's leaderelection package is the model):

- **Acquire or renew**: read the Lease; if another identity holds it and the
  record has not changed for its ``leaseDurationSeconds`` *as this process
  measured it* (a monotonic clock from the moment it saw the record change,
  so no two machines' clocks are compared), it is taken over; otherwise it
  is held and we wait ``retry_period_s``. Every write is an update carrying
  the ``resourceVersion`` read (optimistic concurrency): of two standbys
  racing for an expired Lease one gets 409 and stays standby.
- **Leading**: renewed every ``retry_period_s``. The leader may write to the
  cluster only until ``renew_deadline_s`` after the start of its last
  successful renewal (:meth:`Leadership.may_write`, which every write of
  the backend consults through :mod:`.fence`). A standby takes over only
  ``lease_duration_s`` after it last saw a renewal, later than that
  deadline, so the old leader has stopped writing before a new one starts,
  even when it cannot reach the API server at all.
- **Lost**: the deadline passed without a renewal, or the Lease names
  another holder (someone took it). Writes stop at once and ``on_lost`` is
  called (``gpupool serve`` exits; a restart comes back as a standby).
- **Released** on a clean stop: the holder is cleared so a standby (or the
  next pod of a rollout) takes over at once instead of waiting the duration.
"""

from __future__ import annotations

import datetime
import logging
import math
import os
import random
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

log = logging.getLogger("gpupool.backends.kubernetes.leader")

JITTER = 1.2
"""A standby's retry period is stretched by up to this factor at random, so standbys do not retry in step."""


def default_identity() -> str:
    """The pod's name from the downward API (``POD_NAME``), else ``<hostname>_<pid>``.

    A container restarted in the same pod keeps its pod's name and takes its
    own Lease back at once; two processes on one machine never share one.
    """
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}_{os.getpid()}"


@dataclass(frozen=True)
class LeaseSettings:
    """Where the Lease is and how long its terms are (ServiceConfig ``kube_lease_*``)."""

    namespace: str
    name: str = "gpupool-scheduler"
    identity: str = ""  # "": default_identity()
    duration_s: float = 15.0
    renew_deadline_s: float = 10.0
    retry_period_s: float = 2.0


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


class Leadership:
    """Whether this instance leads now: the one question every write to the cluster asks (:mod:`.fence`).

    The elector thread writes it; any thread reads it. ``may_write`` also
    judges the deadline itself, so a renewal stuck on the network does not
    keep writes open past ``renew_deadline_s``.
    """

    def __init__(self, settings: LeaseSettings, on_lost: Callable[[str], None] | None = None) -> None:
        self.settings = settings
        self.identity = settings.identity or default_identity()
        self._lock = threading.Lock()
        self._valid_until = 0.0  # monotonic: writes allowed before this
        self._leading = False
        self._lost: str | None = None  # why this instance stopped leading (once lost, never again)
        self._holder: str | None = None  # the identity the Lease named when last read
        self._on_lost = on_lost
        self.acquired = threading.Event()
        """Set once this instance leads (a standby's wait ends)."""
        self.lost = threading.Event()
        """Set once this instance lost the lead it had."""

    # ------------------------------------------------------------ readers (any thread)
    def may_write(self) -> bool:
        """True while this instance leads and its last renewal is younger than the renew deadline."""
        with self._lock:
            if not self._leading:
                return False
            if time.monotonic() < self._valid_until:
                return True
        self.lose(f"the lease {self.where} was not renewed within {self.settings.renew_deadline_s:g} s")
        return False

    def refusal(self) -> str:
        """Why a write is refused now (for the fence's error)."""
        with self._lock:
            why, holder = self._lost, self._holder
        if why:
            return f"this instance ({self.identity}) is no longer the leader: {why}"
        return f"this instance ({self.identity}) is a standby; the leader is {holder or 'unknown'}"

    @property
    def where(self) -> str:
        return f"{self.settings.namespace}/{self.settings.name}"

    def holder(self) -> str | None:
        """The identity the Lease named when last read (this instance's while it leads)."""
        with self._lock:
            return self.identity if self._leading else self._holder

    def describe(self) -> dict[str, Any]:
        """For ``GET /status`` (``backend.leader``) and the standby's replies."""
        with self._lock:
            leading = self._leading and self._lost is None
            holder = self.identity if leading else self._holder
            return {"lease": self.where, "identity": self.identity, "leader": holder, "this_instance": leading,
                    **({"lost": self._lost} if self._lost else {})}

    # ------------------------------------------------------------ the elector's side
    def _observed(self, holder: str | None) -> None:
        with self._lock:
            self._holder = holder

    def _renewed(self, started: float) -> None:
        """A renewal (or the acquisition) that was sent at monotonic ``started`` succeeded."""
        with self._lock:
            if self._lost is not None:
                return
            first = not self._leading
            self._leading = True
            self._holder = self.identity
            self._valid_until = started + self.settings.renew_deadline_s
        if first:
            log.info("leading: this instance (%s) holds the lease %s", self.identity, self.where)
            self.acquired.set()

    def lose(self, why: str, notify: bool = True) -> None:
        """Stop writing now and tell ``on_lost`` (once, unless ``notify`` is False: a release on a clean stop).

        A standby that never led has nothing to lose: nothing changes."""
        with self._lock:
            if not self._leading or self._lost is not None:
                return
            self._leading = False
            self._lost = why
        self.lost.set()
        if not notify:
            return
        log.error("lost the leadership: %s; no more writes to the cluster from this instance", why)
        if self._on_lost is not None:
            self._on_lost(why)


class LeaderElector:
    """The thread that acquires, renews and releases the Lease for a :class:`Leadership`.

    It has its own API client (``api_client``), never fenced: a standby must
    be able to write the Lease, and nothing else.
    """

    def __init__(self, leadership: Leadership, api_client: client.ApiClient) -> None:
        self.leadership = leadership
        self.settings = leadership.settings
        self.api = client.CoordinationV1Api(api_client)
        self._stop = threading.Event()
        self._seen: tuple[Any, ...] | None = None  # (holder, renewTime, transitions) last read
        self._seen_at = 0.0  # monotonic: when that record was first seen
        self._expires_at: float | None = None  # monotonic: when another holder's term runs out, as we measure it
        self._thread = threading.Thread(target=self._run, name="gpupool-leader", daemon=True)
        self.last_error: str | None = None

    def start(self) -> None:
        self._thread.start()

    def _timeout(self) -> float:
        return max(0.5, self.settings.renew_deadline_s / 2)

    def _run(self) -> None:
        s = self.settings
        while not self._stop.is_set():
            leading = self.leadership.acquired.is_set()
            if self.leadership.lost.is_set():
                return
            try:
                self.try_acquire_or_renew()
                self.last_error = None
            except Exception as e:  # the API server away, a refusal (RBAC): retried; the deadline judges a leader
                error = f"{type(e).__name__}: {getattr(e, 'reason', None) or e}"
                if error != self.last_error:  # said once, not every retry period
                    log.warning("lease %s: %s (retried every %g s)", self.leadership.where, error, s.retry_period_s)
                self.last_error = error
            if leading:
                self.leadership.may_write()  # past the deadline: lost (writes already refused by the fence)
                wait = s.retry_period_s
            else:  # a standby: the next try at the retry period, or the moment the holder's term runs out
                wait = s.retry_period_s * random.uniform(1.0, JITTER)
                if self._expires_at is not None:
                    wait = min(wait, max(0.0, self._expires_at - time.monotonic()) + 0.01)
            self._stop.wait(wait)

    def try_acquire_or_renew(self) -> bool:
        """One round: True when this instance holds the Lease afterwards."""
        started = time.monotonic()
        me = self.leadership.identity
        ns, name = self.settings.namespace, self.settings.name
        try:
            lease = self.api.read_namespaced_lease(name, ns, _request_timeout=self._timeout())
        except ApiException as e:
            if e.status != 404:
                raise
            return self._create(started)
        spec = lease.spec or client.V1LeaseSpec()
        record = (spec.holder_identity, spec.renew_time, spec.lease_transitions)
        if record != self._seen:
            self._seen, self._seen_at = record, started
        holder = spec.holder_identity or None
        self.leadership._observed(holder)
        if holder and holder != me:
            if self.leadership.acquired.is_set():  # it was ours: someone took it
                self.leadership.lose(f"the lease {self.leadership.where} is now held by {holder}")
                return False
            duration = spec.lease_duration_seconds or self.settings.duration_s
            self._expires_at = self._seen_at + duration
            if time.monotonic() < self._expires_at:
                return False  # held, and renewed within its duration as we measure it
        self._expires_at = None
        now = _now()
        if holder != me:
            spec.acquire_time = now
            spec.lease_transitions = (spec.lease_transitions or 0) + (1 if holder else 0)
        spec.holder_identity = me
        spec.renew_time = now
        spec.lease_duration_seconds = max(1, math.ceil(self.settings.duration_s))
        lease.spec = spec  # metadata.resourceVersion is the one read: a concurrent write makes this a 409
        try:
            self.api.replace_namespaced_lease(name, ns, lease, _request_timeout=self._timeout())
        except ApiException as e:
            if e.status == 409:
                return False  # another instance wrote first: read again next round
            raise
        self.leadership._renewed(started)
        return True

    def _create(self, started: float) -> bool:
        now = _now()
        body = client.V1Lease(
            metadata=client.V1ObjectMeta(name=self.settings.name, namespace=self.settings.namespace,
                                         labels={"app.kubernetes.io/managed-by": "gpupool"}),
            spec=client.V1LeaseSpec(holder_identity=self.leadership.identity, acquire_time=now, renew_time=now,
                                    lease_duration_seconds=max(1, math.ceil(self.settings.duration_s)),
                                    lease_transitions=0))
        try:
            self.api.create_namespaced_lease(self.settings.namespace, body, _request_timeout=self._timeout())
        except ApiException as e:
            if e.status == 409:
                return False  # another instance created it first
            raise
        self.leadership._renewed(started)
        return True

    def stop(self, release: bool = True) -> None:
        """Stop renewing; with ``release``, clear the holder (while still ours) so a standby takes over at once."""
        self._stop.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(self._timeout() + 1)
        if release and self.leadership.may_write():
            self._release()

    def _release(self) -> None:
        ns, name = self.settings.namespace, self.settings.name
        try:
            lease = self.api.read_namespaced_lease(name, ns, _request_timeout=self._timeout())
            if lease.spec is None or lease.spec.holder_identity != self.leadership.identity:
                return
            lease.spec.holder_identity = None
            lease.spec.renew_time = _now()
            lease.spec.lease_duration_seconds = 1
            self.leadership.lose("released on stop", notify=False)  # no write of ours after this
            self.api.replace_namespaced_lease(name, ns, lease, _request_timeout=self._timeout())
            log.info("released the lease %s", self.leadership.where)
        except Exception as e:  # a standby then waits the lease's duration: slower, never wrong
            log.warning("could not release the lease %s: %s", self.leadership.where, e)
