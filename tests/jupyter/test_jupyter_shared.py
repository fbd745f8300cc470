"""The extension against a shared scheduler (a URL and a user token), not the embedded one."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from tornado.httpclient import HTTPClientError

from gpupool.app.embedded import EmbeddedScheduler
from gpupool.client import AsyncGpupoolClient


@pytest_asyncio.fixture
async def shared(tmp_path: Any) -> AsyncIterator[dict[str, Any]]:
    """A scheduler 'elsewhere' (its own state dir) with a team project and a token for carol."""
    sched = EmbeddedScheduler(tmp_path / "shared-state", simulate="2xA100-80GB",
                              projects={"vision": {"build_quota": 0.5, "train_guarantee": 2}})
    await sched.start()
    admin = AsyncGpupoolClient(sched.url, sched.admin_token)
    token = (await admin.create_token("carol"))["token"]
    try:
        yield {"url": sched.url, "token": token, "sched": sched, "admin": admin}
    finally:
        await sched.stop()


@pytest.fixture
def gpupool_config(shared: dict[str, Any]) -> dict[str, Any]:
    return {"scheduler_url": shared["url"], "scheduler_token": shared["token"], "project": "vision"}


async def test_shared_scheduler_is_used_with_the_users_token(
    jp_fetch: Any, gpupool_app: Any, shared: dict[str, Any], jp_data_dir: Any
) -> None:
    status = json.loads((await jp_fetch("gpupool", "api", "status")).body)
    assert status["me"] == "carol" and status["project"] == "vision" and status["admin"] is False
    assert status["embedded"] is False and len(status["pool"]["nodes"][0]["gpus"]) == 2
    assert gpupool_app.connection.embedded is None
    assert not (jp_data_dir / "gpupool" / "state.db").exists()
    # admin-only calls are refused by the scheduler for a plain user, with its message
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("gpupool", "api", "projects", "vision", method="PUT", body=json.dumps({"build_quota": 4}))
    assert info.value.code == 403 and json.loads(info.value.response.body)["error"]
    # the scheduler goes away: a clear 503, not a 500
    await shared["sched"].stop()
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("gpupool", "api", "jobs")
    assert info.value.code == 503
    assert "cannot reach the scheduler" in json.loads(info.value.response.body)["error"]
