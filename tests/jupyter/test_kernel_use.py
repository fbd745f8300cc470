"""A real ¼-GPU kernel drives its own simulated use: the scheduler maps its process to its share (issue 26)."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import nbformat
import pytest
from kernel_helpers import run_in_kernel

from jupyter_gpupool import leases

pytestmark = pytest.mark.timeout(120)


async def test_a_kernel_reports_its_use_and_the_report_shows_it(jp_fetch: Any, jp_serverapp: Any, gpupool_app: Any,
                                                                jp_root_dir: Any) -> None:
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "gpupool-python3-0.25", "display_name": "Python 3 (¼ GPU)"}
    nbformat.write(nb, str(jp_root_dir / "use.ipynb"))
    body = {"path": "use.ipynb", "type": "notebook", "name": "use.ipynb", "kernel": {"name": "gpupool-python3-0.25"}}
    session = json.loads((await jp_fetch("api", "sessions", method="POST", body=json.dumps(body))).body)
    kernel_id = session["kernel"]["id"]
    job_id = leases.held()[kernel_id].job_id
    out = await run_in_kernel(jp_serverapp, kernel_id, "import gpupool, os\nprint(gpupool.sim_use(busy=1.0), os.getpid())")
    assert out.split()[0] == "True", out
    await asyncio.sleep(2.5)  # several ticks of the scheduler with the kernel busy
    client = await gpupool_app.connection.client()
    rows = (await client.report(since=time.time() - 600, by="job"))["rows"]
    row = next(r for r in rows if r["job_id"] == job_id)
    assert row["kind"] == "build" and row["used_gpu_hours"] > 0 and row["unmeasured_gpu_hours"] == 0
    pool = await client.pool()
    gpu = next(g for n in pool["nodes"] for g in n["gpus"] if any(a["job_id"] == job_id for a in g["allocations"]))
    assert gpu["utilization"] == pytest.approx(25.0)  # flat out on a quarter of the GPU
