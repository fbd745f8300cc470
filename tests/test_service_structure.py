"""The service's shape: the core is parts handed what they use, not one class cut into mixins (issue 23).

Why: ``SchedulerCore`` used to inherit four mixins that borrowed ~112 attributes
from each other, typed ``Any``; a reader could not tell which part owned what.
Now each part (the book, attempts, the cycle runner, the jobs API...) is a plain
class given its collaborators in its constructor. This keeps it so: no class in
the service, the app or a backend is a mixin or is built from several project
classes (a ``Protocol`` with ``Generic`` is a type, not a mix).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "gpupool"
TYPING_BASES = {"Protocol", "Generic", "Enum", "str", "Exception", "NamedTuple", "TypedDict"}


def _classes(package: str) -> list[tuple[str, str, list[str]]]:
    out = []
    for path in sorted((ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b).split("[")[0].split(".")[-1] for b in node.bases]
                out.append((str(path.relative_to(ROOT.parent)), node.name, bases))
    return out


def test_no_mixins_in_the_service_the_app_or_the_backends() -> None:
    found = [f"{path}: class {name}({', '.join(bases)})"
             for package in ("service", "app", "backends")
             for path, name, bases in _classes(package)
             if name.endswith("Mixin") or any(b.endswith("Mixin") for b in bases)
             or len([b for b in bases if b not in TYPING_BASES]) > 1]
    assert not found, "mixed classes:\n" + "\n".join(found)


def test_the_core_is_a_plain_class() -> None:
    core = [(name, bases) for _, name, bases in _classes("service") if name == "SchedulerCore"]
    assert core == [("SchedulerCore", [])]
