"""papermill's command line, with the notebook's kernel reached over IPC sockets instead of TCP.

``python -m jupyter_gpupool.headless <papermill args>`` is what a promoted
run's runner starts (:mod:`jupyter_gpupool.runner`). papermill itself starts
the kernel with jupyter_client's defaults: ZeroMQ over TCP on loopback ports,
in plain text. ipykernel warns about exactly that at every start ("Kernel is
running over TCP without encryption ... Use IPC transport or launch with
kernel manager-provisioned CurveZMQ keys"), so every run's log carried the
warning, and any local account could connect to those ports while the run
lasted (the connection key still signs messages; nothing hides them).

papermill and its kernel always share a machine, so the kernel is reached over
Unix sockets instead (jupyter_client's ``KernelManager.transport = "ipc"``),
in a folder of its own that only the job's account may enter (mode 0700,
removed afterwards). That is papermill's own extension point: an execution
engine (the ``nbclient`` one, with that setting), registered under its name
and named with ``--engine``. Everything else is papermill's CLI unchanged.
"""

from __future__ import annotations

import os
import sys
import tempfile
from typing import Any

from papermill.cli import papermill as papermill_cli
from papermill.engines import NBClientEngine, papermill_engines
from traitlets.config import Config

ENGINE = "gpupool-ipc"
"""The engine's name for ``papermill --engine``."""


def ipc_config(folder: str) -> Config:
    """Kernel managers' settings for a kernel on IPC sockets under ``folder`` (short: a socket path has ~100 bytes)."""
    return Config({"KernelManager": {"transport": "ipc", "ip": os.path.join(folder, "kernel")}})


class IpcEngine(NBClientEngine):
    """papermill's nbclient engine with the kernel on IPC sockets in a private temporary folder."""

    @classmethod
    def execute_managed_notebook(cls, nb_man: Any, kernel_name: str, **kwargs: Any) -> Any:
        with tempfile.TemporaryDirectory(prefix="gpupool-kernel-") as folder:
            return super().execute_managed_notebook(nb_man, kernel_name, config=ipc_config(folder), **kwargs)


def main(argv: list[str] | None = None) -> int:
    """Run papermill's CLI with ``--engine gpupool-ipc`` (unless the arguments name an engine)."""
    args = list(sys.argv[1:] if argv is None else argv)
    papermill_engines.register(ENGINE, IpcEngine)
    if "--engine" not in args:
        args += ["--engine", ENGINE]
    try:
        papermill_cli.main(args=args, prog_name="papermill", standalone_mode=True)
    except SystemExit as done:
        code = done.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
