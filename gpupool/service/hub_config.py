"""Checks of the JupyterHub settings of :class:`ServiceConfig`, done once at start.

Kept apart from ``config.py`` so that the Hub's rules (where its API is, which
groups are projects, what a made project gets) are read in one place, and a
service started with a wrong setting stops at once with a sentence saying
which, rather than failing the first user's request.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

from gpupool.service.membership import GROUP_RE
from gpupool.wire.errors import InvalidRequest

QUOTA_FIELDS = frozenset({"build_quota", "train_guarantee", "train_limit", "weight", "idle"})
"""What a project made from a Hub group (or a personal one) may be created with (its quotas and its idle
rules, docs/policy.md "Idle GPUs"); its members come from the Hub, so they are not settable here."""


def _check_fields(name: str, value: Any, allow_none: bool) -> None:
    if value is None and allow_none:
        return
    if not isinstance(value, dict):
        raise InvalidRequest(f"{name} must be an object of project fields (build_quota, train_guarantee, "
                             f"train_limit, weight, idle){' or null' if allow_none else ''}, not {value!r}")
    unknown = sorted(set(value) - QUOTA_FIELDS)
    if unknown:
        raise InvalidRequest(f"{name}: unknown field(s) {', '.join(map(str, unknown))}; a project made from the "
                             "Hub takes build_quota, train_guarantee, train_limit, weight and idle (its members are "
                             "the Hub's)")


def check_hub_settings(config: Any) -> None:
    """Fill ``hub_api_url`` from ``$JUPYTERHUB_API_URL`` when unset, and refuse settings that cannot work."""
    if importlib.util.find_spec("jupyterhub") is None:
        raise InvalidRequest("hub is on but the jupyterhub package is missing here (its HubAuth checks the "
                             "tokens): pip install 'jupyter-gpupool[hub]'")
    if not config.hub_api_url:
        config.hub_api_url = os.environ.get("JUPYTERHUB_API_URL", "")
    url = config.hub_api_url
    if not isinstance(url, str) or not url.startswith(("http://", "https://")):
        raise InvalidRequest("hub is on but there is no Hub API URL: set hub_api_url (--hub-api-url) or "
                             "$JUPYTERHUB_API_URL, e.g. http://127.0.0.1:8081/hub/api")
    if not isinstance(config.hub_cache_s, int | float) or isinstance(config.hub_cache_s, bool) \
            or not 0 <= config.hub_cache_s <= 86400:
        raise InvalidRequest(f"hub_cache_s must be between 0 and 86400 seconds, not {config.hub_cache_s!r}")
    if not isinstance(config.hub_sync_s, int | float) or isinstance(config.hub_sync_s, bool) \
            or not 0 <= config.hub_sync_s <= 86400:
        raise InvalidRequest(f"hub_sync_s must be between 0 and 86400 seconds, not {config.hub_sync_s!r}")
    prefix = config.hub_group_prefix
    if prefix is not None and (not isinstance(prefix, str) or (prefix and not GROUP_RE.fullmatch(prefix))):
        raise InvalidRequest(f"hub_group_prefix must be '' (every group), a group name prefix, or null (no "
                             f"group is a project), not {prefix!r}")
    _check_fields("hub_group_project", config.hub_group_project, allow_none=False)
    _check_fields("hub_personal_project", config.hub_personal_project, allow_none=True)
    scopes = config.hub_access_scopes
    if scopes is not None and (not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes)):
        raise InvalidRequest(f"hub_access_scopes must be a list of JupyterHub scopes or null, not {scopes!r}")
