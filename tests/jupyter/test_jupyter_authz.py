"""The server's authorizer decides on resource 'gpupool': a user denied it gets 403 everywhere."""

from __future__ import annotations

import re
from typing import Any

import pytest
from jupyter_server.auth import Authorizer
from tornado.httpclient import HTTPClientError

from jupyter_gpupool.handlers import ROUTES

SAMPLE = {"job_id": "j-000001", "action": "pause", "name": "me"}


class NoGpupool(Authorizer):
    """Allows everything but the gpupool resource (a read-only or restricted role)."""

    def is_authorized(self, handler: Any, user: Any, action: str, resource: str) -> bool:
        return resource != "gpupool"


@pytest.fixture
def jp_server_config(gpupool_config: dict[str, Any]) -> dict[str, Any]:
    return {
        "ServerApp": {"jpserver_extensions": {"jupyter_gpupool": True}, "authorizer_class": NoGpupool},
        "GPUPool": gpupool_config,
    }


async def test_authorizer_denial_is_enforced_on_every_endpoint(jp_fetch: Any, fake_pool: Any) -> None:
    await jp_fetch("api", "status")  # the rest of the server still answers
    checked = 0
    for pattern, cls in ROUTES:
        path = re.sub(r"\(\?P<(\w+)>[^)]*\)", lambda m: SAMPLE[m.group(1)], pattern)
        for method in ("get", "post", "put"):
            if method not in vars(cls):
                continue
            body = b"{}" if method != "get" else None
            with pytest.raises(HTTPClientError) as info:
                await jp_fetch("gpupool", "api", *path.split("/"), method=method.upper(), body=body)
            assert info.value.code == 403, (method, path)
            checked += 1
    assert checked == len(ROUTES)
    assert fake_pool.jobs == {}
