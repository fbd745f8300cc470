"""Node placement rules: node labels and taints against a workload's selector, affinity and tolerations.

Kubernetes lets a pod say where it may run (``nodeSelector``, required node
affinity), where it would rather run (preferred node affinity) and which
node taints it accepts (tolerations). A scheduler that ignores them binds
pods to nodes their kubelet refuses, or puts training on nodes an admin set
aside. This module is the pure matcher the policy filters candidate nodes
with: immutable values (hashable, since the policy memoises by request) and
functions of them, nothing else. The semantics are Kubernetes' own:

* ``nodeSelector``: every pair must equal a node label;
* required affinity: its terms are ORed, a term's expressions ANDed (a term
  with no expression matches no node); operators ``In``, ``NotIn``,
  ``Exists``, ``DoesNotExist``, ``Gt``, ``Lt`` (integers) over node labels;
* taints: ``NoSchedule`` and ``NoExecute`` keep a workload off unless one of
  its tolerations matches (same key, or an empty key with ``Exists``; same
  value unless ``Exists``; same effect, or none); ``PreferNoSchedule`` only
  weighs, like preferred affinity (sum of the weights of matching terms).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

OPERATORS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")
EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
HARD_EFFECTS = ("NoSchedule", "NoExecute")


@dataclass(frozen=True)
class Taint:
    """A node taint: ``key=value:effect``."""

    key: str
    value: str = ""
    effect: str = "NoSchedule"

    @property
    def text(self) -> str:
        return f"{self.key}={self.value}:{self.effect}" if self.value else f"{self.key}:{self.effect}"


@dataclass(frozen=True)
class Toleration:
    """A workload's toleration; ``effect`` "" tolerates every effect, ``key`` "" with Exists every key."""

    key: str = ""
    operator: str = "Equal"  # Equal | Exists
    value: str = ""
    effect: str = ""

    def tolerates(self, taint: Taint) -> bool:
        if self.effect and self.effect != taint.effect:
            return False
        if not self.key:
            return self.operator == "Exists"
        if self.key != taint.key:
            return False
        return self.operator == "Exists" or self.value == taint.value


@dataclass(frozen=True)
class Expr:
    """One match expression over node labels: ``key operator values``."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        op, value = self.operator, labels.get(self.key)
        if op == "In":
            return value is not None and value in self.values
        if op == "NotIn":
            return value is None or value not in self.values
        if op == "Exists":
            return value is not None
        if op == "DoesNotExist":
            return value is None
        if value is None or len(self.values) != 1:
            return False
        try:
            have, bound = int(value), int(self.values[0])
        except ValueError:
            return False
        return have > bound if op == "Gt" else have < bound if op == "Lt" else False

    @property
    def text(self) -> str:
        if self.operator in ("Exists", "DoesNotExist"):
            return f"{self.key} {self.operator}"
        return f"{self.key} {self.operator} {','.join(self.values)}"


Term = tuple[Expr, ...]
"""Expressions that must all match (a nodeSelectorTerm)."""


def term_matches(term: Term, labels: Mapping[str, str]) -> bool:
    return bool(term) and all(e.matches(labels) for e in term)


@dataclass(frozen=True)
class NodeRules:
    """Where a workload may and would rather run; ``None`` on a request means no rules at all.

    ``selector``: sorted ``(key, value)`` pairs; ``required``: terms, ORed
    (empty: no required affinity); ``preferred``: ``(weight, term)`` pairs.
    """

    selector: tuple[tuple[str, str], ...] = ()
    required: tuple[Term, ...] = ()
    tolerations: tuple[Toleration, ...] = ()
    preferred: tuple[tuple[int, Term], ...] = ()

    def allows_labels(self, labels: Mapping[str, str]) -> bool:
        """Whether ``nodeSelector`` and required affinity let the workload onto a node with these labels."""
        if any(labels.get(k) != v for k, v in self.selector):
            return False
        return not self.required or any(term_matches(t, labels) for t in self.required)

    def preference(self, labels: Mapping[str, str]) -> int:
        """Sum of the weights of the preferred terms a node with these labels matches."""
        return sum(w for w, t in self.preferred if term_matches(t, labels))

    @property
    def selector_text(self) -> str:
        return ",".join(f"{k}={v}" for k, v in self.selector)

    @property
    def required_text(self) -> str:
        return " or ".join("(" + " and ".join(e.text for e in t) + ")" for t in self.required)

    @property
    def text(self) -> str:
        """The rules a node must meet, as a reason names them (tolerations aside)."""
        parts = []
        if self.selector:
            parts.append(f"nodeSelector {self.selector_text}")
        if self.required:
            parts.append(f"required node affinity {self.required_text}")
        return " and ".join(parts)


def untolerated(tolerations: tuple[Toleration, ...], taints: tuple[Taint, ...], effects: tuple[str, ...]
                ) -> tuple[Taint, ...]:
    """The taints of ``effects`` that no toleration matches."""
    return tuple(t for t in taints if t.effect in effects and not any(o.tolerates(t) for o in tolerations))


def allows(rules: NodeRules | None, labels: Mapping[str, str], taints: tuple[Taint, ...]) -> bool:
    """Whether a workload with ``rules`` may be placed on a node with these labels and taints."""
    if rules is None:
        return not any(t.effect in HARD_EFFECTS for t in taints)
    return rules.allows_labels(labels) and not untolerated(rules.tolerations, taints, HARD_EFFECTS)


def refusal(rules: NodeRules | None, labels: Mapping[str, str], taints: tuple[Taint, ...]) -> str:
    """Why a node is not allowed ("" when it is): the first rule it breaks, as a reason names it."""
    if rules is not None and not rules.allows_labels(labels):
        return f"does not match {rules.text}"
    hard = untolerated(rules.tolerations if rules is not None else (), taints, HARD_EFFECTS)
    if hard:
        return f"is tainted {', '.join(t.text for t in hard)}"
    return ""


def soft_score(rules: NodeRules | None, labels: Mapping[str, str], taints: tuple[Taint, ...]) -> int:
    """How much a workload would rather run on a node: preferred affinity, less untolerated PreferNoSchedule.

    Each untolerated ``PreferNoSchedule`` taint counts as much as the largest
    preference weight (100), so it outweighs any single preferred term.
    """
    score = rules.preference(labels) if rules is not None else 0
    soft = untolerated(rules.tolerations if rules is not None else (), taints, ("PreferNoSchedule",))
    return score - 100 * len(soft)
