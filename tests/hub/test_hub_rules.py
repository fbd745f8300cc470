"""The Hub group → project rules and the Hub settings' checks (no Hub needed)."""

from __future__ import annotations

import pytest

from gpupool.service.config import ServiceConfig
from gpupool.service.hub_projects import HubProjectMap, Wanted
from gpupool.wire.errors import InvalidRequest


def test_every_group_is_a_project_in_the_hubs_order() -> None:
    rules = HubProjectMap("", {"build_quota": 1})
    assert rules.projects_for("alice", ["vision", "nlp"]) == [
        Wanted("vision", ["@vision"], {"build_quota": 1}), Wanted("nlp", ["@nlp"], {"build_quota": 1})]
    assert rules.default_project("alice", ["vision", "nlp"]) == "vision"
    assert rules.projects_for("dave", []) == [] and rules.default_project("dave", []) is None


def test_a_prefix_picks_groups_and_is_left_out_of_the_project_name() -> None:
    rules = HubProjectMap("gpu-", personal_fields={"build_quota": 0.25})
    assert rules.projects_for("alice", ["staff", "gpu-vision"]) == [Wanted("vision", ["@gpu-vision"], {})]
    # in no gpu- group: a personal project, alice its only member
    assert rules.projects_for("bob", ["staff"]) == [Wanted("bob", ["bob"], {"build_quota": 0.25})]
    # a group whose project name would be empty or invalid, or that is no valid @group entry, is no project
    assert rules.projects_for("carol", ["gpu-", "gpu-" + "x" * 70, "gpu-a b"]) == [
        Wanted("carol", ["carol"], {"build_quota": 0.25})]


def test_groups_can_be_no_projects_at_all() -> None:
    rules = HubProjectMap(None)
    assert rules.projects_for("alice", ["vision"]) == [] and rules.default_project("alice", ["vision"]) is None


def test_hub_settings_are_checked_at_start(tmp_path, monkeypatch) -> None:
    monkeypatch.delenv("JUPYTERHUB_API_URL", raising=False)
    with pytest.raises(InvalidRequest, match="no Hub API URL"):
        ServiceConfig(state_dir=tmp_path, hub=True)
    monkeypatch.setenv("JUPYTERHUB_API_URL", "http://127.0.0.1:8081/hub/api")
    assert ServiceConfig(state_dir=tmp_path, hub=True).hub_api_url == "http://127.0.0.1:8081/hub/api"
    with pytest.raises(InvalidRequest, match="its members are the Hub's"):
        ServiceConfig(state_dir=tmp_path, hub=True, hub_group_project={"members": ["x"]})
    with pytest.raises(InvalidRequest, match="hub_group_prefix"):
        ServiceConfig(state_dir=tmp_path, hub=True, hub_group_prefix="no spaces")
    with pytest.raises(InvalidRequest, match="hub_cache_s"):
        ServiceConfig(state_dir=tmp_path, hub=True, hub_cache_s=-1)
    with pytest.raises(InvalidRequest, match="hub_access_scopes"):
        ServiceConfig(state_dir=tmp_path, hub=True, hub_access_scopes="access:services")
    # off: nothing is asked of the Hub settings
    assert ServiceConfig(state_dir=tmp_path).hub is False


def test_a_hub_spawned_server_uses_its_users_hub_token_with_the_shared_scheduler() -> None:
    from jupyter_gpupool.hub import shared_scheduler_token, shared_scheduler_url

    hub_env = {"GPUPOOL_URL": "http://127.0.0.1:8765", "JUPYTERHUB_API_TOKEN": "hub-token-of-alice"}
    assert shared_scheduler_url(hub_env) == "http://127.0.0.1:8765"
    assert shared_scheduler_token(hub_env) == "hub-token-of-alice"
    # a gpupool token given on purpose wins
    assert shared_scheduler_token({**hub_env, "GPUPOOL_TOKEN": "gpu_x"}) == "gpu_x"
    # no shared scheduler: the embedded one, and the Hub's token goes nowhere
    assert shared_scheduler_url({"JUPYTERHUB_API_TOKEN": "t"}) == ""
    assert shared_scheduler_token({"JUPYTERHUB_API_TOKEN": "t"}) == ""


async def test_an_unreachable_hub_is_a_503_not_a_401(tmp_path, unused_tcp_port) -> None:
    from gpupool.api import auth
    from gpupool.app.backend import build_core
    from gpupool.wire.errors import Unauthorized, Unavailable

    core = build_core(ServiceConfig(state_dir=tmp_path, simulate="A100-80GB", hub=True, admin_token="adm",
                                       hub_api_url=f"http://127.0.0.1:{unused_tcp_port}/hub/api"))
    try:
        with pytest.raises(Unavailable, match="cannot check the token with JupyterHub"):
            await auth.authenticate(core, "token some-hub-token")
        assert (await auth.authenticate(core, "token adm")).admin  # gpupool's own tokens need no Hub
        with pytest.raises(Unauthorized):
            await auth.authenticate(core, None)
    finally:
        await core.stop()


async def test_a_hub_that_does_not_answer_is_a_503_within_the_timeout(tmp_path) -> None:
    import asyncio
    import time

    from gpupool.api import auth
    from gpupool.app.backend import build_core
    from gpupool.wire.errors import Unavailable

    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(30)  # accepts the connection, never answers

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    core = build_core(ServiceConfig(state_dir=tmp_path, simulate="A100-80GB", hub=True,
                                       hub_api_url=f"http://127.0.0.1:{port}/hub/api"))
    core.hub.timeout_s = 0.5
    try:
        t0 = time.monotonic()
        with pytest.raises(Unavailable, match="did not answer within 0.5 s"):
            await auth.authenticate(core, "token some-hub-token")
        assert time.monotonic() - t0 < 5
    finally:
        server.close()
        await core.stop()


async def test_a_group_project_whose_configured_quota_does_not_fit_is_made_without_it(tmp_path) -> None:
    from gpupool.app.backend import build_core

    core = build_core(ServiceConfig(state_dir=tmp_path, simulate="A100-80GB", hub=True,
                                       hub_api_url="http://127.0.0.1:9/hub/api",  # never asked here
                                       hub_group_project={"build_quota": 99}))
    try:
        core.hub.ensure(core.hub.map.group_projects(["vision"]))
        (vision,) = core.list_projects()
        assert (vision["name"], vision["members"], vision["build_quota"]) == ("vision", ["@vision"], 0)
    finally:
        await core.stop()


async def test_a_group_project_is_made_with_the_configured_idle_rules(tmp_path) -> None:
    """An admin who sets idle rules for the Hub's group projects finds them on each project made."""
    from gpupool.app.backend import build_core

    rules = {"train": {"action": "flag", "window_s": 7200}}
    core = build_core(ServiceConfig(state_dir=tmp_path, simulate="A100-80GB", hub=True,
                                       hub_api_url="http://127.0.0.1:9/hub/api",  # never asked here
                                       hub_group_project={"build_quota": 1, "idle": rules}))
    try:
        core.hub.ensure(core.hub.map.group_projects(["vision"]))
        (vision,) = core.list_projects()
        assert vision["idle"]["train"] == {"below_percent": 5.0, "window_s": 7200.0, "action": "flag"}
        assert vision["idle"]["build"]["action"] == "cull"  # the default stays
    finally:
        await core.stop()
