"""Why a training job that does not fit waits: the wording shared by the training pass and both reclaims.

Its own module because three phases say it (training, reclaim, gang
reclaim), and the reclaims are called by the training pass: the text sits
below all of them, so no phase needs to call back up into another.
"""

from __future__ import annotations

from gpupool.policy import reasons as txt
from gpupool.policy.cycle_state import CycleState
from gpupool.policy.model import TRAIN_POOL, Project, Request
from gpupool.policy.rule_reasons import kept_off_room


def no_room(state: CycleState, req: Request, p: Project, within: bool, protected: int, tried: bool) -> str:
    """Why a training job that does not fit waits.

    Its two halves are memoised apart: what does not fit (per shape, while
    the reservations stay the same) and why nothing gives way (per project
    state). Thousands of waiting jobs mix a few hundred shapes with a few
    dozen project states.
    """
    n_reserved = len(state.reserved)
    what = state.reason(("room", id(req), n_reserved), lambda: _no_room_for(state, req))
    return what + why_no_room(state, p, within, protected, tried)


def why_no_room(state: CycleState, p: Project, within: bool, protected: int, tried: bool) -> str:
    """The second half of :func:`no_room`: why nothing gives way (built once per project state)."""
    return state.reason(("why", p.name, state.usage[p.name], within, protected, tried),
                        lambda: _why_no_room(state, p, within, protected, tried))


def _no_room_for(state: CycleState, req: Request) -> str:
    base = f"no room for {txt.describe(req)} on the train pool"
    pool = state.cap.states.get(TRAIN_POOL)
    kept_off = kept_off_room(pool, req) if pool is not None else ""
    if kept_off:
        base = f"{base}: {kept_off}"
    elif req.rules is not None and req.rules.text:
        base += f" on the nodes that match {req.rules.text}"
    if state.reserved:
        base += " (reserved for starving jobs: " + ", ".join(
            f"{node} for {job}" for node, job in sorted(state.reserved.items())
        ) + ")"
    return base


def _why_no_room(state: CycleState, p: Project, within: bool, protected: int, tried: bool) -> str:
    used, guarantee = txt.gpus(state.usage[p.name]), txt.gpus(p.train_guarantee_milli)
    if not within:
        text = (
            f"; project {p.name} runs {used} of training against a guarantee of {guarantee}, "
            "so this job waits for idle GPUs"
        )
        if state.history:
            text += (
                f"; idle GPUs go first to projects that used less of their fair share lately: "
                f"project {p.name} held {txt.gpus(state.recent[p.name])} on average recently "
                f"(fair share now {txt.gpus(state.shares.get(p.name, 0.0))})"
            )
        return text
    if protected:
        return (
            f"; jobs that could be paused for it started less than "
            f"{txt.seconds(state.cfg.min_runtime_s)} ago (minimum run time)"
        )
    if tried:
        return "; pausing jobs above their guarantee would not free a node that fits it"
    return "; no other project runs above its guarantee"
