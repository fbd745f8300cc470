"""GPU use on Kubernetes: the node agent (a real `gpupool node-agent` process) reports a running pod's use,
and the scheduler's job shows it, is flagged idle by its project's rule, and is unmeasured once the agent stops.

What is real: the API server, the scheduler's core and HTTP API, the agent
process (simulated GPUs, annotating its node and reporting), the pod the
scheduler made and bound, and the pod's "process": a real process that
drives the documented simulation hook (``gpupool.sim_use``), whose cgroup
file under the agent's ``--proc-root`` names the pod as a kubelet's
systemd driver would. No kubelet runs containers here, so that one file is
what stands for the container runtime.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from gpupool.api.app import make_app
from gpupool.service.actor import Actor
from tests.kube.cluster import Kubelet, pod_env
from tests.kube.test_node_agent import agent as start_agent
from tests.kube.test_node_agent import agent_once
from tests.service.helpers import wait_for

ADMIN = Actor("admin", True)
TOKEN = "test-node-agent-token-0123456789"
CID = "0f3a9c1e" * 8

# A pod's process: says how busy its share is whenever told (a line on stdin), as a training loop would.
POD_PROCESS = r"""
import sys
import gpupool
for line in sys.stdin:
    assert gpupool.sim_use(busy=float(line), memory=3 << 30), "the hook must be on"
    print("ok", flush=True)
"""


@pytest.fixture
def http_api() -> Iterator[Callable[[Any], str]]:
    """``url = http_api(core)``: the core's HTTP API (where agents report) on a free loopback port; stopped after."""
    servers: list[HTTPServer] = []

    def serve(core: Any) -> str:
        sockets = bind_sockets(0, "127.0.0.1")
        server = HTTPServer(make_app(core))
        server.add_sockets(sockets)
        servers.append(server)
        return f"http://127.0.0.1:{sockets[0].getsockname()[1]}"

    yield serve
    for server in servers:
        server.stop()


def pod_cgroup(proc_root: Path, pid: int, uid: str) -> None:
    """What the kernel shows for a container's process under the systemd driver (cgroup v2)."""
    (proc_root / str(pid)).mkdir(parents=True)
    (proc_root / str(pid) / "cgroup").write_text(
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid.replace('-', '_')}.slice/"
        f"cri-containerd-{CID}.scope\n")


