"""Kernelspecs for GPU-share kernels, made at extension load.

One kernelspec per configured fraction ("Python 3 (¼ GPU)", ...), copied from
the plain Python kernelspec with the ``gpupool-provisioner`` stanza added. They
live in the extension's own directory, which is added to the server's
``KernelSpecManager.kernel_dirs``: the Launcher shows them with no manual step,
and they disappear with the extension instead of lingering in the user's
global kernel list (they cannot work without it). The plain Python kernel is
left as it is: GPU-free.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

from jupyter_gpupool.kernel_share import fraction_label, share_request

PREFIX = "gpupool-"
PROVISIONER_NAME = "gpupool-provisioner"


def kernel_name(base: str, fraction: float) -> str:
    """Kernelspec name for a base kernel and a share, e.g. 'gpupool-python3-0.25'."""
    return f"{PREFIX}{base}-{fraction:g}"


def is_gpupool_kernel(name: str) -> bool:
    """Whether a kernelspec name is one of ours (its base kernel runs it headless)."""
    return name.startswith(PREFIX)


def base_kernel(name: str, metadata: dict[str, Any] | None = None) -> str:
    """The plain kernel behind one of our kernelspecs (itself for any other)."""
    if metadata and isinstance(metadata.get("gpupool"), dict) and metadata["gpupool"].get("base"):
        return str(metadata["gpupool"]["base"])
    if is_gpupool_kernel(name):
        rest = name[len(PREFIX) :]
        return rest.rsplit("-", 1)[0] if "-" in rest else rest
    return name


def _base_spec(kernel_spec_manager: Any, base: str) -> tuple[dict[str, Any], str | None]:
    """(kernel.json dict, resource dir) of the base kernel, or ipykernel's defaults (also without a manager)."""
    if kernel_spec_manager:
        try:
            spec = kernel_spec_manager.get_kernel_spec(base)
            return spec.to_dict(), spec.resource_dir
        except Exception:
            pass
    return (
        {
            "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3 (ipykernel)",
            "language": "python",
            "metadata": {"debugger": True},
        },
        None,
    )


def write_kernelspecs(
    directory: str | os.PathLike[str],
    fractions: list[float],
    kernel_spec_manager: Any = None,
    base: str = "python3",
) -> list[str]:
    """(Re)write our kernelspecs under ``directory``; returns their names.

    Old ``gpupool-*`` specs there are removed first so that a fraction taken out
    of the config also leaves the Launcher.
    """
    root = Path(directory)
    root.mkdir(parents=True, exist_ok=True)
    for old in root.glob(f"{PREFIX}*"):
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
    spec, resources = _base_spec(kernel_spec_manager, base)
    names = []
    for fraction in fractions:
        share_request(fraction)  # reject bad fractions with a clear message
        name = kernel_name(base, fraction)
        target = root / name
        target.mkdir()
        if resources and os.path.isdir(resources):
            for item in os.listdir(resources):
                src = os.path.join(resources, item)
                if item != "kernel.json" and os.path.isfile(src):
                    shutil.copy(src, target / item)
        metadata = dict(spec.get("metadata") or {})
        metadata["kernel_provisioner"] = {
            "provisioner_name": PROVISIONER_NAME,
            "config": {"gpu_fraction": float(fraction)},
        }
        metadata["gpupool"] = {"base": base, "gpu_fraction": float(fraction)}
        label = "Python 3" if spec.get("language") == "python" else spec.get("display_name", base)
        body = {
            "argv": spec["argv"],
            "display_name": f"{label} ({fraction_label(float(fraction))})",
            "language": spec.get("language", "python"),
            "env": spec.get("env") or {},
            "interrupt_mode": spec.get("interrupt_mode", "signal"),
            "metadata": metadata,
        }
        (target / "kernel.json").write_text(json.dumps(body, indent=1, ensure_ascii=False), encoding="utf-8")
        names.append(name)
    return names


def register_kernel_dir(kernel_spec_manager: Any, directory: str | os.PathLike[str]) -> None:
    """Put our kernelspec directory first in the server's search path (once)."""
    directory = str(directory)
    dirs = list(kernel_spec_manager.kernel_dirs)
    if directory not in dirs:
        kernel_spec_manager.kernel_dirs = [directory, *dirs]
