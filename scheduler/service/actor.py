"""Who is asking the scheduler: the one value every authorization decision reads."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Actor:
    """Who is asking: a user name, whether they hold the admin token, and their groups (project membership)."""

    user: str
    admin: bool = False
    groups: frozenset[str] = frozenset()
