"""ResourceClaims and DeviceClasses as the API server has them, kept current by two watches.

What a pod's claims ask for is read from here (:mod:`.dra_claims`); every
change moves ``generation``, so pods that wait on a claim (not made yet,
unsupported, reserved elsewhere) are read again when it changes. A claim
whose devices are GPUs of the pool and that no pod holds any more (its pods
ended or went: the controller-manager took them out of ``reservedFor``) is
given back: gpupool clears its allocation (``on_unreserved``), so a named
claim can be allocated again for its next pod.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable

from kubernetes import client

from gpupool.backends.kubernetes import objects as ob
from gpupool.backends.kubernetes.dra_slices import DRIVER
from gpupool.backends.kubernetes.health import Health
from gpupool.backends.kubernetes.objects import Obj
from gpupool.backends.kubernetes.watcher import ListWatch


def unreserved_gpu_allocation(claim: Obj) -> bool:
    """Allocated GPU devices of the driver that no consumer holds: gpupool's to give back."""
    st = ob.status(claim)
    results = ((st.get("allocation") or {}).get("devices") or {}).get("results") or []
    return bool(results) and not st.get("reservedFor") and all(r.get("driver") == DRIVER for r in results) \
        and not ob.being_deleted(claim)


class DraClaims:
    """Every ResourceClaim (by namespace and name) and DeviceClass (by name), for the pods' claims."""

    def __init__(self, api: client.ApiClient, health: Health, on_unreserved: Callable[[Obj], None]) -> None:
        self._lock = threading.Lock()
        self._claims: dict[tuple[str, str], Obj] = {}
        self._classes: dict[str, Obj] = {}
        self._marks = itertools.count(1)
        self.generation = 0
        """Moves on every change of a claim or class: pods waiting on one are read again."""
        self._on_unreserved = on_unreserved
        self._started = False
        self._held: tuple[int, dict[str, tuple[tuple[str, str, str], ...]]] = (-1, {})  # (generation, by pod uid)
        self.on_change: Callable[[], None] = lambda: None
        """Called (on the watch thread) after a claim changed: other schedulers' claims hold GPUs."""
        rapi = client.ResourceV1Api(api)
        self.claim_watch = ListWatch("resourceclaims", rapi.list_resource_claim_for_all_namespaces,
                                     self._claims_reset, self._claim_event, health)
        self.class_watch = ListWatch("deviceclasses", rapi.list_device_class, self._classes_reset,
                                     self._class_event, health)

    def start(self, served: bool = True) -> None:
        """Start both watches; where the API server serves no resource.k8s.io/v1, none (both empty, synced)."""
        self._started = served
        if not served:
            self.claim_watch.synced.set()
            self.class_watch.synced.set()
            return
        self.claim_watch.start()
        self.class_watch.start()

    def close(self) -> None:
        if self._started:
            self.claim_watch.stop(wait_s=0.5)
            self.class_watch.stop(wait_s=0.5)

    @staticmethod
    def _key(claim: Obj) -> tuple[str, str]:
        return ob.namespace(claim), ob.name(claim)

    def _claims_reset(self, items: list[Obj]) -> None:
        with self._lock:
            self._claims = {self._key(c): c for c in items}
            self.generation = next(self._marks)
        for c in items:
            if unreserved_gpu_allocation(c):
                self._on_unreserved(c)
        self.on_change()

    def _claim_event(self, kind: str, claim: Obj) -> None:
        with self._lock:
            if kind == "DELETED":
                self._claims.pop(self._key(claim), None)
            else:
                self._claims[self._key(claim)] = claim
            self.generation = next(self._marks)
        if kind != "DELETED" and unreserved_gpu_allocation(claim):
            self._on_unreserved(claim)
        self.on_change()

    def _classes_reset(self, items: list[Obj]) -> None:
        with self._lock:
            self._classes = {ob.name(c): c for c in items}
            self.generation = next(self._marks)

    def _class_event(self, kind: str, cls: Obj) -> None:
        with self._lock:
            if kind == "DELETED":
                self._classes.pop(ob.name(cls), None)
            else:
                self._classes[ob.name(cls)] = cls
            self.generation = next(self._marks)

    # ------------------------------------------------------------ reads (any thread)
    @property
    def synced(self) -> bool:
        return self.claim_watch.synced.is_set() and self.class_watch.synced.is_set()

    def claims_in(self, namespace: str, names: tuple[str, ...] | list[str]) -> dict[str, Obj]:
        """Those claims of the namespace that exist, by name."""
        with self._lock:
            return {n: c for n in names if (c := self._claims.get((namespace, n))) is not None}

    def held_by(self, pod_uid: str) -> tuple[tuple[str, str, str], ...]:
        """(driver, pool, device) of every device allocated in a claim reserved for that pod."""
        with self._lock:
            gen, held = self._held
            if gen != self.generation:
                held = {}
                for c in self._claims.values():
                    st = ob.status(c)
                    results = ((st.get("allocation") or {}).get("devices") or {}).get("results") or []
                    devices = tuple((str(r.get("driver")), str(r.get("pool")), str(r.get("device")))
                                    for r in results)
                    for r in st.get("reservedFor") or []:
                        if r.get("resource") == "pods" and r.get("uid"):
                            held[str(r["uid"])] = held.get(str(r["uid"]), ()) + devices
                self._held = (self.generation, held)
            return held.get(pod_uid, ())

    def classes(self) -> dict[str, Obj]:
        with self._lock:
            return dict(self._classes)
