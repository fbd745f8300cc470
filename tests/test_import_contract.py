"""Dependencies point one way (issue 23; the table in docs/design.md, "Package layout and the one-way imports").

Each layer of ``gpupool`` may import only the layers that table lists for it,
and ``jupyter_gpupool`` (a client of the scheduler) only its client side: the
client, the wire, the GPU environment it puts in a kernel, the simulated-GPU
spec it passes on, and the embedded scheduler it starts on one machine.
Read from each module's AST, imports inside functions included, so an import
made on one code path only is caught too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# A layer (the longest matching prefix names it) -> the gpupool layers it may import besides itself.
# Backends share gpupool.backends' own modules (the seam and helpers) but never import each other.
_BELOW_BACKENDS = ("gpupool.wire", "gpupool.policy", "gpupool.envbuilder", "gpupool.inventory", "gpupool.procstat")
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "gpupool.wire": (),
    "gpupool.procstat": (),
    "gpupool._torch_hook": (),
    "gpupool.policy": ("gpupool.wire",),
    "gpupool.envbuilder": ("gpupool.policy.model",),
    "gpupool.inventory": ("gpupool.wire",),
    "gpupool.backends": _BELOW_BACKENDS,
    "gpupool.backends.local": (*_BELOW_BACKENDS, "gpupool.backends"),
    "gpupool.backends.kubernetes": (*_BELOW_BACKENDS, "gpupool.backends"),
    "gpupool.service": (*_BELOW_BACKENDS, "gpupool.backends"),
    "gpupool.api": ("gpupool.wire", "gpupool.service"),
    "gpupool.client": ("gpupool.wire", "gpupool.procstat"),
    "gpupool.cli": ("gpupool.client", "gpupool.wire", "gpupool.procstat", "gpupool.cli.serve"),
    # The two commands that start a scheduler rather than talk to one: `gpupool serve` builds the app,
    # `gpupool node-agent` runs the Kubernetes backend's per-node agent.
    "gpupool.cli.serve": ("gpupool.cli", "gpupool.client", "gpupool.wire", "gpupool.app"),
    "gpupool.app": ("gpupool",),  # the one place that wires everything
    "gpupool.__main__": ("gpupool.cli",),
    # The package itself: only its one helper for jobs, ``gpupool.sim_use`` (the simulation hook), imported when called.
    "gpupool": ("gpupool.inventory.sim_use",),
}
EXCEPTIONS = {
    # `gpupool node-agent` is the CLI's door to the Kubernetes backend's per-node agent (imported only for it).
    ("gpupool.cli.parser", "gpupool.backends.kubernetes.node_agent"),
}

EXTENSION_MAY_IMPORT = {
    "gpupool.client", "gpupool.wire.errors", "gpupool.wire.limits", "gpupool.wire.states", "gpupool.envbuilder",
    "gpupool.inventory.simulated", "gpupool.app.embedded",
}


def imported(path: Path) -> set[str]:
    """Every module ``path`` imports, anywhere in it."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module)
    return out


def imported_names(path: Path) -> set[str]:
    """As :func:`imported`, with ``from a import b`` as ``a.b``: a submodule or a name, either is inside ``a``."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.update(f"{node.module}.{alias.name}" for alias in node.names)
    return out


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _within(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def layer_of(module: str) -> str:
    """The most specific layer of MAY_IMPORT that ``module`` belongs to."""
    return max((layer for layer in MAY_IMPORT if _within(module, layer)), key=len)


def _allows(entry: str, target: str) -> bool:
    """Whether an entry of MAY_IMPORT lets ``target`` in: a module inside it, but not one of a deeper layer.

    ``gpupool.backends`` lets in the seam and the helpers the backends share, not ``gpupool.backends.local``;
    ``gpupool`` alone (the app) lets in everything.
    """
    if entry == "gpupool":
        return True
    return _within(target, entry) and len(layer_of(target)) <= max(len(entry), len(layer_of(entry)))


def crossings(graph: Iterable[tuple[str, str]]) -> list[str]:
    """``importer -> imported`` pairs of gpupool modules that the layer table does not allow."""
    bad = []
    for importer, target in graph:
        if not _within(target, "gpupool") or target == "gpupool" or (importer, target) in EXCEPTIONS:
            continue
        layer = layer_of(importer)
        if layer_of(target) == layer:
            continue  # inside its own layer
        if not any(_allows(entry, target) for entry in MAY_IMPORT[layer]):
            bad.append(f"{importer} -> {target}")
    return sorted(bad)


def gpupool_graph() -> list[tuple[str, str]]:
    return [(module_name(path), target) for path in sorted((ROOT / "gpupool").rglob("*.py"))
            for target in imported_names(path)]


def test_gpupool_layers_import_only_what_the_design_allows() -> None:
    bad = crossings(gpupool_graph())
    assert not bad, "imports against docs/design.md's layer table:\n" + "\n".join(bad)


def test_the_checker_catches_each_kind_of_crossing() -> None:
    """The rules above can fail: each edge the table forbids is reported, each it allows is not."""
    forbidden = [
        ("gpupool.service.core", "gpupool.app.backend"),  # the service up into the wiring
        ("gpupool.service.adopted", "gpupool.backends.kubernetes.calls"),  # the service past the seam
        ("gpupool.backends.kubernetes.backend", "gpupool.service.config"),  # a backend up into the service
        ("gpupool.backends.kubernetes.gang_pods", "gpupool.backends.local.rendezvous"),  # backend to backend
        ("gpupool.backends.base", "gpupool.backends.local.executor"),  # the seam into a backend
        ("gpupool.policy.engine", "gpupool.service.store"),  # the pure policy into state
        ("gpupool.wire.schemas", "gpupool.policy.model"),
        ("gpupool.client", "gpupool.service.core"),
        ("gpupool.cli.main", "gpupool.service.core"),
    ]
    allowed = [
        ("gpupool.service.core", "gpupool.backends.base"),
        ("gpupool.backends.kubernetes.gang_pods", "gpupool.backends.rendezvous"),
        ("gpupool.app.backend", "gpupool.backends.kubernetes.backend"),
        ("gpupool.api.handlers", "gpupool.service.core"),
        ("gpupool.policy.engine", "gpupool.wire.errors"),
        ("gpupool.cli.serve", "gpupool.app.embedded"),
    ]
    assert len(crossings(forbidden)) == len(forbidden), crossings(forbidden)
    assert crossings(allowed) == []


def test_the_jupyter_extension_uses_only_the_schedulers_client_side() -> None:
    crossing = {f"{path.relative_to(ROOT)}: {module}"
                for path in sorted((ROOT / "jupyter_gpupool").glob("*.py"))
                for module in imported(path)
                if module.split(".")[0] == "gpupool" and module not in EXTENSION_MAY_IMPORT}
    assert not crossing, "jupyter_gpupool reaches into the scheduler past its client side:\n" + "\n".join(
        sorted(crossing))


def test_no_package_named_scheduler_is_left() -> None:
    """The wheel installs gpupool and jupyter_gpupool only: a top-level 'scheduler' would shadow, or be shadowed."""
    assert not (ROOT / "scheduler").exists()
    packages = (ROOT / "pyproject.toml").read_text()
    assert 'packages = ["gpupool", "jupyter_gpupool"]' in packages
