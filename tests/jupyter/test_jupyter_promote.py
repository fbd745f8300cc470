"""Promote to training, end to end: a real notebook run headless by papermill as a scheduler job."""

from __future__ import annotations

import asyncio
import json
import stat
import time
from typing import Any

import nbformat
import pytest

pytestmark = pytest.mark.timeout(240)

PROBE = (
    "import json, os\n"
    "print('RESULT ' + json.dumps({'lr': lr, 'tag': tag, 'cuda': os.environ.get('CUDA_VISIBLE_DEVICES'),\n"
    "      'fraction': os.environ.get('GPUPOOL_GPU_FRACTION'), 'job': os.environ.get('GPUPOOL_JOB_ID'),\n"
    "      'cwd': os.getcwd()}))\n"
)


def experiment_notebook(path: Any) -> None:
    nb = nbformat.v4.new_notebook()
    params = nbformat.v4.new_code_cell("lr = 0.1\ntag = 'default'\n")
    params.metadata["tags"] = ["parameters"]
    nb.cells = [nbformat.v4.new_markdown_cell("# experiment"), params, nbformat.v4.new_code_cell(PROBE)]
    # saved from a GPU-share kernel: the headless run must use the plain kernel behind it
    nb.metadata["kernelspec"] = {"name": "gpupool-python3-0.25", "display_name": "Python 3 (¼ GPU)",
                                 "language": "python"}
    nbformat.write(nb, str(path))


async def get_json(jp_fetch: Any, *parts: str, **kwargs: Any) -> Any:
    reply = await jp_fetch(*parts, **kwargs)
    return json.loads(reply.body)


async def test_promote_runs_notebook_with_parameters(jp_fetch: Any, jp_root_dir: Any, gpupool_app: Any) -> None:
    (jp_root_dir / "work").mkdir()
    experiment_notebook(jp_root_dir / "work" / "exp.ipynb")
    body = {"path": "work/exp.ipynb", "gpus": 1, "priority": 2, "parameters": {"lr": 0.5, "tag": "42"}}
    job = await get_json(jp_fetch, "gpupool", "api", "promote", method="POST", body=json.dumps(body))
    assert job["kind"] == "train" and job["project"] == gpupool_app.connection.project
    run_dir = jp_root_dir / job["run_dir"]
    assert job["run_dir"] == f"work/exp.runs/{job['id']}"
    assert (run_dir / "input.ipynb").read_bytes() == (jp_root_dir / "work" / "exp.ipynb").read_bytes()

    # the notebook changes after promote: the run must use the snapshot
    experiment_notebook(jp_root_dir / "work" / "exp.ipynb")
    nb = nbformat.read(str(jp_root_dir / "work" / "exp.ipynb"), as_version=4)
    nb.cells[2].source = "raise RuntimeError('edited after promote')"
    nbformat.write(nb, str(jp_root_dir / "work" / "exp.ipynb"))

    deadline = time.monotonic() + 180
    since, states, assigned = 0, [], set()
    while time.monotonic() < deadline:
        events = await get_json(jp_fetch, "gpupool", "api", "events", params={"since": str(since), "timeout": "2"})
        since = events["last"]
        states += [e["state"] for e in events["events"] if e.get("job_id") == job["id"] and e.get("state")]
        current = await get_json(jp_fetch, "gpupool", "api", "jobs", job["id"])
        assigned |= {g["id"] for g in (current.get("assignment") or {}).get("gpus", [])}
        if current["state"] in ("succeeded", "failed", "cancelled", "rejected"):
            break
        await asyncio.sleep(0.2)
    logs = await get_json(jp_fetch, "gpupool", "api", "jobs", job["id"], "logs", params={"offset": "0"})
    assert current["state"] == "succeeded", logs["data"][-3000:]
    assert "running" in states
    assert current["output_notebook"] == f"work/exp.runs/{job['id']}/output.ipynb"

    out = nbformat.read(str(jp_root_dir / current["output_notebook"]), as_version=4)
    injected = [c for c in out.cells if "injected-parameters" in c.metadata.get("tags", [])]
    assert len(injected) == 1 and "lr = 0.5" in injected[0].source and 'tag = "42"' in injected[0].source
    text = "".join(o.get("text", "") for c in out.cells if c.cell_type == "code" for o in c.get("outputs", []))
    result = json.loads(text.split("RESULT ", 1)[1].splitlines()[0])
    assert result["lr"] == 0.5 and result["tag"] == "42" and result["job"] == job["id"]
    pool_gpus = {g["id"] for n in (await get_json(jp_fetch, "gpupool", "api", "status"))["pool"]["nodes"]
                 for g in n["gpus"]}
    assert result["cuda"] in pool_gpus and result["fraction"] == "1"
    assert assigned <= {result["cuda"]}
    assert result["cwd"] == str(jp_root_dir / "work")
    assert "papermill" in (run_dir / "job.log").read_text()
    assert "papermill exited with status 0" in logs["data"]
    assert not list((jp_root_dir / "work" / "exp.runs").glob(".staging-*"))
    # on a shared server nobody else reads a run's notebooks and log (issue 22, item 14)
    for private in (jp_root_dir / "work" / "exp.runs", run_dir):
        assert stat.S_IMODE(private.stat().st_mode) == 0o700, private


async def test_promote_refused_by_the_scheduler_leaves_nothing_behind(jp_fetch: Any, jp_root_dir: Any) -> None:
    from tornado.httpclient import HTTPClientError

    experiment_notebook(jp_root_dir / "exp.ipynb")
    for body, status in (({"path": "exp.ipynb", "project": "no-such-project"}, (400, 404)),
                         ({"path": "exp.ipynb", "gpus": 64}, (400, 409))):
        with pytest.raises(HTTPClientError) as info:
            await jp_fetch("gpupool", "api", "promote", method="POST", body=json.dumps(body))
        assert info.value.code in status, info.value.response.body
        assert json.loads(info.value.response.body)["error"]
    assert list((jp_root_dir / "exp.runs").iterdir()) == []
