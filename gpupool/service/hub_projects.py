"""Which projects a JupyterHub user has: Hub groups become projects, a user in none gets their own.

Pure rules, no I/O, so they are read and tested apart from the Hub and the
store. A Hub group named ``<prefix><name>`` is the project ``<name>`` whose
members list is ``@<prefix><name>``: who is in it is the Hub's business, read
from the user's Hub groups at each (cached) token check, so a user removed
from the group on the Hub loses the project without anything set in gpupool.
Quotas stay gpupool's: a project made here gets the configured fields once,
and an admin changes them later as for any project.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from gpupool.service.membership import GROUP_RE
from gpupool.wire.limits import NAME_RE


@dataclass(frozen=True)
class Wanted:
    """A project a Hub user should find: its name, its members entry and the fields it is created with."""

    name: str
    members: list[str]
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class HubProjectMap:
    """The configured mapping (``hub_group_prefix``, ``hub_group_project``, ``hub_personal_project``)."""

    group_prefix: str | None = ""
    group_fields: dict[str, Any] = field(default_factory=dict)
    personal_fields: dict[str, Any] | None = None

    def group_projects(self, groups: Sequence[str]) -> list[Wanted]:
        """The projects of these Hub groups, in the Hub's order; groups that map to no valid name are left out."""
        if self.group_prefix is None:
            return []
        out = []
        for group in groups:
            if not group.startswith(self.group_prefix):
                continue
            name = group[len(self.group_prefix):]
            if NAME_RE.fullmatch(name) and GROUP_RE.fullmatch(group):  # a valid project and @group entry
                out.append(Wanted(name, [f"@{group}"], dict(self.group_fields)))
        return out

    def projects_for(self, user: str, groups: Sequence[str]) -> list[Wanted]:
        """Every project this user should find; the first is their default project.

        Their groups' projects, or, when they are in no such group and personal
        projects are on, one named after them with them as its only member.
        """
        mine = self.group_projects(groups)
        if not mine and self.personal_fields is not None and NAME_RE.fullmatch(user):
            mine = [Wanted(user, [user], dict(self.personal_fields))]
        return mine

    def default_project(self, user: str, groups: Sequence[str]) -> str | None:
        """The project a user's kernels and jobs go to unless they pick one: their first group's, or their own."""
        mine = self.projects_for(user, groups)
        return mine[0].name if mine else None
