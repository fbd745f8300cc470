"""Put the `gpupool` command on PATH for what the Jupyter server starts (kernels, terminals).

``scripts/run`` starts ``.venv/bin/jupyter lab`` without activating the venv,
so ``gpupool`` (installed next to the server's Python) is not on the PATH the
kernels and Lab terminals inherit, and ``!gpupool status`` fails in a notebook.
Kernels and terminals copy the server's ``os.environ`` when they start, so the
extension adds that directory to it once, at load. It goes *last*: a kernel
from another environment keeps its own ``python`` and ``pip`` first, and only
gains a ``gpupool`` it did not have.
"""

from __future__ import annotations

import os
import sys
import sysconfig
from collections.abc import MutableMapping


def cli_dir() -> str | None:
    """The directory holding this installation's ``gpupool`` script, if there is one."""
    for candidate in (os.path.dirname(sys.executable), sysconfig.get_path("scripts")):
        if candidate and any(os.path.isfile(os.path.join(candidate, name)) for name in ("gpupool", "gpupool.exe")):
            return candidate
    return None


def put_cli_on_path(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """Append :func:`cli_dir` to ``environ["PATH"]`` unless already there; returns the directory added."""
    directory = cli_dir()
    if directory is None:
        return None
    path = environ.get("PATH", "")
    if directory in path.split(os.pathsep):
        return None
    environ["PATH"] = f"{path}{os.pathsep}{directory}" if path else directory
    return directory
