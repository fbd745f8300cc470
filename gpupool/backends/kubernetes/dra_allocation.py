"""kubectl pods whose GPUs come from ResourceClaims: queued from their claims, their devices written before binding.

Three moments of such a pod (docs/kubernetes.md, "GPUs claimed through DRA"):

- **queueing** (:meth:`DraPods.amend`, the core's loop): its claims become
  the job's whole-GPU count (or, with annotation ``gpupool.io/gpu-fraction`` or
  ``gpu-memory`` and a one-device claim, a share) and one node-affinity
  expression, so the one policy chooses node and GPUs under quota, guarantee,
  placement rules and fragmentation. A claim gpupool cannot place gets a
  Warning event ``GpupoolClaimUnsupported`` saying why; the pod stays Pending
  and is read again when a claim, class or slice changes.
- **binding** (:meth:`DraPods.allocate`, a worker thread, before the pod's
  binding): the GPUs the policy chose are written into each claim's
  ``status.allocation`` (devices.results: request, driver, pool, device; the
  node as ``nodeSelector``) and ``status.reservedFor`` (the pod), in one
  write per claim. An allocation is immutable once set: a claim allocated
  by an earlier try (a refused bind, a reclaim) is first given back.
- **the end**: the controller-manager takes an ended or deleted pod out of
  ``reservedFor`` (and deletes a template's claim with its pod); a claim of
  GPUs left allocated with no pod holding it is given back by gpupool
  (:meth:`DraPods.give_back`), so a named claim serves its next pod.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
from collections.abc import Callable
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpupool.backends.kubernetes import objects as ob
from gpupool.backends.kubernetes.calls import Calls, raw_json
from gpupool.backends.kubernetes.dra_claims import (
    Ask,
    ClaimProblem,
    KindCheck,
    kind_check,
    read_ask,
    uses_claims,
)
from gpupool.backends.kubernetes.dra_slices import DRA_NODE_LABEL, Device, DraSlices
from gpupool.backends.kubernetes.dra_watch import DraClaims, unreserved_gpu_allocation
from gpupool.backends.kubernetes.foreign import FRACTION_ANNOTATION, MEMORY_ANNOTATION, KubectlPod, PodRef
from gpupool.backends.kubernetes.health import Health, describe
from gpupool.backends.kubernetes.names import GPU_RESOURCE
from gpupool.backends.kubernetes.objects import Obj

log = logging.getLogger("gpupool.backends.kubernetes")

UNSUPPORTED = "GpupoolClaimUnsupported"


def with_affinity(spec: dict[str, Any], expression: dict[str, Any]) -> dict[str, Any]:
    """``spec`` whose required node affinity also demands ``expression`` (ANDed into each term)."""
    affinity = dict(spec.get("node_affinity") or {})
    terms = affinity.get("required") or [[]]
    affinity["required"] = [[*t, expression] for t in terms]
    return {**spec, "node_affinity": affinity}


def results_for(ask: Ask, devices: list[Device]) -> dict[str, list[dict[str, str]]]:
    """Claim -> its allocation's results: the chosen devices dealt to the requests in order."""
    out: dict[str, list[dict[str, str]]] = {c: [] for c in ask.claims}
    pos = 0
    for r in ask.requests:
        take = len(devices) - pos if r.count == 0 else r.count
        if len(devices) == 1 and ask.gpus == 1:  # a share of one GPU: that device
            take = 1
        chosen = devices[pos:pos + take]
        if len(chosen) != take:
            raise RuntimeError(f"gpupool chose {len(devices)} GPUs for claims asking {ask.gpus}")
        out[r.claim].extend({"request": r.name, "driver": d.driver, "pool": d.pool, "device": d.name}
                            for d in chosen)
        pos += take
    return out


def said(e: BaseException) -> str:
    """An API error with the API server's own message (a 422 says which field it refused)."""
    body = getattr(e, "body", None)
    try:
        message = json.loads(body).get("message") if body else None
    except (ValueError, AttributeError):
        message = None
    return f"{describe(e)}: {message}" if message else describe(e)


