"""Which nodes of a pool each request's placement rules allow, as masks placement can AND in.

Placement works on numpy arrays over a pool's nodes; a workload's
``nodeSelector``, required affinity and tolerations (:mod:`gpupool.policy.node_rules`)
become one boolean row per distinct rule set, computed once per node list and
kept with it across cycles (rules and labels do not change while the node
objects stay the same). With no taint that repels and no rules, every mask is
``None``: placement then does exactly what it did before rules existed, at the
same speed.
"""

from __future__ import annotations

import numpy as np

from gpupool.policy.model import Node
from gpupool.policy.node_rules import HARD_EFFECTS, NodeRules, allows, refusal, soft_score
from gpupool.policy.nodecache import for_nodes

KEEP = 1024  # rule sets remembered per node list (a queue holds a few)


class RuleMasks:
    """Per node list: the nodes each rule set allows (``None``: all of them), and its preference per node."""

    def __init__(self, nodes: tuple[Node, ...]) -> None:
        self.nodes = nodes
        self.labels = [dict(n.labels) for n in nodes]
        self.taints = [n.taints for n in nodes]
        # some node repels work that has no rules (a NoSchedule/NoExecute taint): masks are needed for all
        self.repels = any(t.effect in HARD_EFFECTS for ts in self.taints for t in ts)
        # some node has a PreferNoSchedule taint: every request weighs where it lands
        self.soft_taints = any(t.effect == "PreferNoSchedule" for ts in self.taints for t in ts)
        self._masks: dict[NodeRules | None, np.ndarray | None] = {}
        self._scores: dict[NodeRules | None, np.ndarray | None] = {}

    def mask(self, rules: NodeRules | None) -> np.ndarray | None:
        """The nodes ``rules`` allow, read-only; ``None`` when every node is allowed."""
        if rules is None and not self.repels:
            return None
        known = self._masks.get(rules, False)
        if known is not False:
            return known  # type: ignore[return-value]
        ok = np.fromiter((allows(rules, lab, tai) for lab, tai in zip(self.labels, self.taints, strict=True)),
                         dtype=bool, count=len(self.nodes))
        found = None if ok.all() else ok
        if found is not None:
            found.setflags(write=False)
        if len(self._masks) >= KEEP:
            self._masks.clear()
        self._masks[rules] = found
        return found

    def scores(self, rules: NodeRules | None) -> np.ndarray | None:
        """How much ``rules`` would rather have each node (higher first); ``None`` when all are alike."""
        if not self.soft_taints and (rules is None or not rules.preferred):
            return None
        known = self._scores.get(rules, False)
        if known is not False:
            return known  # type: ignore[return-value]
        s = np.fromiter((soft_score(rules, lab, tai) for lab, tai in zip(self.labels, self.taints, strict=True)),
                        dtype=np.int64, count=len(self.nodes))
        found = None if not len(s) or (s == s[0]).all() else s
        if len(self._scores) >= KEEP:
            self._scores.clear()
        self._scores[rules] = found
        return found

    def refusals(self, rules: NodeRules | None, rows: np.ndarray | None = None) -> list[tuple[str, str]]:
        """``(node, why not)`` for each node (of ``rows``) that ``rules`` keep the workload off."""
        idx = range(len(self.nodes)) if rows is None else (int(i) for i in rows)
        out = []
        for i in idx:
            why = refusal(rules, self.labels[i], self.taints[i])
            if why:
                out.append((self.nodes[i].name, why))
        return out


def rule_masks(nodes: tuple[Node, ...]) -> RuleMasks:
    """The pool's :class:`RuleMasks`, shared by every cycle over these node objects."""
    return for_nodes("rules", nodes, RuleMasks)


def preferred_first(scores: np.ndarray | None, tie_rank: np.ndarray) -> np.ndarray | None:
    """A tie order with the most preferred nodes first, then ``tie_rank``; None when nothing is preferred."""
    if scores is None:
        return None
    order = np.lexsort((tie_rank, -scores))
    rank = np.empty_like(order)
    rank[order] = np.arange(order.size)
    return rank


def why_excluded(rules: NodeRules | None, refused: list[tuple[str, str]], what: str) -> str:
    """One sentence for nodes ``what`` (e.g. "with room") that the rules exclude, from :meth:`RuleMasks.refusals`.

    When they all break the same rule the sentence names it once ("every node
    with room is tainted dedicated=inference:NoSchedule, which the job does not
    tolerate"); otherwise it names up to three nodes and their reasons.
    """
    if not refused:
        return ""
    whys = {why for _, why in refused}
    if len(whys) == 1:
        why = next(iter(whys))
        every = "the only node" if len(refused) == 1 else "every node"
        if why.startswith("is tainted"):
            return f"{every} {what} {why}, which the job does not tolerate"
        return f"{every} {what} {why}"
    shown = "; ".join(f"{node} {why}" for node, why in refused[:3])
    more = f" (and {len(refused) - 3} more)" if len(refused) > 3 else ""
    return f"the nodes {what} are not allowed: {shown}{more}"
