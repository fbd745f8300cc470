"""Hub groups made projects up front: the service lists the Hub's groups with its own token.

Projects from groups are otherwise made when a member first reaches the
scheduler; listing them at start (and every ``hub_sync_s``) lets an admin set
a group's quotas before any of its members logs in. It uses the Hub's
documented REST API (``GET /hub/api/groups``, paginated) with the service's
``JUPYTERHUB_API_TOKEN``, which needs the scopes ``list:groups`` and
``read:groups:name`` (a role for the service in ``jupyterhub_config.py``).
Without them the service says so once and goes on making projects on first use.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from tornado.httpclient import AsyncHTTPClient
from tornado.httputil import url_concat

from gpupool.wire.errors import Forbidden, Unavailable

log = logging.getLogger("gpupool.hub")

PAGE = 200  # the Hub's default most items per page
PAGINATED = "application/jupyterhub-pagination+json"


async def list_hub_groups(api_url: str, token: str) -> list[str]:
    """Every group name on the Hub, following its pages; Forbidden without the scopes, Unavailable otherwise."""
    client = AsyncHTTPClient()
    names: list[str] = []
    offset = 0
    while True:
        url = url_concat(api_url.rstrip("/") + "/groups", {"offset": str(offset), "limit": str(PAGE)})
        try:
            reply = await client.fetch(url, headers={"Authorization": f"token {token}", "Accept": PAGINATED},
                                       raise_error=False, request_timeout=30)
        except OSError as e:
            raise Unavailable(f"cannot list the Hub's groups at {api_url}: {e}") from None
        if reply.code == 403:
            raise Forbidden("the service's Hub token may not list groups (scopes list:groups, read:groups:name)")
        if reply.code != 200:
            raise Unavailable(f"the Hub answered {reply.code} to listing its groups at {api_url}")
        page = json.loads(reply.body)
        items = page.get("items", []) if isinstance(page, dict) else page
        names += [g["name"] for g in items if isinstance(g, dict) and isinstance(g.get("name"), str)]
        following = page.get("_pagination", {}).get("next") if isinstance(page, dict) else None
        if not items or not following:
            return names
        offset = int(following.get("offset", offset + len(items)))


async def sync_groups_forever(identity: Any, every: float) -> None:
    """Make the projects of the Hub's groups now, then every ``every`` seconds (0: once)."""
    token = identity.auth.api_token
    if not token:
        log.info("no JUPYTERHUB_API_TOKEN for the service: group projects are made when a member first comes")
        return
    while True:
        try:
            names = await list_hub_groups(identity.auth.api_url, token)
            identity.ensure(identity.map.group_projects(names))
        except Forbidden as e:
            log.info("%s; group projects are made when a member first comes (docs/jupyterhub.md)", e.message)
            return
        except Unavailable as e:
            log.warning("%s; trying again in %.0f s", e.message, every or 60)
        if not every:
            return
        await asyncio.sleep(every)
