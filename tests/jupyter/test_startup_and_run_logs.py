"""What the logs tell a user (issue 22, item 13): the server's start-up log says the GPUs are
simulated, and a promoted run's log has no warning about its own kernel's transport."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import nbformat
import pytest

from tests.jupyter.server_process import start_server

pytestmark = pytest.mark.timeout(240)

SIMULATED_LINE = "gpupool: the GPUs are SIMULATED (2xA100-80GB)"


def test_server_start_log_says_the_gpus_are_simulated(tmp_path: Path) -> None:
    """A real ``jupyter server`` with the embedded scheduler on simulated GPUs says so as it starts."""
    server = start_server(tmp_path, {"simulate": "2xA100-80GB", "state_dir": str(tmp_path / "state")},
                          ready=SIMULATED_LINE)
    try:
        text = server.text()
        lines = [line for line in text.splitlines() if SIMULATED_LINE in line]
        assert len(lines) == 1, text
        assert "kernels and jobs get no real GPU" in lines[0] and "[W " in lines[0], lines[0]
    finally:
        server.stop()


TRANSPORT_PROBE = (
    "from ipykernel.kernelapp import IPKernelApp\n"
    "print('TRANSPORT ' + IPKernelApp.instance().transport)\n"
)


async def get_json(jp_fetch: Any, *parts: str, **kwargs: Any) -> Any:
    reply = await jp_fetch(*parts, **kwargs)
    return json.loads(reply.body)


async def test_promoted_run_log_has_no_kernel_transport_warning(jp_fetch: Any, jp_root_dir: Any,
                                                                gpupool_app: Any) -> None:
    """The run's kernel talks to papermill over IPC sockets: no ipykernel "TCP without encryption" warning."""
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("steps = 1\n")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [params, nbformat.v4.new_code_cell(TRANSPORT_PROBE)]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    nbformat.write(nb, str(jp_root_dir / "probe.ipynb"))
    job = await get_json(jp_fetch, "gpupool", "api", "promote", method="POST",
                         body=json.dumps({"path": "probe.ipynb", "gpus": 1}))
    deadline = time.monotonic() + 180
    current = job
    while time.monotonic() < deadline and current["state"] not in ("succeeded", "failed", "cancelled", "rejected"):
        await asyncio.sleep(0.3)
        current = await get_json(jp_fetch, "gpupool", "api", "jobs", job["id"])
    logs = (await get_json(jp_fetch, "gpupool", "api", "jobs", job["id"], "logs", params={"offset": "0"}))["data"]
    assert current["state"] == "succeeded", logs[-3000:]
    assert "TRANSPORT ipc" in logs, logs[-3000:]
    assert "without encryption" not in logs, logs[-3000:]
    assert "papermill exited with status 0" in logs