class DraPods:
    """The DRA side of kubectl pods: the claim and class watches, queueing, allocation and giving back."""

    def __init__(self, api: client.CoreV1Api, slices: DraSlices, calls: Calls, health: Health,
                 warn: Callable[[PodRef, str, str], None]) -> None:
        self.api = api
        self.rapi = client.ResourceV1Api(api.api_client)
        self.slices = slices
        self.calls = calls
        self.warn = warn
        self.claims = DraClaims(api.api_client, health, self._unreserved)
        self._check: tuple[int, KindCheck] = (-1, kind_check({}))

    def start(self) -> None:
        self.claims.start(self.slices.served)  # (after the slices' start, which found out whether DRA is served)

    def close(self) -> None:
        self.claims.close()

    def generation(self) -> tuple[int, int]:
        """Moves when a claim, class or node's devices change: waiting pods are read again."""
        return self.claims.generation, self.slices.generation

    # ------------------------------------------------------------ queueing (the core's loop)
    def ask_of(self, pod: Obj) -> Ask | None:
        """What the pod's claims ask for; None while a template's claim is not made; raises ClaimProblem."""
        names = [str(c.get("resourceClaimName") or "") for c in ob.spec(pod).get("resourceClaims") or []]
        names += [str(s.get("resourceClaimName") or "") for s in ob.status(pod).get("resourceClaimStatuses") or []]
        claims = self.claims.claims_in(ob.namespace(pod), [n for n in names if n])
        return read_ask(pod, claims, self.claims.classes(), self.kinds())

    def kinds(self) -> KindCheck:
        """Which kinds of nodes pass which selectors (a Job's template claims are read by them too): memoised
        until the slices' devices change."""
        gen, check = self._check
        if gen != self.slices.generation:
            gen = self.slices.generation  # (read first: a change meanwhile moves it again)
            check = kind_check(self.slices.devices())
            self._check = (gen, check)
        return check

    def amend(self, pod: Obj, kp: KubectlPod) -> KubectlPod | None:
        """The pod's job spec with its claims' GPUs and node kinds; None when it waits or was told why not.

        A pod without claims that asks for ``nvidia.com/gpu`` is kept off the
        nodes whose GPUs come from slices: their kubelet has no such resource
        to admit it with.
        """
        if not uses_claims(pod):
            if "gpus" in kp.spec and self.slices.any():
                return dataclasses.replace(kp, spec=with_affinity(kp.spec, {"key": DRA_NODE_LABEL,
                                                                            "operator": "DoesNotExist"}))
            return kp
        if not self.claims.synced:
            return None
        try:
            ask = self.ask_of(pod)
            if ask is None:
                return None  # its template's claim is not made yet
            spec = dict(kp.spec)
            if "gpus" in spec:
                raise ClaimProblem(f"it asks for GPUs both through resourceClaims and a {GPU_RESOURCE} limit; "
                                   "give one of them")
            if "gpu_fraction" in spec or "gpu_memory" in spec:
                if ask.gpus != 1 or ask.requests[0].count == 0:
                    raise ClaimProblem(f"a share (annotation {FRACTION_ANNOTATION} or {MEMORY_ANNOTATION}) is "
                                       f"claimed with one request of count 1, not {ask.gpus} devices")
            else:
                spec["gpus"] = ask.gpus
        except ClaimProblem as e:
            self.warn(kp.ref, UNSUPPORTED, f"gpupool cannot place this pod's claims: {e}; the pod stays Pending "
                                           "and is checked again when its claims change")
            return None
        return dataclasses.replace(kp, spec=with_affinity(spec, ask.node_affinity()))

    # ------------------------------------------------------------ binding (a worker thread)
    def allocate(self, ref: PodRef, pod: Obj | None, node: str, gpu_ids: list[str]) -> None:
        """Write the chosen GPUs into the pod's claims (allocation and reservation); RuntimeError when not."""
        if pod is None or not uses_claims(pod):
            return
        try:
            ask = self.ask_of(pod)
        except ClaimProblem as e:
            raise RuntimeError(f"its claims cannot be allocated: {e}") from e
        if ask is None:
            raise RuntimeError("its ResourceClaim is not made yet")
        devices = []
        for gid in gpu_ids:
            d = self.slices.device_of(gid)
            if d is None or d.node != node:
                raise RuntimeError(f"GPU {gid} on node {node} is no device of a ResourceSlice any more")
            devices.append(d)
        results = results_for(ask, devices)
        configs = dict(ask.configs)
        selector = {"nodeSelectorTerms": [{"matchFields": [
            {"key": "metadata.name", "operator": "In", "values": [node]}]}]}
        for claim in ask.claims:
            devs: dict[str, Any] = {"results": results[claim]}
            if configs.get(claim):
                devs["config"] = list(configs[claim])
            status = {"allocation": {"devices": devs, "nodeSelector": selector},
                      "reservedFor": [{"resource": "pods", "name": ref.name, "uid": ref.uid}]}
            try:
                self._write(ref.namespace, claim, status)
            except Exception as e:
                raise RuntimeError(f"could not allocate ResourceClaim {ref.namespace}/{claim}: {said(e)}") from e

    def _read(self, ns: str, name: str) -> Obj:
        return raw_json(self.rapi.read_namespaced_resource_claim(name, ns, _preload_content=False))

    def _replace_status(self, ns: str, name: str, claim: Obj) -> Obj:
        return raw_json(self.rapi.replace_namespaced_resource_claim_status(
            name, ns, ob.client_body(claim), _preload_content=False))

    def _write(self, ns: str, name: str, status: dict[str, Any]) -> None:
        """Set the claim's status (read-modify-write on its resourceVersion; a conflict is read again).

        The first try writes over the watch's copy of the claim (no read: one
        request, as kube-scheduler's own allocation); a stale copy is a 409,
        and the claim is then read from the API server.
        """
        for attempt in range(3):
            cached = self.claims.claims_in(ns, [name]).get(name) if attempt == 0 else None
            claim = copy.deepcopy(cached) if cached is not None else self._read(ns, name)
            now = ob.status(claim)
            have = ((now.get("allocation") or {}).get("devices") or {}).get("results")
            if have == status["allocation"]["devices"]["results"] and now.get("reservedFor") == status["reservedFor"]:
                return  # written by an earlier try
            try:
                if now.get("allocation"):  # immutable once set: give it back first
                    claim["status"] = {}
                    claim = self._replace_status(ns, name, claim)
                claim["status"] = status
                self._replace_status(ns, name, claim)
                return
            except ApiException as e:
                if e.status != 409 or attempt == 2:
                    raise

    def claimed_gpus(self, pod_uid: str) -> tuple[str, ...]:
        """The pool's GPU ids that claims reserved for this pod hold (another scheduler's pod: used capacity)."""
        ids = (self.slices.gpu_id(*d) for d in self.claims.held_by(pod_uid))
        return tuple(i for i in ids if i is not None)

    # ------------------------------------------------------------ the end (watch thread -> a worker)
    def _unreserved(self, claim: Obj) -> None:
        self.calls.submit(self.give_back, ob.namespace(claim), ob.name(claim))

    def give_back(self, ns: str, name: str) -> None:
        """Clear the allocation of a GPU claim no pod holds any more (it may then serve another pod)."""
        try:
            claim = self._read(ns, name)
            if not unreserved_gpu_allocation(claim):
                return
            claim["status"] = {}
            self._replace_status(ns, name, claim)
            log.info("ResourceClaim %s/%s: no pod holds it any more; its GPUs are given back", ns, name)
        except ApiException as e:
            if e.status not in (404, 409):  # gone, or changed meanwhile (its next event decides again)
                log.warning("could not give back ResourceClaim %s/%s: %s", ns, name, describe(e))
        except Exception as e:
            log.warning("could not give back ResourceClaim %s/%s: %s", ns, name, describe(e))