async def test_the_agent_reports_a_pods_use_and_the_job_shows_it_then_goes_idle(
        api: Any, namespace: str, gpu_nodes: Any, kubeconfig: Path, make_core: Any, http_api: Any, tmp_path: Path,
        monkeypatch: Any) -> None:
    (node,) = gpu_nodes(1, gpus=2)
    monkeypatch.setenv("GPUPOOL_NODE_AGENT_TOKEN", TOKEN)
    core = await make_core()
    url = http_api(core)
    proc_root, sim_dir = tmp_path / "proc", tmp_path / "sim-use"
    proc_root.mkdir()
    sim_dir.mkdir()
    (tmp_path / "token").write_text(TOKEN + "\n")
    agent = start_agent(kubeconfig, node, "--simulate", "2xA100-80GB", "--interval", "0.3", "--scheduler", url,
                        "--token-file", str(tmp_path / "token"), "--use-interval", "0.3",
                        "--proc-root", str(proc_root), "--sim-use-dir", str(sim_dir))
    work: subprocess.Popen[str] | None = None
    try:
        await wait_for(lambda: any(g["id"].startswith("GPU-") for n in core.pool()["nodes"] for g in n["gpus"]),
                       what="the agent's GPUs in the pool")
        await wait_for(lambda: node in core.reported_use.freshness(), what="the agent's first report")
        core.set_project(ADMIN, "vision", {"train_guarantee": 2,
                                           "idle": {"train": {"action": "flag", "window_s": 2, "below_percent": 10}}})
        job, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 1, "command": ["python", "train.py"]})
        with Kubelet(api, namespace) as kubelet:
            name = f"gpupool-{job['id']}-1"
            await wait_for(lambda: name in kubelet.started, what="the pod running")
            pod = api.read_namespaced_pod(name, namespace)
            gpu_ids = pod_env(pod)["NVIDIA_VISIBLE_DEVICES"]  # the GPUs' UUIDs, as the device plugin sees them
            assert gpu_ids.startswith("GPU-")
            work = subprocess.Popen([sys.executable, "-c", POD_PROCESS], stdin=subprocess.PIPE,
                                    stdout=subprocess.PIPE, text=True,
                                    env={**os.environ, "GPUPOOL_SIMULATED": "1", "GPUPOOL_SIM_USE_DIR": str(sim_dir),
                                         "CUDA_VISIBLE_DEVICES": gpu_ids, "GPUPOOL_GPU_FRACTION": "1"})
            pod_cgroup(proc_root, work.pid, pod.metadata.uid)

            def busy(value: float) -> None:
                assert work is not None and work.stdin is not None and work.stdout is not None
                work.stdin.write(f"{value}\n")
                work.stdin.flush()
                assert work.stdout.readline().strip() == "ok"

            busy(0.7)

            def gpu_in_pool() -> dict[str, Any]:
                (entry,) = [g for n in core.pool()["nodes"] for g in n["gpus"] if g["id"] == gpu_ids]
                return entry

            # the Pool view shows the reported GPU's use, as NVML's would show
            shown = await wait_for(lambda: gpu_in_pool().get("utilization") == 70.0 and gpu_in_pool(),
                                   what="the GPU's reported utilisation in the pool")
            assert shown["memory_used"] == 3 << 30
            # the job's recent use: its last minute (seconds measured idle before the hook spoke, and seconds
            # unmeasured before the scheduler knew the node's GPUs, which are not counted as idle)
            seen = await wait_for(lambda: ((j := core.get_job(ADMIN, job["id"])).get("recent_use") or {}).get(
                "busy", 0) > 0.5 and j, what="the job's recent use from the agent's reports")
            use = seen["recent_use"]
            assert use["busy"] <= 0.7 + 1e-6 and use["measured"] > 0, use
            assert use["peak_memory"] == 3 << 30
            assert seen["idle_since"] is None

            busy(0.0)  # the work went quiet: flagged after the project's 2 s window
            flagged = await wait_for(lambda: (j := core.get_job(ADMIN, job["id"]))["idle_since"] and j,
                                     timeout=30, what="the job flagged idle")
            assert flagged["idle_action"] == "flag" and flagged["state"] == "running"
            rows = core.report(ADMIN, by="job")["rows"]
            (row,) = [r for r in rows if r["job_id"] == job["id"]]
            assert row["used_gpu_hours"] > 0 and row["idle_gpu_hours"] > 0 and row["unmeasured_gpu_hours"] < \
                row["allocated_gpu_hours"]

            # the agent stops: its last report goes stale and the job is unmeasured, not idle
            agent.send_signal(signal.SIGTERM)
            _, err = agent.communicate(timeout=20)
            assert agent.returncode == 0, err
            await wait_for(lambda: node not in core.reported_use.freshness() and
                           (core.get_job(ADMIN, job["id"]).get("recent_use") or {}).get("measured", 1) < 0.5,
                           timeout=30, what="the job unmeasured once the agent is silent")
            assert "refused" not in err and "could not report" not in err, err
    finally:
        if work is not None:
            work.kill()
            work.wait()
        if agent.poll() is None:
            agent.kill()
            agent.communicate()


