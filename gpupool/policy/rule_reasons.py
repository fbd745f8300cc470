"""Why placement rules keep work off nodes, in the words a waiting or refused job's reason uses.

A job whose nodeSelector no node matches, or whose only fitting nodes are
tainted, must say so: "no room" would send its owner looking at the queue
instead of at the rule. Built once per request shape (callers memoise), never
on the hot path.
"""

from __future__ import annotations

import numpy as np

from gpupool.policy import reasons as txt
from gpupool.policy.model import Request
from gpupool.policy.placement import FreeState
from gpupool.policy.placement_rules import why_excluded


def _ruled(state: FreeState, req: Request) -> bool:
    return req.rules is not None or state.rules.repels


def never_fits(state: FreeState, pool: str, req: Request) -> str:
    """Why ``req`` fits no node of ``pool`` even empty, when its rules are the cause; "" otherwise.

    E.g. "no node of the train pool matches nodeSelector gpu=h100", or "every
    node of the train pool that could hold 1 whole GPU is tainted
    dedicated=inference:NoSchedule, which the job does not tolerate".
    """
    if not _ruled(state, req):
        return ""
    capable = state.rows_fitting(req, empty=True, ruled=False).nonzero()[0]
    if not capable.size:
        return ""  # too big for any node: the rules are not why
    rules = req.rules
    what = f"of the {pool} pool that could hold {txt.describe(req)}"
    if rules is not None and rules.text:
        labels = state.rules.labels
        if not any(rules.allows_labels(lab) for lab in labels):
            return f"no node of the {pool} pool matches {rules.text}"
        matching = [i for i in capable if rules.allows_labels(labels[int(i)])]
        if not matching:
            return f"no node {what} matches {rules.text}"
        capable, what = np.asarray(matching), f"of the {pool} pool that matches {rules.text}"
    return why_excluded(rules, state.rules.refusals(rules, capable), what)


def kept_off_room(state: FreeState, req: Request) -> str:
    """When nodes with room now are ones ``req``'s rules keep it off: why, e.g. "every node with room is
    tainted dedicated=inference:NoSchedule, which the job does not tolerate"; "" otherwise."""
    if not _ruled(state, req):
        return ""
    with_room = state.rows_fitting(req, empty=False, ruled=False).nonzero()[0]
    if not with_room.size:
        return ""
    return why_excluded(req.rules, state.rules.refusals(req.rules, with_room), "with room")
