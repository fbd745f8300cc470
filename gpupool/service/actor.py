"""Who is asking the scheduler: the one value every authorization decision reads."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Actor:
    """Who is asking: a user name, whether they hold the admin token, and their groups (project membership).

    ``project``: the project their work goes to unless they name one, when where they come from says
    (a JupyterHub user's first group); None leaves it to the client.
    """

    user: str
    admin: bool = False
    groups: frozenset[str] = frozenset()
    project: str | None = None
