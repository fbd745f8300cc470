"""Where a Jupyter server finds the shared scheduler, and with which token, from its environment.

In a server that JupyterHub spawned, the Hub's config points every server at
the team's one scheduler (``GPUPOOL_URL`` in ``c.Spawner.environment``), and
the server already holds a token of its user: ``JUPYTERHUB_API_TOKEN``, which
the scheduler (``gpupool serve --hub``) takes as that Hub user. So nobody
hands out gpupool tokens, the server never holds an admin's, and it starts no
scheduler of its own that would double-book the machine's GPUs.
"""

from __future__ import annotations

from collections.abc import Mapping


def shared_scheduler_url(env: Mapping[str, str]) -> str:
    """The shared scheduler's URL from ``$GPUPOOL_URL``; '' (embedded scheduler) when unset."""
    return env.get("GPUPOOL_URL", "").strip()


def shared_scheduler_token(env: Mapping[str, str]) -> str:
    """``$GPUPOOL_TOKEN``, else, with a shared scheduler, the Hub user's own ``$JUPYTERHUB_API_TOKEN``."""
    token = env.get("GPUPOOL_TOKEN", "").strip()
    if token or not shared_scheduler_url(env):
        return token
    return env.get("JUPYTERHUB_API_TOKEN", "").strip()
