"""Placement rules an admin sets per pool and per project, added to the job's own (docs/kubernetes.md).

``kube_pool_placement`` (keys ``train``, ``build``) and ``kube_project_placement``
(keys: project names) each map to ``{node_selector, node_affinity, tolerations}``
in the job spec's form. At submit they are combined with the job's own
fields, so e.g. every training job tolerates the ``dedicated=training`` taint
of the nodes set aside for training, or project vision's jobs go only to its
own nodes. Combined as Kubernetes combines rules of one pod: selectors add up
(a key set twice to two values is refused: no node could match), required
affinities must all hold (their terms are crossed), preferences and
tolerations add up. Only gpupool's own jobs get them: a kubectl pod is the
user's, and its kubelet reads its own spec alone.
"""

from __future__ import annotations

from typing import Any

from gpupool.wire.errors import InvalidRequest
from gpupool.wire.placement import MAX_RULES, check_placement, placement_of
from gpupool.wire.schemas import validate

FIELDS = ("node_selector", "node_affinity", "tolerations")


def check_placement_settings(pools: Any, projects: Any) -> None:
    """Refuse settings that are not ``{name: {node_selector?, node_affinity?, tolerations?}}`` as a job spec has."""
    for setting, value in (("kube_pool_placement", pools), ("kube_project_placement", projects)):
        if not isinstance(value, dict):
            raise InvalidRequest(f"{setting} must map names to placement rules, not {value!r}")
        for name, rules in value.items():
            if setting == "kube_pool_placement" and name not in ("train", "build"):
                raise InvalidRequest(f"kube_pool_placement: {name!r} is not a pool (train or build)")
            if not isinstance(rules, dict) or set(rules) - set(FIELDS):
                raise InvalidRequest(f"{setting}.{name} must hold only {', '.join(FIELDS)}")
            spec = {"project": "p", **rules}
            try:
                validate("JobSpec", spec, f"{setting}.{name}")
                check_placement(spec)
            except InvalidRequest as e:
                raise InvalidRequest(f"{setting}.{name}: {e}") from None


def _combine(a: dict[str, Any], b: dict[str, Any], where: str) -> dict[str, Any]:
    """Both rule sets must hold (``where`` names ``b`` in a refusal)."""
    out: dict[str, Any] = {}
    selector = dict(a.get("node_selector") or {})
    for k, v in (b.get("node_selector") or {}).items():
        if selector.get(k, v) != v:
            raise InvalidRequest(f"node_selector {k}={v} of {where} conflicts with {k}={selector[k]} set for "
                                 "this job's pool or project: no node could match both")
        selector[k] = v
    if selector:
        out["node_selector"] = dict(sorted(selector.items()))
    fa, fb = a.get("node_affinity") or {}, b.get("node_affinity") or {}
    ra, rb = fa.get("required") or [], fb.get("required") or []
    required = [[*x, *y] for x in ra for y in rb] if ra and rb else (ra or rb)
    if len(required) > MAX_RULES:
        raise InvalidRequest(f"node_affinity of {where}, combined with the pool's and project's, has "
                             f"{len(required)} required terms (at most {MAX_RULES})")
    preferred = [*(fa.get("preferred") or []), *(fb.get("preferred") or [])]
    affinity = {k: v for k, v in (("required", required), ("preferred", preferred)) if v}
    if affinity:
        out["node_affinity"] = affinity
    tolerations = list(a.get("tolerations") or [])
    tolerations += [t for t in b.get("tolerations") or [] if t not in tolerations]
    if tolerations:
        out["tolerations"] = tolerations
    return out


def with_settings(placement: dict[str, Any], pools: dict[str, Any], projects: dict[str, Any], kind: str,
                  project: str) -> dict[str, Any]:
    """The job's placement fields combined with its pool's and its project's settings (in that order)."""
    pool = "build" if kind == "build" else "train"
    out: dict[str, Any] = {}
    for where, rules in ((f"the {pool} pool", pools.get(pool)), (f"project {project}", projects.get(project))):
        if rules:
            out = _combine(out, placement_of(rules), where)
    if not out:
        return placement
    return _combine(out, placement, "the job spec")
