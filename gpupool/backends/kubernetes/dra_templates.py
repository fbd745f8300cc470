"""Jobs' and JobSets' pod templates that claim GPUs through ResourceClaimTemplates (docs/kubernetes.md, DRA).

A batch Job's pods do not exist when gpupool admits the Job (it is suspended
until then), so what each pod will claim is read from the template its
``spec.resourceClaims[].resourceClaimTemplateName`` names: the same reading
as a kubectl pod's claims (:func:`.dra_claims.read_ask`: GPU count, node
kinds whose every device the selectors accept, the same :class:`ClaimProblem`
messages), over the ResourceClaimTemplates this module watches. The Job then
queues as a gang of that many GPUs per pod, on those kinds of nodes.

When the Job controller has made a pod, the controller-manager's
resourceclaim controller makes that pod's own claim from the template and
names it in ``pod.status.resourceClaimStatuses``; before the pod is bound the
GPUs the policy chose for its replica slot are written into that claim
(:meth:`.dra_allocation.DraPods.allocate`, the kubectl pods' writer). A
reclaim suspends the Job: its pods are deleted, and their claims with them.

A named claim (``resourceClaimName``) in a Job's template would be one claim
shared by every pod of the Job, which gpupool does not place: its Warning
event says so.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

from kubernetes import client

from gpupool.backends.kubernetes import objects as ob
from gpupool.backends.kubernetes.dra_allocation import DraPods
from gpupool.backends.kubernetes.dra_claims import Ask, ClaimProblem, read_ask, uses_claims
from gpupool.backends.kubernetes.dra_slices import DRA_NODE_LABEL
from gpupool.backends.kubernetes.foreign import PodRef
from gpupool.backends.kubernetes.health import Health
from gpupool.backends.kubernetes.objects import Obj
from gpupool.backends.kubernetes.watcher import ListWatch

OFF_DRA_NODES = {"key": DRA_NODE_LABEL, "operator": "DoesNotExist"}
"""A template asking for ``nvidia.com/gpu`` is kept off nodes whose GPUs come from slices (no such resource there)."""


def _template_claim_name(template: str) -> str:
    """What a template's claim is called in messages while only its template exists."""
    return f"from template {template}"


class DraTemplates:
    """Every ResourceClaimTemplate (a watch), and a pod template's claims read into a GPU count and node kinds."""

    def __init__(self, api: client.ApiClient, health: Health, pods: DraPods) -> None:
        self.pods = pods
        self._lock = threading.Lock()
        self._templates: dict[tuple[str, str], Obj] = {}
        self._marks = itertools.count(1)
        self._generation = 0
        self._started = False
        rapi = client.ResourceV1Api(api)
        self.watch = ListWatch("resourceclaimtemplates", rapi.list_resource_claim_template_for_all_namespaces,
                               self._reset, self._event, health)

    def start(self) -> None:
        """Start the watch (after the slices' start, which found out whether the API server serves DRA)."""
        self._started = self.pods.slices.served
        if not self._started:
            self.watch.synced.set()
            return
        self.watch.start()

    def close(self) -> None:
        if self._started:
            self.watch.stop(wait_s=0.5)

    def _reset(self, items: list[Obj]) -> None:
        with self._lock:
            self._templates = {(ob.namespace(t), ob.name(t)): t for t in items}
            self._generation = next(self._marks)

    def _event(self, kind: str, template: Obj) -> None:
        with self._lock:
            key = (ob.namespace(template), ob.name(template))
            if kind == "DELETED":
                self._templates.pop(key, None)
            else:
                self._templates[key] = template
            self._generation = next(self._marks)

    # ------------------------------------------------------------ reads (any thread)
    @property
    def synced(self) -> bool:
        return self.watch.synced.is_set() and self.pods.claims.synced

    def generation(self) -> tuple[int, int, int]:
        """Moves when a template, claim, class or node's devices change: Jobs that wait are read again."""
        return (self._generation, *self.pods.generation())

    def any_nodes(self) -> bool:
        """Whether some node's GPUs come from ResourceSlices."""
        return self.pods.slices.any()

    def ask(self, namespace: str, pod_template: Obj) -> Ask:
        """What each pod made from ``pod_template`` will claim; raises :class:`ClaimProblem` when gpupool cannot.

        Its templates' specs stand in for the claims the pods will get, so a
        Job is read exactly as a kubectl pod with those claims would be.
        """
        entries: list[dict[str, Any]] = []
        made: list[dict[str, Any]] = []
        claims: dict[str, Obj] = {}
        for c in ob.spec(pod_template).get("resourceClaims") or []:
            name = str(c.get("name") or "")
            if c.get("resourceClaimName"):
                raise ClaimProblem(f"its claim {name!r} names ResourceClaim {c['resourceClaimName']}, which every "
                                   "pod of it would share; gpupool gives each pod its own claim: use "
                                   "resourceClaimTemplateName")
            template = str(c.get("resourceClaimTemplateName") or "")
            with self._lock:
                found = self._templates.get((namespace, template))
            if found is None:
                raise ClaimProblem(f"its claim {name!r}: ResourceClaimTemplate {namespace}/{template} does not "
                                   "exist")
            stand_in = _template_claim_name(template)
            entries.append({"name": name, "resourceClaimTemplateName": template})
            made.append({"name": name, "resourceClaimName": stand_in})
            claims[stand_in] = {"metadata": {"name": stand_in, "namespace": namespace},
                                "spec": ob.spec(found).get("spec") or {}}
        pod = {"metadata": {"namespace": namespace, "uid": ""}, "spec": {"resourceClaims": entries},
               "status": {"resourceClaimStatuses": made}}
        ask = read_ask(pod, claims, self.pods.claims.classes(), self.pods.kinds())
        if ask is None:  # (every stand-in claim is named above)
            raise ClaimProblem("its claims could not be read")
        return ask

    def pod_ask(self, pod: Obj) -> Ask | None:
        """What an existing pod's own claims ask for (a PodGroup's member); None while its claim is not made."""
        return self.pods.ask_of(pod)

    # ------------------------------------------------------------ binding (the binder's thread)
    def allocate(self, pod: Obj, node: str, gpu_ids: list[str]) -> None:
        """Write a Job's pod's GPUs into its own claims before its binding; RuntimeError while it cannot yet."""
        if uses_claims(pod):
            self.pods.allocate(PodRef(ob.namespace(pod), ob.name(pod), ob.uid(pod)), pod, node, gpu_ids)

    def held(self, pod: Obj) -> frozenset[str]:
        """The GPU ids the pod's allocated claims hold (a restart finds which replica slot a bound pod has)."""
        return frozenset(self.pods.claimed_gpus(ob.uid(pod)))
