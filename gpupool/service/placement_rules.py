"""A job's stored placement fields (node_selector, node_affinity, tolerations) -> the policy's NodeRules.

The job keeps them in its ``request`` in wire form (:mod:`gpupool.wire.placement`);
the policy wants one immutable, hashable value it can key memos by. Jobs
without any get ``None``, which the policy's fast paths read as "no rules".
"""

from __future__ import annotations

from typing import Any

from gpupool.policy.node_rules import Expr, NodeRules, Term, Toleration

FIELDS = ("node_selector", "node_affinity", "tolerations")


def _term(expressions: list[dict[str, Any]]) -> Term:
    return tuple(Expr(str(e["key"]), str(e["operator"]), tuple(str(v) for v in e.get("values") or ()))
                 for e in expressions)


def rules_of(request: dict[str, Any]) -> NodeRules | None:
    """The NodeRules of a stored request, or None when it sets no placement field."""
    if not any(request.get(f) for f in FIELDS):
        return None
    affinity = request.get("node_affinity") or {}
    return NodeRules(
        selector=tuple(sorted((str(k), str(v)) for k, v in (request.get("node_selector") or {}).items())),
        required=tuple(_term(t) for t in affinity.get("required") or ()),
        tolerations=tuple(Toleration(str(t.get("key") or ""), str(t.get("operator") or "Equal"),
                                     str(t.get("value") or ""), str(t.get("effect") or ""))
                          for t in request.get("tolerations") or ()),
        preferred=tuple((int(p["weight"]), _term(p["match"])) for p in affinity.get("preferred") or ()),
    )


def placement_fields(request: dict[str, Any]) -> dict[str, Any]:
    """Just the placement fields a stored request sets (for the executor's pods)."""
    return {f: request[f] for f in FIELDS if request.get(f)}
