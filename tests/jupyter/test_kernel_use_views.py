"""What Lab reads of a real ¼-GPU kernel's use: its recent use on /gpupool/api/kernels and the series on /gpupool/api/use.

The kernel drives its own simulated use (gpupool.sim_use) from a cell, as a
notebook on the Binder demo does; the scheduler maps its process to its share.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import nbformat
import pytest
from kernel_helpers import run_in_kernel

pytestmark = pytest.mark.timeout(120)


async def _kernel_item(jp_fetch: Any, kernel_id: str) -> dict[str, Any]:
    kernels = json.loads((await jp_fetch("gpupool", "api", "kernels")).body)
    return next(k for k in kernels if k["kernel_id"] == kernel_id)


async def _until(what: str, check: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = await check()
        if got:
            return got
        assert time.monotonic() < deadline, f"{what}: still {got!r}"
        await asyncio.sleep(0.3)


async def test_the_kernels_endpoint_shows_a_kernels_recent_use_and_the_use_endpoint_its_series(
        jp_fetch: Any, jp_serverapp: Any, jp_root_dir: Any) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "gpupool-python3-0.25", "display_name": "Python 3 (¼ GPU)"}
    nbformat.write(nb, str(jp_root_dir / "use.ipynb"))
    body = {"path": "use.ipynb", "type": "notebook", "name": "use.ipynb", "kernel": {"name": "gpupool-python3-0.25"}}
    session = json.loads((await jp_fetch("api", "sessions", method="POST", body=json.dumps(body))).body)
    kernel_id = session["kernel"]["id"]

    # Sampled but silent: its share reads idle, as NVML shows a process that does not use the GPU (0 %, not "no data")
    async def sampled() -> Any:
        return (await _kernel_item(jp_fetch, kernel_id))["job"]["recent_use"]
    use = await _until("the kernel's share sampled", sampled)
    assert use["busy"] == 0.0 and use["measured"] == 1.0 and use["window_s"] == 60.0

    out = await run_in_kernel(jp_serverapp, kernel_id, "import gpupool\nprint(gpupool.sim_use(busy=1.0))")
    assert out.strip() == "True", out

    async def busy() -> Any:
        item = await _kernel_item(jp_fetch, kernel_id)
        return item if (item["job"]["recent_use"]["busy"] or 0) > 0.05 else None
    item = await _until("the kernel's reported use", busy)
    job = item["job"]
    assert item["path"] == "use.ipynb" and job["kind"] == "build" and job["state"] == "running"
    assert 0 < job["recent_use"]["busy"] < 1  # flat out since the cell ran, idle the seconds before: a mean

    # The panel's chart: the kernel's project, build, a quarter GPU held in each completed 10 s bucket of it
    async def series() -> Any:
        reply = json.loads((await jp_fetch("gpupool", "api", "use", params={
            "since": str(time.time() - 120), "step": "10"})).body)
        build = [s for s in reply["series"] if s["project"] == job["project"] and s["kind"] == "build"]
        return build[0] if build and any(u > 0 for u in build[0]["used"]) else None
    build = await _until("a completed bucket of the kernel's use", series, timeout=40.0)
    assert max(build["allocated"]) == pytest.approx(0.25, abs=0.01)
    assert all(m == a for m, a in zip(build["measured"], build["allocated"], strict=True))  # simulated: measured
    assert all(0 <= u <= a + 0.01 for u, a in zip(build["used"], build["allocated"], strict=True))

    code = None
    try:
        await jp_fetch("gpupool", "api", "use", params={"step": "-1"})
    except Exception as err:  # tornado's HTTPClientError
        code, message = err.code, json.loads(err.response.body)["error"]  # type: ignore[attr-defined]
    assert code == 400 and "step must be" in message
