"""The placement fields of a JobSpec: node_selector, node_affinity and tolerations (Kubernetes' meaning).

A job may say which nodes it may run on and which node taints it accepts, as
a Kubernetes pod does; gpupool's policy places it only there and its pods
carry the same rules (docs/kubernetes.md, "Placement rules"). The shapes are
JSON Schema (in the OpenAPI document through :mod:`gpupool.wire.schemas`);
what one field's schema cannot say (an ``Exists`` toleration has no value,
``Gt`` takes one integer) is checked by :func:`check_placement`, so a bad rule
is a 400 naming it rather than a pod the API server refuses later.
"""

from __future__ import annotations

import re
from typing import Any

from gpupool.wire.errors import InvalidRequest

MAX_RULES = 64  # selector pairs, tolerations, terms, expressions per term, values per expression
# A label key: an optional DNS-subdomain prefix and "/", then a name of 1-63 characters; a value: 0-63.
LABEL_NAME = r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?"
LABEL_KEY = rf"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?{LABEL_NAME}$"
LABEL_VALUE = rf"^({LABEL_NAME})?$"
OPERATORS = ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"]
EFFECTS = ["NoSchedule", "PreferNoSchedule", "NoExecute"]

_KEY = {"type": "string", "maxLength": 317, "pattern": LABEL_KEY}
_VALUE = {"type": "string", "maxLength": 63, "pattern": LABEL_VALUE}

EXPRESSION: dict[str, Any] = {
    "type": "object", "required": ["key", "operator"], "additionalProperties": False,
    "properties": {"key": _KEY, "operator": {"type": "string", "enum": OPERATORS},
                   "values": {"type": "array", "maxItems": MAX_RULES, "items": _VALUE}},
}
_TERM: dict[str, Any] = {"type": "array", "minItems": 1, "maxItems": MAX_RULES, "items": EXPRESSION}

NODE_SELECTOR: dict[str, Any] = {
    "type": "object", "nullable": True, "maxProperties": MAX_RULES,
    "propertyNames": {"maxLength": 317, "pattern": LABEL_KEY}, "additionalProperties": _VALUE,
    "description": "Node labels the job's nodes must carry (Kubernetes nodeSelector): every pair must match.",
}

NODE_AFFINITY: dict[str, Any] = {
    "type": "object", "nullable": True, "additionalProperties": False,
    "description": "Node affinity over node labels, as Kubernetes means it. `required`: terms, ORed, each a "
                   "list of expressions that must all match ({key, operator: In|NotIn|Exists|DoesNotExist|Gt|Lt, "
                   "values}). `preferred`: {weight 1-100, match: [expressions]}; among places the scheduler scores "
                   "alike, the node with the largest sum of matching weights wins.",
    "properties": {
        "required": {"type": "array", "maxItems": MAX_RULES, "items": _TERM},
        "preferred": {"type": "array", "maxItems": MAX_RULES, "items": {
            "type": "object", "required": ["weight", "match"], "additionalProperties": False,
            "properties": {"weight": {"type": "integer", "minimum": 1, "maximum": 100}, "match": _TERM}}},
    },
}

TOLERATIONS: dict[str, Any] = {
    "type": "array", "nullable": True, "maxItems": MAX_RULES,
    "description": "Node taints the job accepts (Kubernetes tolerations): a NoSchedule or NoExecute taint keeps "
                   "a job off its node unless one matches (same key, or no key with Exists; same value unless "
                   "Exists; same effect, or none for every effect).",
    "items": {"type": "object", "additionalProperties": False, "properties": {
        "key": {"type": "string", "maxLength": 317, "pattern": f"^$|{LABEL_KEY}"},
        "operator": {"type": "string", "enum": ["Equal", "Exists"]},
        "value": _VALUE,
        "effect": {"type": "string", "enum": ["", *EFFECTS]}}},
}

SELECTOR_RULE = "node_selector must map label keys to label values (at most 63 of letters, digits, -_.)"
AFFINITY_RULE = ("node_affinity must be {required: [[expression, ...], ...], preferred: [{weight: 1-100, "
                 "match: [expression, ...]}]}, an expression being {key, operator, values}")
TOLERATIONS_RULE = ("tolerations must be a list of {key, operator: Equal|Exists, value, effect: "
                    "NoSchedule|PreferNoSchedule|NoExecute}")


def _check_expression(e: dict[str, Any], where: str) -> None:
    op, values = e["operator"], e.get("values") or []
    if op in ("In", "NotIn") and not values:
        raise InvalidRequest(f"{where}: {e['key']} {op} needs at least one value")
    if op in ("Exists", "DoesNotExist") and values:
        raise InvalidRequest(f"{where}: {e['key']} {op} takes no values")
    if op in ("Gt", "Lt"):
        if len(values) != 1 or not re.fullmatch(r"-?[0-9]{1,18}", values[0]):
            raise InvalidRequest(f"{where}: {e['key']} {op} takes exactly one whole number")


def check_placement(spec: dict[str, Any]) -> None:
    """What the schema cannot say about a (schema-valid) spec's placement fields; raise InvalidRequest."""
    affinity = spec.get("node_affinity") or {}
    for i, term in enumerate(affinity.get("required") or []):
        for e in term:
            _check_expression(e, f"node_affinity.required.{i}")
    for i, pref in enumerate(affinity.get("preferred") or []):
        for e in pref["match"]:
            _check_expression(e, f"node_affinity.preferred.{i}")
    for i, t in enumerate(spec.get("tolerations") or []):
        op = t.get("operator", "Equal")
        if op == "Exists" and t.get("value"):
            raise InvalidRequest(f"tolerations.{i}: an Exists toleration has no value")
        if not t.get("key") and op != "Exists":
            raise InvalidRequest(f"tolerations.{i}: a toleration without a key must use operator Exists")


def placement_of(spec: dict[str, Any]) -> dict[str, Any]:
    """The placement fields a (checked) spec sets, normalised, for the job's stored request ({} when none)."""
    out: dict[str, Any] = {}
    if spec.get("node_selector"):
        out["node_selector"] = dict(sorted(spec["node_selector"].items()))
    affinity = {k: v for k, v in (spec.get("node_affinity") or {}).items() if v}
    if affinity:
        out["node_affinity"] = affinity
    if spec.get("tolerations"):
        out["tolerations"] = [{"key": t.get("key", ""), "operator": t.get("operator", "Equal"),
                               "value": t.get("value", ""), "effect": t.get("effect", "")}
                              for t in spec["tolerations"]]
    return out
