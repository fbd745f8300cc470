"""The policy package's shape: phases over one cycle state, calls one way, no mixins.

Why: the cycle used to be one object cut into mixin files that called each
other in a circle (issue 23). These checks keep it from growing back: no
module of gpupool/policy imports one that imports it back (directly or round
a loop), and no class there is, or derives from, a mixin.
"""

from __future__ import annotations

import ast
from pathlib import Path

POLICY = Path(__file__).resolve().parents[1] / "gpupool" / "policy"


def _imports(path: Path) -> set[str]:
    """The gpupool.policy modules that ``path`` imports at run time (``if TYPE_CHECKING:`` blocks left out)."""
    tree = ast.parse(path.read_text())
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped.update(id(n) for inner in node.body for n in ast.walk(inner))
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped or not isinstance(node, ast.ImportFrom) or not node.module:
            continue
        if node.module.startswith("gpupool.policy."):
            found.add(node.module.split(".")[2])
        elif node.module == "gpupool.policy":
            found.update(a.name for a in node.names if (POLICY / f"{a.name}.py").exists())
    return found - {path.stem}


def test_policy_modules_import_one_way() -> None:
    graph = {p.stem: _imports(p) for p in POLICY.glob("*.py") if p.stem != "__init__"}
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            raise AssertionError("import loop: " + " -> ".join(path[path.index(name):] + [name]))
        if name in done:
            return
        for dep in sorted(graph.get(name, ())):
            visit(dep, path + [name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


def test_the_cycle_phases_import_nothing_for_type_checking_only() -> None:
    """The phases and what they share state their collaborators plainly (no borrowed names behind TYPE_CHECKING)."""
    phases = ["cycle_state", "intake", "build", "build_reclaim", "training", "reclaim", "gangs", "gang_reclaim",
              "gang_setup", "gang", "gang_actions", "guarantee", "wait_reasons", "outcome", "engine"]
    for name in phases:
        text = (POLICY / f"{name}.py").read_text()
        assert "TYPE_CHECKING" not in text, name


def test_no_mixins_in_the_policy() -> None:
    for path in POLICY.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b) for b in node.bases]
                assert not node.name.endswith("Mixin"), f"{path.name}: class {node.name}"
                assert not any(b.endswith("Mixin") for b in bases), f"{path.name}: class {node.name}({bases})"