async def test_an_agent_with_a_wrong_token_says_so_and_keeps_annotating(
        api: Any, namespace: str, gpu_nodes: Any, kubeconfig: Path, make_core: Any, http_api: Any,
        monkeypatch: Any) -> None:
    (node,) = gpu_nodes(1, gpus=2)
    monkeypatch.setenv("GPUPOOL_NODE_AGENT_TOKEN", TOKEN)
    core = await make_core()
    url = http_api(core)
    agent = start_agent(kubeconfig, node, "--simulate", "2xA100-80GB", "--interval", "0.3", "--scheduler", url,
                        "--use-interval", "0.3", env={"GPUPOOL_NODE_AGENT_TOKEN": "not-the-token-at-all-0000"})
    try:
        await wait_for(lambda: any(g["id"].startswith("GPU-") for n in core.pool()["nodes"] for g in n["gpus"]),
                       what="the agent's GPUs in the pool (its annotation still written)")
        await asyncio.sleep(1.5)
        assert core.reported_use.freshness() == {}
    finally:
        agent.send_signal(signal.SIGTERM)
        _, err = agent.communicate(timeout=20)
    assert agent.returncode == 0, err
    assert err.count("the scheduler refused the GPU use report (HTTP 401: invalid token)") == 1, err


def bound_token(api: Any, namespace: str, account: str, pod: Any, audiences: list[str]) -> str:
    """What the kubelet projects into the agent's pod: a token of its service account bound to that pod."""
    from kubernetes import client

    spec = client.V1TokenRequestSpec(audiences=audiences, expiration_seconds=600, bound_object_ref=client.V1BoundObjectReference(
        kind="Pod", api_version="v1", name=pod.metadata.name, uid=pod.metadata.uid))
    return str(api.create_namespaced_service_account_token(account, namespace,
                                                           client.AuthenticationV1TokenRequest(spec=spec)).status.token)


async def test_an_agents_own_service_account_token_lets_it_report_for_its_node_only(
        api: Any, namespace: str, gpu_nodes: Any, kubeconfig: Path, make_core: Any, http_api: Any, tmp_path: Path,
        monkeypatch: Any) -> None:
    """No shared secret: the agent's pod token, checked by a TokenReview, names the node it runs on."""
    from tornado.httpclient import AsyncHTTPClient

    n1, n2 = gpu_nodes(2, gpus=2)
    monkeypatch.delenv("GPUPOOL_NODE_AGENT_TOKEN", raising=False)
    core = await make_core()
    for account in ("gpupool-node-agent", "someone-else"):
        api.create_namespaced_service_account(namespace, {"metadata": {"name": account}})
    pod, other_pod = (api.create_namespaced_pod(namespace, {
        "metadata": {"name": f"pod-of-{account}"},
        "spec": {"nodeName": n1, "serviceAccountName": account,
                 "containers": [{"name": "agent", "image": "registry.example/gpupool:latest"}]}})
        for account in ("gpupool-node-agent", "someone-else"))
    own = bound_token(api, namespace, "gpupool-node-agent", pod, ["gpupool"])
    url = http_api(core)
    (tmp_path / "token").write_text(own)
    # the agent, as the DaemonSet runs it, with its projected token: annotates, then reports once
    done = await asyncio.to_thread(agent_once, kubeconfig, n1, "--simulate", "2xA100-80GB", "--scheduler", url,
                                   "--token-file", str(tmp_path / "token"))
    assert done.returncode == 0, done.stderr
    assert n1 in core.reported_use.freshness()

    async def post(node: str, token: str) -> tuple[int, str]:
        reply = await AsyncHTTPClient().fetch(f"{url}/api/v1/nodes/{node}/use", method="POST",
                                              raise_error=False, body='{"gpus": []}',
                                              headers={"Authorization": f"Bearer {token}"})
        return reply.code, reply.body.decode()

    assert (await post(n1, own))[0] == 200
    status, text = await post(n2, own)  # the same token, for the other node
    assert status == 403 and f"bound to node '{n1}'" in text, text
    assert core.backend.node_tokens.reviews == 1  # one TokenReview, then its answer is kept a while
    # a token for the API server (its default audience), another account's, and a forged one: 401
    for token in (bound_token(api, namespace, "gpupool-node-agent", pod, []),
                  bound_token(api, namespace, "someone-else", other_pod, ["gpupool"]),
                  own[:-4] + "AAAA"):
        status, text = await post(n1, token)
        assert status == 401, text
    # and the agent's token reads nothing
    reply = await AsyncHTTPClient().fetch(f"{url}/api/v1/jobs", raise_error=False,
                                          headers={"Authorization": f"Bearer {own}"})
    assert reply.code == 401  # not a user's token: only the report endpoint asks the cluster about it


