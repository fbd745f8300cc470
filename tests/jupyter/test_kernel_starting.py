"""A GPU kernel waiting for room says so: /gpupool/api/kernels lists it by notebook, with the scheduler's reason.

Lab's status bar reads this while the notebook has no kernel yet (Jupyter answers
the session's start only once the kernel runs). Real embedded scheduler, real
kernels: one simulated GPU, held by another project's training job within its
guarantee, so a ¼ GPU kernel's share queues until that job ends.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def gpupool_config(gpupool_config: dict[str, Any]) -> dict[str, Any]:
    return {**gpupool_config, "simulate": "1xA100-80GB", "kernel_start_timeout": 60.0}


async def kernels(jp_fetch: Any) -> list[dict[str, Any]]:
    return json.loads((await jp_fetch("gpupool", "api", "kernels")).body)


async def test_a_kernel_waiting_for_room_is_listed_with_why_until_it_starts(
    jp_fetch: Any, gpupool_app: Any, jp_root_dir: Any
) -> None:
    (jp_root_dir / "wait").mkdir()  # (Jupyter runs a notebook's kernel in the notebook's folder)
    admin = await gpupool_app.connection.admin_client()
    await admin.set_project("other", train_guarantee=1)
    blocker = await admin.submit({"project": "other", "command": [sys.executable, "-c", "import time; time.sleep(60)"],
                                  "gpus": 1, "name": "holds-the-gpu"})
    deadline = time.monotonic() + 20
    while (await admin.job(blocker["id"]))["state"] != "running":
        assert time.monotonic() < deadline, "the blocking training job never ran"
        await asyncio.sleep(0.2)

    body = {"path": "wait/nb.ipynb", "type": "notebook", "name": "nb.ipynb",
            "kernel": {"name": "gpupool-python3-0.25"}}
    start = asyncio.ensure_future(jp_fetch("api", "sessions", method="POST", body=json.dumps(body)))
    t0 = time.time()
    waiting: list[dict[str, Any]] = []
    deadline = time.monotonic() + 20
    while not waiting:
        assert time.monotonic() < deadline, "the starting kernel never showed on /gpupool/api/kernels"
        assert not start.done(), "the kernel started although its GPU was taken"
        waiting = [k for k in await kernels(jp_fetch) if k.get("starting")]
        await asyncio.sleep(0.2)
    (item,) = waiting
    assert item["path"] == os.path.join("wait", "nb.ipynb")
    assert item["starting"]["what"] == "share"
    assert item["job"]["state"] == "queued" and item["job"]["request"]["gpu_fraction"] == 0.25
    assert item["starting"]["reason"] == item["job"]["reason"] and item["starting"]["reason"]
    assert t0 - 5 <= item["starting"]["since"] <= time.time()
    assert item["starting"]["gives_up_at"] == pytest.approx(item["starting"]["since"] + 60.0)

    # room again: the kernel starts, holds its share, and no longer shows as starting
    await admin.cancel(blocker["id"])
    session = json.loads((await asyncio.wait_for(start, 30)).body)
    kernel_id = session["kernel"]["id"]
    (item,) = await kernels(jp_fetch)
    assert item["kernel_id"] == kernel_id and "starting" not in item and item["job"]["state"] == "running"
    await jp_fetch("api", "sessions", session["id"], method="DELETE")


async def test_a_start_that_gives_up_leaves_nothing_listed(jp_fetch: Any, gpupool_app: Any) -> None:
    admin = await gpupool_app.connection.admin_client()
    await admin.set_project("other", train_guarantee=1)
    blocker = await admin.submit({"project": "other", "command": [sys.executable, "-c", "import time; time.sleep(60)"],
                                  "gpus": 1})
    deadline = time.monotonic() + 20
    while (await admin.job(blocker["id"]))["state"] != "running":
        assert time.monotonic() < deadline
        await asyncio.sleep(0.2)
    gpupool_app.connection.settings.kernel_start_timeout = 1.5
    body = {"path": "late.ipynb", "type": "notebook", "name": "late.ipynb", "kernel": {"name": "gpupool-python3-0.25"}}
    with pytest.raises(Exception) as refused:
        await jp_fetch("api", "sessions", method="POST", body=json.dumps(body))
    assert getattr(refused.value, "code", None) == 409
    assert "after 1.5 s" in json.loads(refused.value.response.body)["message"]
    assert await kernels(jp_fetch) == []
    await admin.cancel(blocker["id"])
