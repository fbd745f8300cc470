"""Project membership: who may put work into a project.

A project's ``members`` is either ``None`` (open: any authenticated user may
submit into it, so a single-user setup needs no configuration) or a list of
entries set by an admin: a user name (``alice``) or a group (``@ml-team``).
A user name starts with a letter or digit, so the ``@`` cannot be confused
with one. Admins may use every project.

A user's groups come from where the user comes from: for a gpupool token, the
Unix groups of the account of the same name on this machine (when there is
one), looked up when the token is checked and kept for a minute, so a change in
``/etc/group`` is seen without a restart; for a JupyterHub token, the user's
Hub groups, as the Hub reports them (:mod:`gpupool.service.hub`, cached
``hub_cache_s``).
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import time
from collections.abc import Iterable
from typing import Any

from gpupool.wire.errors import InvalidRequest

MAX_MEMBERS = 1000
GROUP_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,63}")
_GROUPS_TTL_S = 60.0
_groups_cache: dict[str, tuple[float, frozenset[str]]] = {}


def validate_members(value: Any, check_user: Any) -> list[str] | None:
    """``null`` (open project) or a list of user names and ``@group`` entries; sorted, without repeats."""
    if value is None:
        return None
    if not isinstance(value, list):
        raise InvalidRequest("members must be a list of user names and @groups, or null for an open project")
    if len(value) > MAX_MEMBERS:
        raise InvalidRequest(f"members may list at most {MAX_MEMBERS} users and groups, not {len(value)}")
    out = set()
    for entry in value:
        if isinstance(entry, str) and entry.startswith("@"):
            if not GROUP_RE.fullmatch(entry[1:]):
                raise InvalidRequest(f"member {entry!r}: group names are 1-64 letters, digits, '.', '_' or '-' "
                                     "after the '@'")
            out.add(entry)
        else:
            try:
                out.add(check_user(entry))
            except InvalidRequest as e:
                raise InvalidRequest(f"member {entry!r}: {e.message}") from None
    return sorted(out)


def unix_groups(user: str) -> frozenset[str]:
    """The Unix groups of the account named ``user`` (primary included); empty when there is no such account."""
    now = time.monotonic()
    hit = _groups_cache.get(user)
    if hit is not None and now - hit[0] < _GROUPS_TTL_S:
        return hit[1]
    try:
        account = pwd.getpwnam(user)
        gids = os.getgrouplist(user, account.pw_gid)
    except (KeyError, OSError):
        groups: frozenset[str] = frozenset()
    else:
        names = set()
        for gid in gids:
            try:
                names.add(grp.getgrgid(gid).gr_name)
            except KeyError:
                continue
        groups = frozenset(names)
    _groups_cache[user] = (now, groups)
    return groups


def is_member(members: Iterable[str] | None, user: str, groups: Iterable[str]) -> bool:
    """Whether ``user`` (in ``groups``) is on a members list; an open project (``None``) has everyone."""
    if members is None:
        return True
    listed = set(members)
    return user in listed or any(f"@{g}" in listed for g in groups)
