"""GPU kernels culled by use, in a real Jupyter server on the embedded scheduler (issue 26, item 4).

The kernel drives its own simulated use (gpupool.sim_use), and a websocket to
the kernel's channels stands for the notebook's open tab, as a browser opens
it. The project's idle rule for kernels has a 1 s window; the server gives a
3 s notice.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import time
import uuid
from typing import Any

import pytest
from test_jupyter_kernels import start_session, wait_state

from jupyter_gpupool import leases

pytestmark = pytest.mark.timeout(120)

NOTICE_S = 3.0


@pytest.fixture
def gpupool_config(gpupool_config: dict[str, Any]) -> dict[str, Any]:
    return {**gpupool_config, "idle_notice": NOTICE_S, "idle_check_interval": 0.3}


class Tab:
    """A notebook's kernel connection as a browser holds it: one websocket on /api/kernels/{id}/channels."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws
        self.session = uuid.uuid4().hex
        self.stderr: list[tuple[float, str]] = []  # (when, text) of every stderr stream message seen
        self.stdout: list[str] = []
        self._reader = asyncio.ensure_future(self._read())

    def execute(self, code: str) -> str:
        msg_id = uuid.uuid4().hex
        self.ws.write_message(json.dumps({
            "header": {"msg_id": msg_id, "msg_type": "execute_request", "session": self.session, "username": "u",
                       "version": "5.3", "date": ""},
            "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
            "content": {"code": code, "silent": False, "store_history": True, "user_expressions": {},
                        "allow_stdin": False, "stop_on_error": True}}))
        return msg_id

    async def _read(self) -> None:
        while True:
            raw = await self.ws.read_message()
            if raw is None:
                return
            if not isinstance(raw, str):
                continue
            msg = json.loads(raw)
            if msg.get("msg_type") == "stream" or msg.get("header", {}).get("msg_type") == "stream":
                content = msg["content"]
                (self.stderr if content["name"] == "stderr" else self.stdout).append(
                    (time.monotonic(), content["text"]) if content["name"] == "stderr" else content["text"])

    def close(self) -> None:
        self._reader.cancel()
        self.ws.close()


async def _until(what: str, check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.1)


async def _idle_rule(gpupool_app: Any, window_s: float) -> None:
    admin = await gpupool_app.connection.admin_client()
    await admin.set_project(gpupool_app.connection.project, idle={"build": {"window_s": window_s}})


def _notices(tab: Tab) -> list[tuple[float, str]]:
    return [(t, text) for t, text in tab.stderr if text.startswith("gpupool: this kernel's")]


async def test_a_long_cell_is_never_culled_and_an_idle_kernel_with_an_open_tab_is_after_a_notice(
    jp_fetch: Any, jp_ws_fetch: Any, jp_serverapp: Any, gpupool_app: Any
) -> None:
    session = await start_session(jp_fetch, "idle.ipynb", "gpupool-python3-0.25")
    kernel_id = session["kernel"]["id"]
    job_id = leases.held()[kernel_id].job_id
    client = await gpupool_app.connection.client()
    tab = Tab(await jp_ws_fetch("api", "kernels", kernel_id, "channels"))
    try:
        # a long cell that leaves its GPU idle, and no browser activity meanwhile
        started = time.monotonic()
        tab.execute("import gpupool, time\ngpupool.sim_use(busy=0.0)\nprint('cell started', flush=True)\n"
                    "time.sleep(16)\nprint('cell done')")
        await _until("the cell's start", lambda: "cell started\n" in tab.stdout)
        await _idle_rule(gpupool_app, window_s=1)  # the admin's short window, once the cell runs
        flagged = await _until("the scheduler's idle flag", lambda: _flag(client, job_id))
        assert flagged["idle_action"] == "cull"
        # well past window + notice, and past the 10 s a notice waits for a busy kernel: the cell still runs
        await asyncio.sleep(max(0.0, started + 13.5 - time.monotonic()))
        assert kernel_id in jp_serverapp.kernel_manager
        assert jp_serverapp.kernel_manager.get_kernel(kernel_id).execution_state == "busy"
        assert _notices(tab) == []  # no notice while a cell runs
        await _until("the cell's end", lambda: "cell done\n" in tab.stdout)
        assert kernel_id in jp_serverapp.kernel_manager  # the cell ran to its end

        # now idle, the tab still open: a notice in the kernel's output, then the shutdown
        (noticed_at, text), = await _until("the notice", lambda: _notices(tab), timeout=15)
        assert "has been idle since" in text and "shut down in 3 s" in text and "0.25 of a GPU" in text
        await _until("the cull", lambda: kernel_id not in jp_serverapp.kernel_manager, timeout=15)
        assert time.monotonic() - noticed_at >= NOTICE_S - 0.1  # the notice period was given
        assert any(t.startswith("gpupool: shutting this kernel down now") for _, t in tab.stderr)
        job = await wait_state(client, job_id, {"cancelled"}, timeout=10)
        assert job["state"] == "cancelled" and "while idle since" in job["reason"], job
        assert kernel_id not in leases.held()
        pool = await client.pool()
        assert not any(a["job_id"] == job_id for n in pool["nodes"] for g in n["gpus"] for a in g["allocations"])
    finally:
        tab.close()


async def test_a_kernel_that_uses_its_gpu_after_the_notice_is_kept(
    jp_fetch: Any, jp_ws_fetch: Any, jp_serverapp: Any, gpupool_app: Any
) -> None:
    await _idle_rule(gpupool_app, window_s=1)
    session = await start_session(jp_fetch, "kept.ipynb", "gpupool-python3-0.25")
    kernel_id = session["kernel"]["id"]
    job_id = leases.held()[kernel_id].job_id
    client = await gpupool_app.connection.client()
    tab = Tab(await jp_ws_fetch("api", "kernels", kernel_id, "channels"))
    try:
        tab.execute("import gpupool\ngpupool.sim_use(busy=0.0)")
        await _until("the notice", lambda: _notices(tab), timeout=20)
        tab.execute("gpupool.sim_use(busy=0.6)")  # the notebook uses its GPU again (a quick cell)
        await _until("the flag to clear", lambda: _cleared(client, job_id), timeout=10)
        await asyncio.sleep(NOTICE_S + 1.5)
        assert kernel_id in jp_serverapp.kernel_manager
        assert (await client.job(job_id))["state"] == "running"
    finally:
        tab.close()


async def _flag(client: Any, job_id: str) -> dict[str, Any] | None:
    job = await client.job(job_id)
    return job if job.get("idle_since") else None


async def _cleared(client: Any, job_id: str) -> bool:
    return (await client.job(job_id)).get("idle_since") is None
