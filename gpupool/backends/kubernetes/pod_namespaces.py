"""Which namespaces' kubectl pods gpupool queues, and which projects a pod in each may use (pure, no API calls).

A cluster's users usually create pods in their own team's namespace, not in
the scheduler's. The admin names those namespaces in the setting
``kube_pod_namespaces`` (``gpupool serve --pod-namespaces``), each with the
projects its pods may charge: the namespace is the gate, since Kubernetes
RBAC already decides who may create pods where, and a label on a pod is
whatever its author wrote. Without the setting only pods of the scheduler's
own namespace get jobs, and a pod there may use any project (who may create
pods in gpupool's namespace is trusted with every project).

Setting, as JSON: ``{"team-vision": ["vision"], "ml": ["nlp", "speech"],
"gpupool": ["*"]}``; as a flag: ``team-vision=vision;ml=nlp,speech;gpupool=*``.
A namespace ``"*"`` stands for every namespace not named; ``["*"]`` for
every project.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpupool.backends.settings import ANY, pod_namespace_rules
from gpupool.backends.settings import POD_NAMESPACES_SETTING as SETTING
from gpupool.wire.errors import InvalidRequest

__all__ = ["ANY", "SETTING", "PodNamespaces", "parse_flag"]


def parse_flag(text: str) -> dict[str, list[str]]:
    """``"team-a=vision,nlp;gpupool=*"`` -> ``{"team-a": ["vision", "nlp"], "gpupool": ["*"]}`` (checked later)."""
    out: dict[str, list[str]] = {}
    for part in (p.strip() for p in text.split(";")):
        if not part:
            continue
        ns, eq, projects = part.partition("=")
        if not eq:
            raise InvalidRequest(f"--pod-namespaces: {part!r} is not NAMESPACE=PROJECT[,PROJECT...] "
                                 "(e.g. 'team-a=vision,nlp;gpupool=*')")
        out[ns.strip()] = [p.strip() for p in projects.split(",") if p.strip()]
    if not out:
        raise InvalidRequest("--pod-namespaces is empty: give NAMESPACE=PROJECT[,PROJECT...], ';' between namespaces")
    return out


@dataclass(frozen=True)
class PodNamespaces:
    """The namespaces whose kubectl pods gpupool queues, and the projects each may use."""

    own: str
    """The scheduler's namespace (where its own job pods go)."""
    allowed: Mapping[str, frozenset[str]]
    """Namespace (or ``*``: any namespace not named) -> its projects (``*``: every project)."""

    @classmethod
    def from_setting(cls, own: str, setting: Any) -> PodNamespaces:
        """Check the setting (None: the scheduler's namespace only, any project) and build the rules."""
        return cls(own, pod_namespace_rules(own, setting))

    def takes(self, namespace: str) -> bool:
        """Whether pods of this namespace may get jobs at all (pods whose job exists are followed anyway)."""
        return namespace in self.allowed or ANY in self.allowed

    def refusal(self, namespace: str, project: str) -> str:
        """Why a pod in ``namespace`` may not run in ``project`` ("" when it may), in a user's words."""
        projects = self.allowed.get(namespace, self.allowed.get(ANY))
        if projects is None:
            named = ", ".join(sorted(self.allowed))
            return (f"gpupool takes pods only from the namespaces {named}, not from {namespace!r}; "
                    f"ask the administrator to add it ({SETTING})")
        if ANY in projects or project in projects:
            return ""
        return (f"pods in namespace {namespace!r} may use the project{'s' if len(projects) > 1 else ''} "
                f"{', '.join(sorted(projects))}, not {project!r} ({SETTING})")

    def describe(self) -> dict[str, list[str]]:
        """The rules as the setting writes them (for ``gpupool status --json``)."""
        return {ns: sorted(p) for ns, p in sorted(self.allowed.items())}
