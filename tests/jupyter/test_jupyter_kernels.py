"""GPU-share kernels, end to end: real kernels through the provisioner on the embedded scheduler."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any

import nbformat
import pytest
from kernel_helpers import kernel_env, run_in_kernel
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from gpupool.app.embedded import EmbeddedScheduler
from gpupool.client import AsyncGpupoolClient
from jupyter_gpupool import leases

pytestmark = pytest.mark.timeout(240)


async def get_json(jp_fetch: Any, *parts: str, **kwargs: Any) -> Any:
    reply = await jp_fetch(*parts, **kwargs)
    return json.loads(reply.body) if reply.body else None


async def start_session(jp_fetch: Any, path: str, kernel: str) -> dict[str, Any]:
    body = {"path": path, "type": "notebook", "name": os.path.basename(path), "kernel": {"name": kernel}}
    return await get_json(jp_fetch, "api", "sessions", method="POST", body=json.dumps(body))


async def wait_state(client: Any, job_id: str, states: set[str], timeout: float = 20) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        job = await client.job(job_id)
        if job["state"] in states or time.monotonic() > deadline:
            return job
        await asyncio.sleep(0.2)


async def test_kernelspecs_in_launcher_and_plain_python_untouched(jp_fetch: Any, gpupool_app: Any) -> None:
    specs = (await get_json(jp_fetch, "api", "kernelspecs"))["kernelspecs"]
    names = {name: spec["spec"]["display_name"] for name, spec in specs.items()}
    assert names["gpupool-python3-0.25"] == "Python 3 (¼ GPU)"
    assert names["gpupool-python3-0.5"] == "Python 3 (½ GPU)"
    assert names["gpupool-python3-1"] == "Python 3 (1 GPU)"
    meta = specs["gpupool-python3-0.25"]["spec"]["metadata"]["kernel_provisioner"]
    assert meta == {"provisioner_name": "gpupool-provisioner", "config": {"gpu_fraction": 0.25}}
    assert "kernel_provisioner" not in (specs["python3"]["spec"].get("metadata") or {})


async def test_share_kernel_lifecycle(jp_fetch: Any, jp_serverapp: Any, gpupool_app: Any, jp_root_dir: Any) -> None:
    """Env inside the kernel, magics, quota exhausted message, restart keeps the share, shutdown frees it."""
    (jp_root_dir / "work").mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("x = 1")]
    nb.metadata["kernelspec"] = {"name": "gpupool-python3-0.5", "display_name": "Python 3 (½ GPU)"}
    nbformat.write(nb, str(jp_root_dir / "work" / "nb1.ipynb"))
    session = await start_session(jp_fetch, "work/nb1.ipynb", "gpupool-python3-0.5")
    kernel_id = session["kernel"]["id"]
    client = await gpupool_app.connection.client()
    share = leases.held()[kernel_id]
    job = await client.job(share.job_id)
    assert job["state"] == "running" and job["kind"] == "build" and job["project"] == gpupool_app.connection.user
    assert job["labels"] == {"notebook": "work/nb1.ipynb", "kernel_id": kernel_id}
    assert job["request"]["gpu_fraction"] == 0.5

    env = await kernel_env(jp_serverapp, kernel_id)
    assert env["CUDA_VISIBLE_DEVICES"] == job["assignment"]["gpus"][0]["id"]
    assert env["GPUPOOL_GPU_FRACTION"] == "0.5" and env["GPUPOOL_JOB_ID"] == job["id"]
    assert env["GPUPOOL_SIMULATED"] == "1" and env["GPUPOOL_KERNEL_ID"] == kernel_id
    assert env["GPUPOOL_URL"] == gpupool_app.connection.url and env["GPUPOOL_TOKEN"]
    assert env["JPY_SESSION_NAME"].endswith(os.path.join("work", "nb1.ipynb"))
    assert env["GPUPOOL_SERVER_ROOT"] == str(jp_serverapp.root_dir)  # the magics' promote paths start there

    # the magic, with the scoped token the provisioner handed the kernel
    user = gpupool_app.connection.user
    out = await run_in_kernel(jp_serverapp, kernel_id, "%load_ext jupyter_gpupool\n%gpupool status\n%gpupool list")
    assert f"project {user}: build 0.5/1 GPU" in out and "(simulated GPUs)" in out
    assert job["id"] in out and "running" in out
    out = await run_in_kernel(jp_serverapp, kernel_id, "%gpupool promote --gpus 0.5 -p x 2")
    promoted_id = out.split("as job ", 1)[1].split()[0]
    promoted = await client.job(promoted_id)
    assert promoted["kind"] == "train" and promoted["labels"]["notebook"] == "work/nb1.ipynb"
    assert promoted["user"] == user and promoted["request"]["gpu_fraction"] == 0.5
    assert (jp_root_dir / "work" / "nb1.runs" / promoted_id / "input.ipynb").is_file()
    await client.cancel(promoted_id)

    # the monitors work inside the kernel, live on its own asyncio loop
    code = (
        "import asyncio\n"
        "from jupyter_gpupool.widgets import PoolMonitor, QueueMonitor\n"
        "pm, qm = PoolMonitor(interval=0.5), QueueMonitor(interval=0.5)\n"
        "for _ in range(100):\n"
        "    await asyncio.sleep(0.1)\n"
        "    if pm.gpu_bars and qm.buttons:\n"
        "        break\n"
        "print(len(pm.gpu_bars), sum(b.value for b in pm.gpu_bars.values()), sorted(qm.buttons), repr(pm.error.value))\n"
        "pm.close(); qm.close()\n"
    )
    out = await run_in_kernel(jp_serverapp, kernel_id, code)
    assert out.strip() == f"4 0.5 ['{job['id']}'] ''"

    # the quota (1 GPU) cannot hold another whole GPU: the kernel does not start, the user is told why
    # (409 with our message from both the sessions endpoint Lab uses and the kernels endpoint)
    with pytest.raises(HTTPClientError) as info:
        await start_session(jp_fetch, "nb2.ipynb", "gpupool-python3-1")
    assert info.value.code == 409
    message = json.loads(info.value.response.body)["message"]
    assert f"project '{user}'" in message and "build quota of 1 GPU" in message
    assert "work/nb1.ipynb" in message and kernel_id[:8] in message
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": "gpupool-python3-1"}))
    assert info.value.code == 409
    assert "build quota of 1 GPU" in json.loads(info.value.response.body)["message"]
    assert len(jp_serverapp.kernel_manager.list_kernel_ids()) == 1
    assert len(await client.jobs(kind="build", state="queued,running")) == 1

    # the front end's view of my GPU kernels
    mine = await get_json(jp_fetch, "gpupool", "api", "kernels")
    assert [(k["kernel_id"], k["path"], k["job"]["id"]) for k in mine] == [(kernel_id, "work/nb1.ipynb", job["id"])]

    # restart keeps the share (same job, same GPU) and renewal keeps it alive past several leases
    await jp_fetch("api", "kernels", kernel_id, "restart", method="POST", body=b"")
    env2 = await kernel_env(jp_serverapp, kernel_id)
    assert env2["GPUPOOL_JOB_ID"] == job["id"] and env2["CUDA_VISIBLE_DEVICES"] == env["CUDA_VISIBLE_DEVICES"]
    await asyncio.sleep(gpupool_app.lease_seconds * 1.5)
    assert (await client.job(job["id"]))["state"] == "running"

    # shutdown frees it at once
    await jp_fetch("api", "sessions", session["id"], method="DELETE")
    assert (await client.job(job["id"]))["state"] == "cancelled"
    assert kernel_id not in leases.held()


async def test_session_over_quota_is_409_like_the_kernels_endpoint(
    jp_fetch: Any, jp_serverapp: Any, gpupool_app: Any, jp_http_port: int, jp_base_url: str
) -> None:
    """Lab opens notebooks through POST /api/sessions: a quota refusal there is the 409 /api/kernels gives."""
    user = gpupool_app.connection.user
    admin = await gpupool_app.connection.admin_client()
    await admin.set_project(user, build_quota=0.5)  # less than the 1 GPU the kernel asks for: refused at once
    with pytest.raises(HTTPClientError) as from_session:
        await start_session(jp_fetch, "over.ipynb", "gpupool-python3-1")
    with pytest.raises(HTTPClientError) as from_kernels:
        await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": "gpupool-python3-1"}))
    assert from_session.value.code == from_kernels.value.code == 409
    message = json.loads(from_session.value.response.body)["message"]
    assert message == json.loads(from_kernels.value.response.body)["message"]
    # no kernel holds any of it: the message says the kernel asks for more than the whole quota
    assert f"project '{user}'" in message and "asked for 1 GPU" in message and "quota of only ½ GPU" in message
    assert jp_serverapp.kernel_manager.list_kernel_ids() == []
    assert await get_json(jp_fetch, "api", "sessions") == []
    assert await (await gpupool_app.connection.client()).jobs(kind="build", state="queued,running") == []
    # other failures of the session endpoint are Jupyter's own, untouched, and it still needs a login
    with pytest.raises(HTTPClientError) as missing:
        await jp_fetch("api", "sessions", method="POST", body=json.dumps({"type": "notebook"}))
    assert missing.value.code == 400
    anonymous = await AsyncHTTPClient().fetch(
        f"http://localhost:{jp_http_port}{jp_base_url}api/sessions", method="POST", raise_error=False,
        body=json.dumps({"path": "x.ipynb", "type": "notebook", "kernel": {"name": "gpupool-python3-0.25"}}))
    assert anonymous.code == 403
    assert await get_json(jp_fetch, "api", "sessions") == []
    # the refused kernels left nothing in the kernel manager: stopping every kernel (what the server does
    # on SIGTERM) finds none to stop (it used to raise "404 Kernel does not exist" and abort the stop)
    await jp_serverapp.kernel_manager.shutdown_all()


async def test_plain_kernel_gpu_free_and_idle_gpu_kernel_shut_down(
    jp_fetch: Any, jp_serverapp: Any, gpupool_app: Any
) -> None:
    session = await start_session(jp_fetch, "idle.ipynb", "gpupool-python3-0.25")
    kernel_id = session["kernel"]["id"]
    client = await gpupool_app.connection.client()
    plain = (await start_session(jp_fetch, "plain.ipynb", "python3"))["kernel"]["id"]
    env = await kernel_env(jp_serverapp, plain)
    assert env["CUDA_VISIBLE_DEVICES"] == "" and "GPUPOOL_JOB_ID" not in env
    assert env["GPUPOOL_URL"] == gpupool_app.connection.url and env["GPUPOOL_TOKEN"]
    assert env["GPUPOOL_SERVER_ROOT"] == str(jp_serverapp.root_dir)
    assert plain not in leases.held()
    job_id = leases.held()[kernel_id].job_id
    gpupool_app.idle_timeout, gpupool_app.idle_grace = 0.2, 0.0
    assert await gpupool_app.cull_idle_once() == []  # first sight: starts the kernel's grace clock
    assert kernel_id in jp_serverapp.kernel_manager
    culled: list[str] = []
    deadline = time.monotonic() + 15
    while not culled and time.monotonic() < deadline:  # a loaded machine may deliver start-up messages late
        await asyncio.sleep(0.3)
        culled = await gpupool_app.cull_idle_once()
    assert culled == [kernel_id]
    assert kernel_id not in jp_serverapp.kernel_manager
    assert (await client.job(job_id))["state"] == "cancelled"
    assert plain in jp_serverapp.kernel_manager  # no GPU share: never culled by us


async def test_server_stop_gives_shares_back_before_the_scheduler_stops(
    jp_fetch: Any, jp_serverapp: Any, gpupool_app: Any
) -> None:
    session = await start_session(jp_fetch, "stop.ipynb", "gpupool-python3-0.25")
    kernel_id = session["kernel"]["id"]
    job_id = leases.held()[kernel_id].job_id
    state_dir = gpupool_app.connection.embedded.state_dir
    # the server stops extensions first, kernels after
    await jp_serverapp.cleanup_extensions()
    await jp_serverapp.cleanup_kernels()
    assert gpupool_app.connection.embedded is None and gpupool_app.connection.closed
    assert leases.held() == {}
    # reopen the embedded scheduler's state: the share was given back, not left to a lease
    sched = EmbeddedScheduler(state_dir)
    await sched.start()
    try:
        job = await AsyncGpupoolClient(sched.url, sched.admin_token).job(job_id)
    finally:
        await sched.stop()
    assert job["state"] == "cancelled" and "lease" not in job["reason"]


async def test_kernel_that_fails_to_launch_gives_its_share_back(
    jp_fetch: Any, jp_serverapp: Any, gpupool_app: Any, tmp_path: Any
) -> None:
    broken = tmp_path / "broken-kernels" / "gpupool-broken"
    broken.mkdir(parents=True)
    (broken / "kernel.json").write_text(json.dumps({
        "argv": [str(tmp_path / "no-such-python"), "-f", "{connection_file}"],
        "display_name": "broken", "language": "python",
        "metadata": {"kernel_provisioner": {"provisioner_name": "gpupool-provisioner",
                                            "config": {"gpu_fraction": 0.5}}},
    }))
    ksm = jp_serverapp.kernel_spec_manager
    ksm.kernel_dirs = [str(broken.parent), *ksm.kernel_dirs]
    with pytest.raises(HTTPClientError):
        await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": "gpupool-broken"}))
    client = await gpupool_app.connection.client()
    jobs = await client.jobs(kind="build")
    assert len(jobs) == 1 and jobs[0]["state"] == "cancelled"
    assert leases.held() == {}


async def test_kernel_whose_share_is_cancelled_is_shut_down(jp_fetch: Any, jp_serverapp: Any, gpupool_app: Any) -> None:
    session = await start_session(jp_fetch, "cancelled.ipynb", "gpupool-python3-0.5")
    kernel_id = session["kernel"]["id"]
    job_id = leases.held()[kernel_id].job_id
    # the user cancels the kernel's share from the queue view
    reply = await get_json(jp_fetch, "gpupool", "api", "jobs", job_id, "cancel", method="POST", body=b"")
    assert reply["state"] == "cancelled"
    deadline = time.monotonic() + 20  # the periodic renewal (every 0.5 s here) notices and stops the kernel
    while kernel_id in jp_serverapp.kernel_manager and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert kernel_id not in jp_serverapp.kernel_manager
    assert leases.held() == {}


async def test_kernel_without_a_notebook_is_named_by_a_short_id(jp_fetch: Any, gpupool_app: Any) -> None:
    """A kernel started with no notebook (POST /api/kernels) is 'kernel 1a2b3c4d' to users, not a full UUID."""
    kernel = await get_json(jp_fetch, "api", "kernels", method="POST", body=json.dumps({"name": "gpupool-python3-0.25"}))
    kernel_id = kernel["id"]
    client = await gpupool_app.connection.client()
    job = await client.job(leases.held()[kernel_id].job_id)
    assert job["name"] == f"kernel {kernel_id[:8]}"  # what the GPU Pool panel lists
    with pytest.raises(HTTPClientError) as info:
        await jp_fetch("api", "kernels", method="POST", body=json.dumps({"name": "gpupool-python3-1"}))
    assert info.value.code == 409
    message = json.loads(info.value.response.body)["message"]
    assert f"asked for 1 GPU; project '{job['project']}' holds ¼ GPU of its build quota of 1 GPU " in message
    assert f"(kernel {kernel_id[:8]} ¼ ({job['user']}, {job['id']})); ¾ GPU free" in message
    assert kernel_id not in message
    # the scheduler said (held_milli, not its wording) that a kernel holds part of the quota: so, what to do
    assert message.endswith("Shut down a GPU kernel of this project, pick a smaller GPU kernel, or ask an admin for "
                            "more build quota.")
    await jp_fetch("api", "kernels", kernel_id, method="DELETE")
