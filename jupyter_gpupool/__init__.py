"""jupyter-gpupool's Jupyter side: server extension, GPU kernel provisioner, widgets and magics.

The server extension (:class:`jupyter_gpupool.app.GPUPool`) is enabled by the
server-config file pip installs; ``%load_ext jupyter_gpupool`` in a kernel
loads the ``%gpupool`` magic.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"


def _jupyter_server_extension_points() -> list[dict[str, Any]]:
    """Tell Jupyter Server where the extension app lives."""
    from jupyter_gpupool.app import GPUPool

    return [{"module": "jupyter_gpupool.app", "app": GPUPool}]


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """The prebuilt Lab front end shipped in the wheel."""
    return [{"src": "labextension", "dest": "jupyter-gpupool"}]


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext jupyter_gpupool``: register the ``%gpupool`` magic."""
    from jupyter_gpupool.magics import GpupoolMagics

    ipython.register_magics(GpupoolMagics)