async def test_the_schedulers_deploy_account_may_check_an_agents_token(api: Any, gpu_nodes: Any,
                                                                      scheduler_account: Any) -> None:
    """rbac.yaml's one new right is enough: the scheduler's own account reviews an agent's token to its node."""
    from kubernetes.client.rest import ApiException

    from gpupool.backends.kubernetes.node_use import NodeTokens
    from tests.kube.cluster import wait

    (node,) = gpu_nodes(1, gpus=2)
    as_scheduler = scheduler_account.api
    api.create_namespaced_service_account("gpupool", {"metadata": {"name": "gpupool-node-agent"}})
    pod = api.create_namespaced_pod("gpupool", {
        "metadata": {"generateName": "agent-"},
        "spec": {"nodeName": node, "serviceAccountName": "gpupool-node-agent",
                 "containers": [{"name": "agent", "image": "registry.example/gpupool:latest"}]}})
    token = bound_token(api, "gpupool", "gpupool-node-agent", pod, ["gpupool"])
    tokens = NodeTokens(as_scheduler.api_client, "gpupool", ttl_s=0.0)

    def reviewed() -> str | None:
        try:
            return tokens.node_of(token)
        except Exception:  # 403 until the API server's RBAC cache has the new role
            return None

    assert wait(reviewed, what="the agent's token reviewed by the scheduler's account") == node
    with pytest.raises(ApiException) as refused:  # and the account cannot read pods one by one
        as_scheduler.read_namespaced_pod(pod.metadata.name, "gpupool")
    assert refused.value.status == 403


async def test_a_kubectl_pods_reported_use_is_its_jobs(api: Any, namespace: str, core_on_nodes: Any) -> None:
    """A pod a user made with kubectl (schedulerName: gpupool), adopted as a job: its UID maps to that job."""
    from gpupool.service.reported_use import NodeAgentActor
    from tests.kube.test_kubectl_pods import jobs_of, kubectl_pod

    core, _ = await core_on_nodes(gpus=4, projects={"vision": {"train_guarantee": 4}})
    with Kubelet(api, namespace):
        pod = kubectl_pod(api, namespace, "notebook-train", annotations={"gpupool.io/gpu-fraction": "0.25"})
        (job,) = await wait_for(lambda: [j for j in jobs_of(core, namespace, "notebook-train")
                                         if j["state"] == "running"], what="the pod's job running")
        node, (share,) = job["assignment"]["node"], job["assignment"]["gpus"]
        agent = NodeAgentActor(user="gpupool:node-agent", node=node)

        async def agent_reports() -> None:  # 20 % of the whole GPU's SMs: 0.8 of a quarter share
            while True:
                core.report_node_use(agent, node, {"interval_s": 0.3, "gpus": [
                    {"id": share["id"], "measured": True, "utilization": 20.0, "memory_used": 1 << 30,
                     "pods": [{"uid": pod.metadata.uid, "sm": 20.0, "memory": 1 << 30}]}]})
                await asyncio.sleep(0.3)

        reporting = asyncio.create_task(agent_reports())
        try:
            use = await wait_for(lambda: (core.get_job(ADMIN, job["id"]).get("recent_use") or {}).get("busy"),
                                 what="the kubectl pod's job's recent use")
            assert abs(use - 0.8) < 0.01, use
            assert core.backend.pod_jobs()[pod.metadata.uid] == job["id"]
        finally:
            reporting.cancel()
