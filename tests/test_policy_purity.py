"""The policy core does no I/O: checked on the source of every module in gpupool/policy.

The engine must run identically in the service, the simulator and the
benchmarks, and be deterministic; a stray import of a database, process,
network or clock module would break that quietly. This parses each module's
AST (no import side effects) and fails on any forbidden import or call.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

POLICY_DIR = Path(__file__).resolve().parent.parent / "gpupool" / "policy"

FORBIDDEN_MODULES = {
    "sqlite3", "subprocess", "os", "tornado", "kubernetes", "pynvml", "socket", "asyncio",
    "threading", "multiprocessing", "shutil", "time", "random", "urllib", "http", "requests",
    "pathlib", "io", "signal", "datetime",
}
ALLOWED_PROJECT_IMPORTS = ("gpupool.policy", "gpupool.wire.errors")
FORBIDDEN_CALLS = {"open", "input", "print", "exec", "eval", "__import__"}


def _modules() -> list[Path]:
    return sorted(POLICY_DIR.glob("*.py"))


def _violations(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import stays inside the package
                continue
            names = [node.module or ""]
        for name in names:
            top = name.split(".")[0]
            if top in FORBIDDEN_MODULES:
                found.append(f"{path.name}:{node.lineno} imports {name}")
            if top in ("gpupool", "jupyter_gpupool") and not name.startswith(ALLOWED_PROJECT_IMPORTS):
                found.append(f"{path.name}:{node.lineno} imports {name} (outside the pure core)")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in FORBIDDEN_CALLS:
            found.append(f"{path.name}:{node.lineno} calls {node.func.id}()")
    return found


def test_policy_package_has_modules() -> None:
    names = {p.name for p in _modules()}
    assert {"__init__.py", "model.py", "engine.py", "placement.py"} <= names


@pytest.mark.parametrize("path", _modules(), ids=lambda p: p.name)
def test_module_does_no_io(path: Path) -> None:
    assert _violations(path) == []


def test_checker_catches_forbidden_imports(tmp_path: Path) -> None:
    """The checker itself must be able to fail."""
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import sqlite3\nfrom subprocess import run\nimport os.path\nfrom tornado import web\n"
        "import pynvml\nfrom kubernetes import client\nfrom gpupool.service.store import Store\nopen('x')\n"
    )
    problems = _violations(bad)
    for word in ("sqlite3", "subprocess", "os.path", "tornado", "pynvml", "kubernetes", "gpupool.service.store", "open()"):
        assert any(word in p for p in problems), word


def test_no_module_of_the_policy_keeps_state_between_calls() -> None:
    """Carries from one cycle to the next live in the caller's PolicyCache (gpupool/policy/cache.py), never in a
    module: a dict, list, set or bytearray at module level would be state shared by every caller in the process."""
    import importlib
    import pkgutil

    import gpupool.policy as policy

    kept = []
    for info in pkgutil.iter_modules(policy.__path__):
        module = importlib.import_module(f"gpupool.policy.{info.name}")
        kept += [f"{info.name}.{name}" for name, value in vars(module).items()
                 if not name.startswith("__") and type(value) in (dict, list, set, bytearray)]
    assert kept == [], f"module-level mutable state in the policy: {kept}"
