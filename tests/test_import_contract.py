"""Dependencies point one way (issue 23): the Jupyter extension reaches the scheduler only through its client side.

``jupyter_gpupool`` is a client of the scheduler. It may use the client, the
wire's shared rules (limits, body decoding), the errors, the GPU environment
it puts in a kernel, the simulated-GPU spec it passes on, and the embedded
scheduler it starts on one machine; never the service's, the API's, the
policy's or a backend's insides. Read from each module's AST (imports inside
functions included), so an import made only on one code path is caught too.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

EXTENSION_MAY_IMPORT = {
    "gpupool.client", "gpupool.wire.errors", "gpupool.wire.limits", "gpupool.envbuilder",
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


def test_the_jupyter_extension_uses_only_the_schedulers_client_side() -> None:
    crossing = {f"{path.relative_to(ROOT)}: {module}"
                for path in sorted((ROOT / "jupyter_gpupool").glob("*.py"))
                for module in imported(path)
                if module.split(".")[0] == "gpupool" and module not in EXTENSION_MAY_IMPORT}
    assert not crossing, "jupyter_gpupool reaches into the scheduler past its client side:\n" + "\n".join(
        sorted(crossing))


def test_the_wire_rules_depend_on_nothing_of_the_scheduler_but_its_errors() -> None:
    assert {m for m in imported(ROOT / "gpupool" / "wire" / "limits.py") if m.startswith("gpupool")} == {"gpupool.wire.errors"}
