"""JupyterHub users as the scheduler's users: a Hub API token is the Hub user it belongs to.

A team's Hub already knows who everyone is, which groups they are in and who
administers it; asking the Hub spares the admin a second list of users and
tokens. The check is JupyterHub's own client, :class:`HubAuth`
(``GET <hub api>/user`` with the token, answers cached ``hub_cache_s``), not a
reimplementation of the Hub's auth. Its reply gives:

- the user name (jobs are owned by it; a root service runs them as the Unix
  account of that name),
- ``admin``: Hub admins are scheduler admins,
- ``groups``: the user's groups for ``@group`` members entries, and the
  projects made from them (:mod:`gpupool.service.hub_projects`).

When the scheduler runs as a Hub service (``JUPYTERHUB_OAUTH_ACCESS_SCOPES``
set by the Hub, or ``hub_access_scopes``), a token must also carry access to
it (``access:services!service=<name>``), as for any Hub service: a token a
user made for something narrower does not reach the GPUs.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from gpupool.service.actor import Actor
from gpupool.service.hub_projects import HubProjectMap, Wanted
from gpupool.service.validation import validate_user
from gpupool.wire.errors import Forbidden, InvalidRequest, Unauthorized, Unavailable

log = logging.getLogger("gpupool.hub")

MAX_TOKEN = 512


def make_hub_auth(config: Any) -> Any:
    """JupyterHub's HubAuth for ``config``: its API URL, cache age and access scopes; the service's own
    token comes from ``$JUPYTERHUB_API_TOKEN`` (what the Hub gives a managed service)."""
    from jupyterhub.services.auth import HubAuth

    kwargs: dict[str, Any] = {"api_url": config.hub_api_url, "cache_max_age": int(config.hub_cache_s)}
    if config.hub_access_scopes is not None:
        kwargs["access_scopes"] = set(config.hub_access_scopes)
    return HubAuth(**kwargs)


class HubIdentity:
    """Turns Hub tokens into Actors for one core, and makes sure each user's Hub projects exist."""

    timeout_s = 10.0
    """How long a request waits on the Hub before it is a 503 (HubAuth's own client would wait minutes)."""

    def __init__(self, core: Any, hub_auth: Any = None) -> None:
        config = core.config
        self.core = core
        self.auth = hub_auth if hub_auth is not None else make_hub_auth(config)
        self.map = HubProjectMap(config.hub_group_prefix, dict(config.hub_group_project),
                                 None if config.hub_personal_project is None else dict(config.hub_personal_project))
        self.admin_user = config.admin_user

    async def actor(self, token: str) -> Actor | None:
        """The Hub user of ``token``; None when the Hub does not know it.

        Raises Unauthorized/Forbidden, with the reason, for a token the Hub knows
        but that may not act here, and Unavailable when the Hub cannot be asked.
        """
        if not isinstance(token, str) or not token or len(token) > MAX_TOKEN:
            return None
        model = await self._model(token)
        if model is None:
            return None
        if model.get("kind", "user") != "user":
            raise Unauthorized(f"this is the JupyterHub token of {model.get('kind')} {model.get('name')!r}, "
                               "not of a user; send a user's token")
        access = self.auth.access_scopes
        if access and not self.auth.check_scopes(access, {"scopes": model.get("scopes") or []}):
            raise Forbidden(f"this JupyterHub token of {model.get('name')!r} lacks access to the GPU pool "
                            f"(one of the scopes {', '.join(sorted(access))}); see docs/jupyterhub.md")
        name = self._user_name(model.get("name"))
        groups = [g for g in model.get("groups") or [] if isinstance(g, str)]
        wanted = self.map.projects_for(name, groups)
        self.ensure(wanted)
        return Actor(name, bool(model.get("admin")), frozenset(groups), wanted[0].name if wanted else None)

    async def _model(self, token: str) -> dict[str, Any] | None:
        """The Hub's user model for the token (cached by HubAuth, misses included), or None."""
        from tornado.web import HTTPError

        try:
            model = await asyncio.wait_for(self.auth.user_for_token(token, sync=False), self.timeout_s)
        except asyncio.TimeoutError:
            raise Unavailable(f"JupyterHub at {self.auth.api_url} did not answer within {self.timeout_s:g} s "
                              "to check the token") from None
        except HTTPError as e:
            # HubAuth says 500 for "cannot reach the Hub" and 502 for a failing Hub: neither is our bug.
            raise Unavailable(f"cannot check the token with JupyterHub at {self.auth.api_url}: "
                              f"{e.log_message or e.reason or e}") from None
        return model if isinstance(model, dict) else None

    def _user_name(self, name: Any) -> str:
        """The Hub user name as a gpupool user, or Forbidden: it owns jobs, so it must be a plain name
        that is not the admin token's (whose jobs it would own)."""
        try:
            name = validate_user(name)
        except InvalidRequest:
            raise Forbidden(f"the JupyterHub user name {name!r} cannot be a gpupool user (letters, digits, "
                            "'.', '_', '@' or '-', starting with a letter or digit)") from None
        if name == self.admin_user:
            raise Forbidden(f"the JupyterHub user {name!r} has the name of this scheduler's admin token; rename "
                            "one of them (admin_user in the service config)")
        return name

    def ensure(self, wanted: list[Wanted]) -> None:
        """Create the projects a Hub user should find and that do not exist yet (existing ones are the admin's)."""
        if not wanted:
            return
        existing = self.core.book.projects()  # the core's cached dict: no store read per request
        admin = Actor(self.admin_user, admin=True)
        for project in wanted:
            if project.name in existing:
                continue
            fields: dict[str, Any] = {**project.fields, "members": project.members}
            try:
                self.core.set_project(admin, project.name, fields)
            except InvalidRequest as e:  # e.g. a configured quota bigger than this pool
                log.error("hub project %s: the configured fields %s are refused (%s); made without them",
                          project.name, project.fields, e.message)
                try:
                    self.core.set_project(admin, project.name, {"members": project.members})
                except InvalidRequest as again:  # never the user's fault: their request goes on without it
                    log.error("hub project %s not made: %s", project.name, again.message)
                    continue
            log.info("project %s made from JupyterHub (members %s)", project.name, ", ".join(project.members))
