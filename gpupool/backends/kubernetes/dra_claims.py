"""A pod's ResourceClaims -> what gpupool queues for it: a GPU count and the nodes it may land on (pure).

A kubectl pod for gpupool may get its GPUs from ``spec.resourceClaims``
(each a named ``resourceClaimName``, or a ``resourceClaimTemplateName`` whose
claim the controller-manager makes and names in
``status.resourceClaimStatuses``). gpupool understands requests of the
``gpu.nvidia.com`` DeviceClass, ``exactly`` with ``allocationMode``
ExactCount (``count``) or All, and CEL ``selectors`` (the class's and the
request's, :mod:`.dra_cel`). It turns them into the job's whole-GPU count and
one node-affinity expression over the kinds of nodes whose every device the
selectors accept (:data:`.dra_slices.DRA_NODE_LABEL`), so the same policy
that places every job chooses node and GPUs; the devices it chose are then
written into the claims (:mod:`.dra_allocation`).

Anything else (another class, ``firstAvailable``, ``constraints``,
``adminAccess``, a capacity request, a claim that does not exist or is
reserved for another pod, a selector that does not compile) is a
:class:`ClaimProblem` whose message the pod's Warning event carries: never a
silent wait. A template's claim not made yet is a wait (None): the pod is
read again when its claim appears.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.backends.kubernetes import objects as ob
from gpupool.backends.kubernetes.dra_cel import SelectorError, compile_selector, matches
from gpupool.backends.kubernetes.dra_slices import DRA_NODE_LABEL, DRIVER, Device, device_sort, kind_of
from gpupool.backends.kubernetes.objects import Obj

GPU_CLASS = DRIVER
"""The DeviceClass whose requests gpupool places (NVIDIA's chart names it after the driver)."""
PER_DEVICE = re.compile(r"uuid|index")  # what tells devices of one kind apart (a selector naming it reads each)
MAX_KINDS = 64  # values of one node-affinity expression (gpupool.wire.placement.MAX_RULES)


KindCheck = Callable[[frozenset[str]], Mapping[str, tuple[int, bool]]]
"""Selectors -> for each kind of node, its device count and whether every device of every such node passes."""


def kind_check(devices: Mapping[str, tuple[Device, ...]]) -> KindCheck:
    """The :data:`KindCheck` of these nodes' devices, each answer memoised (read again only when slices change).

    Nodes of one kind hold equal devices but for ``uuid`` and ``index``: a
    selector that names neither is evaluated on one device of each sort per
    kind (a CEL evaluation costs milliseconds in Python: 8,000 devices took
    38 s, one per kind a few ms). One that names them may tell the nodes of a
    kind apart: it is evaluated on every device, and a kind passes only when
    all of its nodes' devices do.
    """
    groups: dict[str, list[Device]] = {}
    sorts: dict[str, dict[tuple[Any, ...], Device]] = {}
    size: dict[str, int] = {}
    for devs in devices.values():
        if devs:
            kind = kind_of(devs)
            size[kind] = len(devs)
            groups.setdefault(kind, []).extend(devs)
            for d in devs:
                sorts.setdefault(kind, {}).setdefault(device_sort(d), d)
    memo: dict[frozenset[str], dict[str, tuple[int, bool]]] = {}

    def passes(e: str, kind: str) -> bool:
        devs = groups[kind] if PER_DEVICE.search(e) else sorts[kind].values()
        return all(matches(e, d) for d in devs)

    def check(selectors: frozenset[str]) -> Mapping[str, tuple[int, bool]]:
        got = memo.get(selectors)
        if got is None:
            got = memo[selectors] = {k: (size[k], all(passes(e, k) for e in selectors)) for k in groups}
        return got
    return check


class ClaimProblem(ValueError):
    """Why gpupool cannot place a pod's claims (the whole message of its Warning event)."""


@dataclass(frozen=True)
class Request:
    """One request of one claim: ``count`` devices (0: All of the node's) passing every selector."""

    claim: str
    name: str
    count: int
    selectors: tuple[str, ...]


@dataclass(frozen=True)
class Ask:
    """What a pod's claims ask for: whole GPUs on one node of an accepted kind; the claims to write."""

    namespace: str
    claims: tuple[str, ...]
    requests: tuple[Request, ...]
    gpus: int
    kinds: tuple[str, ...]  # DRA_NODE_LABEL values of the nodes it may land on
    configs: tuple[tuple[str, tuple[Obj, ...]], ...] = ()  # claim -> its allocation's config (class's, then claim's)

    def node_affinity(self) -> dict[str, Any]:
        """The expression that keeps the job on nodes of those kinds (ANDed into each required term)."""
        return {"key": DRA_NODE_LABEL, "operator": "In", "values": list(self.kinds)}


def uses_claims(pod: Obj) -> bool:
    return bool(ob.spec(pod).get("resourceClaims"))


def claim_names(pod: Obj) -> list[tuple[str, str | None]]:
    """(the pod's name for the claim, the ResourceClaim's name or None while a template's is not made yet)."""
    made = {str(s.get("name")): s.get("resourceClaimName")
            for s in ob.status(pod).get("resourceClaimStatuses") or []}
    out: list[tuple[str, str | None]] = []
    for c in ob.spec(pod).get("resourceClaims") or []:
        name = str(c.get("name") or "")
        if c.get("resourceClaimName"):
            out.append((name, str(c["resourceClaimName"])))
        else:
            claim = made.get(name)
            out.append((name, str(claim) if claim else None))
    return out


def _request(claim: str, r: Obj, classes: Mapping[str, Obj]) -> tuple[Request, tuple[Obj, ...]]:
    name = str(r.get("name") or "")
    where = f"request {name!r} of ResourceClaim {claim}"
    if r.get("firstAvailable"):
        raise ClaimProblem(f"{where} uses firstAvailable (a list of alternatives), which gpupool does not place "
                           "yet; ask for one device class with exactly")
    exactly = r.get("exactly")
    if not exactly:
        raise ClaimProblem(f"{where} has no exactly: gpupool places only exactly requests")
    cls = str(exactly.get("deviceClassName") or "")
    if cls != GPU_CLASS:
        raise ClaimProblem(f"{where} asks for device class {cls!r}; gpupool places only {GPU_CLASS!r} devices "
                           "(NVIDIA's DRA driver's GPUs): another scheduler must place this pod")
    device_class = classes.get(cls)
    if device_class is None:
        raise ClaimProblem(f"{where}: DeviceClass {cls!r} does not exist (install NVIDIA's DRA driver's chart)")
    if exactly.get("adminAccess"):
        raise ClaimProblem(f"{where} asks for adminAccess, which gpupool does not grant")
    if exactly.get("capacity"):
        raise ClaimProblem(f"{where} asks for a share of a device's capacity, which gpupool does not place; "
                           "ask for whole devices (and annotation gpupool.io/gpu-fraction for a share)")
    mode = str(exactly.get("allocationMode") or "ExactCount")
    if mode == "ExactCount":
        count = int(exactly.get("count") or 1)
    elif mode == "All":
        count = 0
    else:
        raise ClaimProblem(f"{where} has allocationMode {mode!r}, not ExactCount or All")
    selectors = [str((s.get("cel") or {}).get("expression") or "")
                 for s in [*(ob.spec(device_class).get("selectors") or []), *(exactly.get("selectors") or [])]]
    for e in selectors:
        try:
            compile_selector(e)
        except SelectorError as err:
            raise ClaimProblem(f"{where}: {err}") from err
    config = tuple({"source": "FromClass", "requests": [name], "opaque": c["opaque"]}
                   for c in ob.spec(device_class).get("config") or [] if c.get("opaque"))
    return Request(claim, name, count, tuple(selectors)), config


def read_ask(pod: Obj, claims: Mapping[str, Obj], classes: Mapping[str, Obj], check: KindCheck) -> Ask | None:
    """What the pod's claims ask for; None while a template's claim is not made; raises :class:`ClaimProblem`.

    ``claims``: the pod's namespace's ResourceClaims by name; ``classes``:
    DeviceClasses by name; ``check``: the kinds of nodes and which pass
    selectors (:func:`kind_check` of every node's GPU devices).
    """
    ns, uid = ob.namespace(pod), ob.uid(pod)
    names: list[str] = []
    requests: list[Request] = []
    configs: list[tuple[str, tuple[Obj, ...]]] = []
    named = {str(c.get("name") or "") for c in ob.spec(pod).get("resourceClaims") or [] if c.get("resourceClaimName")}
    for pod_name, claim_name in claim_names(pod):
        if claim_name is None:
            return None  # the controller-manager has not made it yet: the pod is read again when it does
        claim = claims.get(claim_name)
        if claim is None and pod_name not in named:
            return None  # made from its template, named in the pod's status before the claims' watch brought it
        if claim is None:
            raise ClaimProblem(f"its claim {pod_name!r}: ResourceClaim {ns}/{claim_name} does not exist")
        if ob.being_deleted(claim):
            raise ClaimProblem(f"its ResourceClaim {ns}/{claim_name} is being deleted")
        others = [f"{r.get('resource')}/{r.get('name')}" for r in ob.status(claim).get("reservedFor") or []
                  if r.get("uid") != uid]
        if others:
            raise ClaimProblem(f"its ResourceClaim {ns}/{claim_name} is reserved for {', '.join(others)}; gpupool "
                               "does not share one claim between pods (give each pod its own, e.g. from a template)")
        devs = (ob.spec(claim).get("devices") or {})
        if devs.get("constraints"):
            raise ClaimProblem(f"its ResourceClaim {ns}/{claim_name} has constraints (matchAttribute), which "
                               "gpupool does not place by yet")
        class_config: list[Obj] = []
        for r in devs.get("requests") or []:
            req, cfg = _request(claim_name, r, classes)
            requests.append(req)
            class_config.extend(cfg)
        claim_config = [{"source": "FromClaim", **({"requests": c["requests"]} if c.get("requests") else {}),
                         "opaque": c["opaque"]} for c in devs.get("config") or [] if c.get("opaque")]
        names.append(claim_name)
        configs.append((claim_name, (*class_config, *claim_config)))
    if not requests:
        raise ClaimProblem("its ResourceClaims request no device")
    if any(r.count == 0 for r in requests) and len(requests) > 1:
        raise ClaimProblem("it has an allocationMode All request beside others; gpupool places All only alone")
    gpus, kinds = _eligible(requests, check)
    if not kinds:
        raise ClaimProblem(f"no node has {'the' if requests[0].count == 0 else 'enough'} GPU devices that all "
                           f"pass the selectors of {', '.join(f'{r.claim}/{r.name}' for r in requests)} "
                           "(gpupool places a claim on a node whose every device its selectors accept); "
                           "read again when ResourceSlices change")
    if len(kinds) > MAX_KINDS:
        raise ClaimProblem(f"its selectors accept {len(kinds)} different kinds of nodes, more than the "
                           f"{MAX_KINDS} gpupool can place by")
    return Ask(ns, tuple(names), tuple(requests), gpus, tuple(sorted(kinds)), tuple(configs))


def _eligible(requests: list[Request], check: KindCheck) -> tuple[int, set[str]]:
    """The GPU count and the node kinds that can hold it: every device of every such node passes every selector
    (a policy choosing any GPUs of an eligible node then always chooses devices the claims accept)."""
    kinds = check(frozenset(e for r in requests for e in r.selectors))
    ok = {k: good for k, (_n, good) in kinds.items()}
    size = {k: n for k, (n, _good) in kinds.items()}
    if requests[0].count == 0:  # All: every device of the node
        if not any(ok.values()):
            return 0, set()
        most = max(size[k] for k, good in ok.items() if good)
        return most, {k for k, good in ok.items() if good and size[k] == most}
    gpus = sum(r.count for r in requests)
    return gpus, {k for k, good in ok.items() if good and size[k] >= gpus}
