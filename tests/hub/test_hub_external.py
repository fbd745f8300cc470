"""`gpupool serve --hub` as an *external* Hub service (started by the admin, not the Hub), as docs/jupyterhub.md says.

The Hub gives an external service no access scopes to check, so the
settings name them (``hub_access_scopes``); its token is the one given to the
Hub as the service's ``api_token``, passed as ``$JUPYTERHUB_API_TOKEN``.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from tests.api.servers import ServeProcess
from tests.hub.conftest import Hub, free_port, start_hub, stop_hub


@pytest.fixture(scope="module")
def external(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    tmp = tmp_path_factory.mktemp("hub-external")
    port, hub_port, token = free_port(), free_port(), secrets.token_hex(24)
    serve = ServeProcess(tmp / "gpupool-state", tmp, simulate="A100-80GB", admin_token="gpa_external",
                         settings={"hub": True, "hub_api_url": f"http://127.0.0.1:{hub_port}/hub/api",
                                   "hub_access_scopes": ["access:services!service=gpupool"], "hub_cache_s": 1},
                         extra_env={"JUPYTERHUB_API_TOKEN": token}).start(port)
    try:
        hub = start_hub(tmp, {}, gpupool_port=serve.port, external_token=token, hub_port=hub_port)
        try:
            yield hub
        finally:
            stop_hub(hub)
    finally:
        serve.stop()


def test_an_external_service_takes_hub_tokens_and_checks_their_access(external: Hub) -> None:
    assert external.gp("GET", "/whoami", "bob") == (200, {"user": "bob", "admin": False, "project": "nlp"})
    narrow = external.token("bob", scopes=["read:users:name!user=bob"])
    status, reply = external.gp("GET", "/whoami", token=narrow)
    assert status == 403 and "access:services!service=gpupool" in reply["error"]
