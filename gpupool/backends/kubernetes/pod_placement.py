"""Placement rules between a Pod's spec and a job's wire fields, both ways (pure: no API calls).

A kubectl pod's ``nodeSelector``, required and preferred node affinity and
tolerations become its job's ``node_selector``, ``node_affinity`` and
``tolerations`` (:mod:`gpupool.wire.placement`), so the policy places it only
where its kubelet will admit it. A gpupool job's own fields go the other way
into its pods, so the kubelet (and the taint manager, for ``NoExecute``) agree
with where gpupool put them.
"""

from __future__ import annotations

from typing import Any

from gpupool.backends.kubernetes import objects as ob
from gpupool.backends.kubernetes.objects import Obj

REQUIRED = "requiredDuringSchedulingIgnoredDuringExecution"
PREFERRED = "preferredDuringSchedulingIgnoredDuringExecution"


class Unsupported(ValueError):
    """A pod's placement rule gpupool cannot honour (its message says which)."""


def _expressions(term: Obj, where: str) -> list[dict[str, Any]]:
    if term.get("matchFields"):
        raise Unsupported(f"{where} uses matchFields, which gpupool does not place by (use matchExpressions "
                          "over node labels, e.g. kubernetes.io/hostname)")
    out = []
    for e in term.get("matchExpressions") or []:
        item: dict[str, Any] = {"key": str(e.get("key") or ""), "operator": str(e.get("operator") or "")}
        if e.get("values"):
            item["values"] = [str(v) for v in e["values"]]
        out.append(item)
    return out


def rules_of_pod(pod: Obj) -> dict[str, Any]:
    """The job spec fields for a pod's placement rules ({} when it has none); raises :class:`Unsupported`."""
    spec = ob.spec(pod)
    out: dict[str, Any] = {}
    if spec.get("nodeSelector"):
        out["node_selector"] = {str(k): str(v) for k, v in spec["nodeSelector"].items()}
    affinity = (spec.get("affinity") or {}).get("nodeAffinity") or {}
    required = [_expressions(t, "its required node affinity")
                for t in (affinity.get(REQUIRED) or {}).get("nodeSelectorTerms") or []]
    if any(not t for t in required):
        # Kubernetes: a term without expressions matches no node; drop it (the other terms still may match)
        required = [t for t in required if t]
        if not required:
            raise Unsupported("its required node affinity has no term with matchExpressions: no node matches it")
    preferred = [{"weight": int(p.get("weight") or 1), "match": m}
                 for p in affinity.get(PREFERRED) or []
                 if (m := _expressions(p.get("preference") or {}, "its preferred node affinity"))]
    if required or preferred:
        out["node_affinity"] = {k: v for k, v in (("required", required), ("preferred", preferred)) if v}
    tolerations = []
    for t in spec.get("tolerations") or []:
        item = {k: str(t[k]) for k in ("key", "operator", "value", "effect") if t.get(k)}
        tolerations.append(item)  # (tolerationSeconds only bounds a NoExecute eviction: placement ignores it)
    if tolerations:
        out["tolerations"] = tolerations
    return out


def pod_spec_rules(placement: dict[str, Any]) -> dict[str, Any]:
    """A job's stored placement fields as Pod spec fields: nodeSelector, affinity, extra tolerations."""
    out: dict[str, Any] = {}
    if placement.get("node_selector"):
        out["nodeSelector"] = dict(placement["node_selector"])
    affinity = placement.get("node_affinity") or {}
    node_affinity: dict[str, Any] = {}
    if affinity.get("required"):
        node_affinity[REQUIRED] = {"nodeSelectorTerms": [{"matchExpressions": list(t)} for t in affinity["required"]]}
    if affinity.get("preferred"):
        node_affinity[PREFERRED] = [{"weight": p["weight"], "preference": {"matchExpressions": list(p["match"])}}
                                    for p in affinity["preferred"]]
    if node_affinity:
        out["affinity"] = {"nodeAffinity": node_affinity}
    tolerations = [{k: v for k, v in t.items() if v} for t in placement.get("tolerations") or []]
    if tolerations:
        out["tolerations"] = tolerations
    return out
