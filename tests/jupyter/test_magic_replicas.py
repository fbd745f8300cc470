"""``%gpupool promote --replicas R``: a distributed notebook run promoted from inside a kernel.

The magic is driven as a kernel would (its client found through GPUPOOL_URL
and GPUPOOL_TOKEN) against a real embedded scheduler on two simulated 8-GPU
nodes: the job it submits is a gang of R replicas, and a bad count is a
message in the notebook, not a traceback and not a snapshot left behind.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import nbformat
import pytest
from IPython.core.interactiveshell import InteractiveShell

from gpupool.app.embedded import EmbeddedScheduler
from gpupool.client import AsyncGpupoolClient
from jupyter_gpupool.magics import GpupoolMagics

FAST = {"tick_s": 0.05, "poll_s": 0.02, "pause_grace_s": 1.0}


@pytest.fixture
def notebook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import time; time.sleep(30)")]
    nbformat.write(nb, str(tmp_path / "dist.ipynb"))
    monkeypatch.setenv("GPUPOOL_SERVER_ROOT", str(tmp_path))
    monkeypatch.setenv("JPY_SESSION_NAME", str(tmp_path / "dist.ipynb"))
    return tmp_path / "dist.ipynb"


async def test_promote_with_replicas_submits_a_gang(tmp_path: Path, notebook: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    async with EmbeddedScheduler(tmp_path / "state", simulate="node-a=8xA100-80GB;node-b=8xA100-80GB",
                                 projects={"vision": {"train_guarantee": 16}}, admin_token="tok",
                                 config=FAST) as sched:
        monkeypatch.setenv("GPUPOOL_URL", sched.url)
        monkeypatch.setenv("GPUPOOL_TOKEN", "tok")
        magics = GpupoolMagics(shell=InteractiveShell.instance())
        job: Any = await asyncio.to_thread(magics.gpupool, "promote --gpus 8 --replicas 2 --project vision")
        assert job is not None, capsys.readouterr().out
        assert job["request"]["gpus"] == 8 and job["request"]["replicas"] == 2
        assert f"promoted dist.ipynb as job {job['id']}" in capsys.readouterr().out
        client = AsyncGpupoolClient(sched.url, "tok")
        await client.cancel(job["id"])

        runs_before = sorted((tmp_path / "dist.runs").iterdir())
        refused = await asyncio.to_thread(magics.gpupool, "promote --gpus 0.5 --replicas 2 --project vision")
        assert refused is None
        out = capsys.readouterr().out
        assert out.startswith("%gpupool: ") and "replicas" in out and "Traceback" not in out
        assert sorted((tmp_path / "dist.runs").iterdir()) == runs_before  # no snapshot left behind
