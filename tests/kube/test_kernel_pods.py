"""GPU kernels as pods (issue 25): a real Jupyter server with the extension, GPUPOOL_URL pointing at a real
``gpupool serve --backend kubernetes`` on the test API server, and a kubelet that runs the kernel pods' commands
as local processes (tests/kube/process_kubelet.py), each pod on its own loopback address."""

from __future__ import annotations

import asyncio
import json
import os
import stat
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException

from tests.jupyter.server_process import TOKEN as SERVER_TOKEN
from tests.jupyter.server_process import ServerProcess, free_port, start_server
from tests.jupyter.server_process import api as jupyter
from tests.kube.cluster import wait
from tests.kube.kernel_channels import KernelChannels
from tests.kube.process_kubelet import ProcessKubelet
from tests.kube.test_serve_cli import gpupool, serve

QUARTER = "gpupool-python3-0.25"
PROBE = ("import json, os; print(json.dumps({k: v for k, v in os.environ.items() "
         "if k.startswith(('GPUPOOL', 'CUDA', 'NVIDIA'))}), flush=True)")


@dataclass
class Pool:
    """The scheduler (its URL), its node, and a user token per name."""

    url: str
    node: str
    tokens: dict[str, str]


def serve_on_cluster(folder: Path, kubeconfig: Path, namespace: str, *args: str) -> tuple[subprocess.Popen[str], str]:
    """``gpupool serve --backend kubernetes`` on the test's namespace, state in ``folder``; its stderr drained to
    a log there (a full pipe would stop the scheduler). A restart in the same folder finds the same state."""
    folder.mkdir(exist_ok=True)
    proc, url = serve(folder, "--backend", "kubernetes", "--kubeconfig", str(kubeconfig), "--namespace", namespace,
                      *args)
    log = folder / f"serve-{proc.pid}.log"
    threading.Thread(target=lambda: log.write_text("".join(proc.stderr or [])), daemon=True).start()
    return proc, url


def ready_pool(url: str, node: str, users: tuple[str, ...] = ("alice", "bob")) -> Pool:
    """Once gpupool sees its one node: project vision (build quota ½ GPU) and a token per user."""
    wait(lambda: len(gpupool(url, "status")["pool"]["nodes"]) == 1, what="the node in gpupool status")
    gpupool(url, "projects", "set", "vision", "--build-quota", "0.5")
    return Pool(url, node, {u: gpupool(url, "tokens", "create", u)["token"] for u in users})


def stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    proc.wait(20)


@pytest.fixture
def pool(api: Any, namespace: str, gpu_nodes: Any, kubeconfig: Path, tmp_path: Path) -> Iterator[Pool]:
    """``gpupool serve --backend kubernetes`` on one 4-GPU node; project vision (build quota ½ GPU)."""
    (node,) = gpu_nodes(1, gpus=4)
    proc, url = serve_on_cluster(tmp_path / "pool", kubeconfig, namespace)
    try:
        yield ready_pool(url, node)
    finally:
        stop(proc)


def lab(tmp_path: Path, pool: Pool, user: str, **settings: Any) -> ServerProcess:
    """A user's Jupyter server with the extension, its scheduler the pool's (as a Hub's user server is)."""
    home = tmp_path / user
    home.mkdir()
    return start_server(home, {"scheduler_url": pool.url, "scheduler_token": pool.tokens[user], "project": "vision",
                               "kernel_fractions": [0.25], "kernel_start_timeout": 60.0, **settings})


def start_kernel(server: ServerProcess, name: str = QUARTER) -> tuple[int, Any]:
    return jupyter(server.port, "/api/kernels", "POST", {"name": name})


async def run(server: ServerProcess, kernel_id: str, code: str, timeout: float = 60.0) -> Any:
    async with KernelChannels(server.port, SERVER_TOKEN, kernel_id) as k:
        await k.wait_ready()
        return await k.execute(code, timeout)


def share_of(pool: Pool, env: dict[str, str]) -> dict[str, Any]:
    """The kernel's share as the admin sees it (gpupool describe)."""
    return gpupool(pool.url, "describe", env["GPUPOOL_JOB_ID"])  # type: ignore[no-any-return]


def kernel_answers(connection_file: Path, ip: str, key: str, timeout: float = 3.0) -> bool:
    """Whether the kernel at ``ip`` (the ports of ``connection_file``) answers a kernel_info_request signed
    with ``key``: ipykernel drops a message whose signature it cannot verify."""
    from jupyter_client import BlockingKernelClient

    info = json.loads(connection_file.read_text())
    kc = BlockingKernelClient()
    kc.load_connection_info({**info, "ip": ip, "key": key})
    kc.start_channels()
    try:
        msg_id = kc.kernel_info()
        try:
            reply = kc.get_shell_msg(timeout=timeout)
        except Exception:  # queue.Empty: no answer
            return False
        return bool(reply["parent_header"].get("msg_id") == msg_id)
    finally:
        kc.stop_channels()


def pod_gone(api: Any, namespace: str, name: str) -> bool:
    try:
        api.read_namespaced_pod(name, namespace)
    except ApiException as e:
        return e.status == 404
    return False


async def test_a_quarter_gpu_kernel_is_a_pod_of_its_own_and_shutdown_deletes_it(
        api: Any, namespace: str, pool: Pool, tmp_path: Path) -> None:
    server = lab(tmp_path, pool, "alice")
    try:
        with ProcessKubelet(api, namespace) as kubelet:
            code, kernel = start_kernel(server)
            assert code == 201, kernel
            out = await run(server, kernel["id"], PROBE)
            assert out.status == "ok", out.output
            env = json.loads(out.output)
            share = share_of(pool, env)
            assert share["state"] == "running" and share["kind"] == "build" and share["user"] == "alice"
            assert share["labels"]["kernel_id"] == kernel["id"]
            assert env["GPUPOOL_GPU_FRACTION"] == "0.25" and env["GPUPOOL_PROJECT"] == "vision"
            gpu = share["assignment"]["gpus"][0]
            assert env["NVIDIA_VISIBLE_DEVICES"] == str(gpu["index"]) and env["CUDA_VISIBLE_DEVICES"] == "0"
            assert env["GPUPOOL_URL"] == pool.url and env["GPUPOOL_TOKEN"] == pool.tokens["alice"]

            # The pod: gpupool's, bound to the share's node, as the user, with no API token and no secret in it.
            name = share["kernel_pod"]["name"]
            assert name in kubelet.started and share["kernel_pod"]["ip"].startswith("127.77.")
            pod = api.read_namespaced_pod(name, namespace)
            assert pod.spec.node_name == pool.node == share["assignment"]["node"]
            assert pod.spec.scheduler_name == "gpupool" and pod.spec.restart_policy == "Always"
            assert pod.spec.automount_service_account_token is False
            assert pod.spec.security_context.run_as_user == os.getuid()
            assert pod.metadata.labels["gpupool.io/component"] == "kernel"
            assert pod.metadata.labels["gpupool.io/user"] == "alice"
            runtime_file = server.runtime / f"kernel-{kernel['id']}.json"
            key = json.loads(runtime_file.read_text())["key"]
            assert len(key) >= 32
            as_stored = json.dumps(api.api_client.sanitize_for_serialization(pod))
            assert key not in as_stored and pool.tokens["alice"] not in as_stored

            # The key: in a Secret owned by the pod, mounted 0440 in the pod's private folder; the server's copy 0600.
            secret = api.read_namespaced_secret(f"{name}-kernel", namespace)
            assert [(o.kind, o.uid) for o in secret.metadata.owner_references] == [("Pod", pod.metadata.uid)]
            mounted = next(kubelet.root.glob(f"{name}/*/volumes/*/connection.json"))
            assert json.loads(mounted.read_text())["key"] == key
            assert stat.S_IMODE(mounted.stat().st_mode) == 0o440
            for folder in (mounted.parent, *mounted.parents[:4]):
                assert stat.S_IMODE(folder.stat().st_mode) & 0o007 == 0, folder
            assert stat.S_IMODE(runtime_file.stat().st_mode) & 0o077 == 0

            # Only the owner's Jupyter server pod may connect (a policy owned by the pod).
            policy = client.NetworkingV1Api(api.api_client).read_namespaced_network_policy(f"{name}-kernel",
                                                                                            namespace)
            assert policy.spec.pod_selector.match_labels["gpupool.io/component"] == "kernel"
            assert policy.spec.ingress[0]._from[0].pod_selector.match_labels == {
                "gpupool.io/kernel-owner": "alice", "gpupool.io/role": "jupyter-server"}
            assert sorted(p.port for p in policy.spec.ingress[0].ports) == sorted(
                json.loads(runtime_file.read_text())[f"{c}_port"] for c in ("shell", "iopub", "stdin", "control",
                                                                            "hb"))
            assert [(o.kind, o.uid) for o in policy.metadata.owner_references] == [("Pod", pod.metadata.uid)]

            # %gpupool in the pod reaches the scheduler as the user (the token from the Secret): its own share.
            listed = await run(server, kernel["id"], "%load_ext jupyter_gpupool\n%gpupool list")
            assert listed.status == "ok" and share["id"] in listed.output, listed.output

            # A stranger who reaches the pod's ports without the key gets nothing; the key gets an answer.
            ip = share["kernel_pod"]["ip"]
            assert not kernel_answers(runtime_file, ip, "not-the-key")
            assert kernel_answers(runtime_file, ip, key)

            # Shut down: the share is free at once, the pod deleted and its process gone.
            assert jupyter(server.port, f"/api/kernels/{kernel['id']}", "DELETE")[0] == 204
            done = gpupool(pool.url, "describe", share["id"])
            assert done["state"] == "cancelled" and "kernel_pod" not in done
            wait(lambda: pod_gone(api, namespace, name), what="the kernel pod deleted")
            assert name in kubelet.deleted and kubelet.pid(name) is None
    finally:
        server.stop()


async def test_two_users_share_one_gpu_and_a_third_kernel_over_the_quota_is_refused(
        api: Any, namespace: str, pool: Pool, tmp_path: Path) -> None:
    alice, bob = lab(tmp_path, pool, "alice"), lab(tmp_path, pool, "bob")
    try:
        with ProcessKubelet(api, namespace) as kubelet:
            shares = []
            for server in (alice, bob):
                code, kernel = start_kernel(server)
                assert code == 201, kernel
                out = await run(server, kernel["id"], PROBE)
                shares.append(share_of(pool, json.loads(out.output)))
            assert [s["user"] for s in shares] == ["alice", "bob"]
            gpus = {(s["assignment"]["node"], s["assignment"]["gpus"][0]["id"]) for s in shares}
            assert len(gpus) == 1, gpus  # both quarters packed on one GPU of the node
            pods = [api.read_namespaced_pod(s["kernel_pod"]["name"], namespace) for s in shares]
            assert {p.status.pod_ip for p in pods} == {s["kernel_pod"]["ip"] for s in shares} and len(
                {p.status.pod_ip for p in pods}) == 2

            code, refused = start_kernel(alice)
            assert code == 409, refused
            assert refused["message"].startswith("No GPU share for this kernel:"), refused
            assert "kernel" in refused["message"] and "build quota" in refused["message"]
            assert len(kubelet.started) == 2  # no pod for the refused kernel
            assert len(api.list_namespaced_pod(namespace, label_selector="gpupool.io/component=kernel").items) == 2
    finally:
        alice.stop()
        bob.stop()


async def test_interrupt_restart_keep_the_share_and_pod_and_culling_deletes_the_pod(
        api: Any, namespace: str, pool: Pool, tmp_path: Path) -> None:
    server = lab(tmp_path, pool, "alice")
    try:
        with ProcessKubelet(api, namespace) as kubelet:
            code, kernel = start_kernel(server)
            assert code == 201, kernel
            kid = kernel["id"]
            async with KernelChannels(server.port, SERVER_TOKEN, kid) as k:
                await k.wait_ready()
                env = json.loads((await k.execute(PROBE)).output)
                share = share_of(pool, env)
                name = share["kernel_pod"]["name"]
                # Interrupt: a message on the control channel (no signal reaches a pod); the kernel lives on.
                busy = asyncio.Event()
                running = asyncio.ensure_future(k.execute("x = 42\nimport time\ntime.sleep(60)", started=busy))
                await asyncio.wait_for(busy.wait(), 30)
                await asyncio.sleep(0.3)
                code, _ = await asyncio.to_thread(jupyter, server.port, f"/api/kernels/{kid}/interrupt", "POST")
                assert code == 204
                interrupted = await asyncio.wait_for(running, 30)
                assert interrupted.status == "error" and interrupted.error == "KeyboardInterrupt"
                assert (await k.execute("print(x)")).output.strip() == "42"
            pid = kubelet.pid(name)

            # Restart: the same share and pod, a fresh kernel process (the container restarted in it).
            code, _ = jupyter(server.port, f"/api/kernels/{kid}/restart", "POST")
            assert code == 200
            out = await run(server, kid, "print('x' in globals(), flush=True)")
            assert out.output.strip() == "False"
            again = gpupool(pool.url, "describe", share["id"])
            assert again["state"] == "running" and again["kernel_pod"]["name"] == name
            assert again["kernel_pod"]["restarts"] >= 1 and kubelet.pid(name) not in (None, pid)
            assert kubelet.started.count(name) == 1 and not pod_gone(api, namespace, name)
    finally:
        server.stop()


async def test_an_idle_gpu_kernel_pod_is_culled(
        api: Any, namespace: str, pool: Pool, tmp_path: Path) -> None:
    server = lab(tmp_path, pool, "alice", idle_timeout=2.0, idle_grace=0.0)
    try:
        with ProcessKubelet(api, namespace) as kubelet:
            code, kernel = start_kernel(server)
            assert code == 201, kernel
            share = share_of(pool, json.loads((await run(server, kernel["id"], PROBE)).output))
            name = share["kernel_pod"]["name"]
            wait(lambda: gpupool(pool.url, "describe", share["id"])["state"] == "cancelled", timeout=30,
                 what="the idle kernel culled and its share given back")
            wait(lambda: pod_gone(api, namespace, name), what="the culled kernel's pod deleted")
            assert name in kubelet.deleted
            assert jupyter(server.port, f"/api/kernels/{kernel['id']}")[0] == 404
    finally:
        server.stop()


def test_a_kernel_pod_needs_a_build_share_and_the_kubernetes_backend(pool: Pool, tmp_path: Path) -> None:
    """The API's answers to a kernel_pod it cannot run: 400s that say why (and the status flag)."""
    assert gpupool(pool.url, "status")["kernel_pods"] is True
    request = {"argv": ["python", "-m", "ipykernel_launcher", "-f", "{connection_file}"],
               "connection": {"key": "k" * 32, "shell_port": 1, "iopub_port": 2, "stdin_port": 3,
                              "control_port": 4, "hb_port": 5}}
    from gpupool.client import GpupoolClient
    from gpupool.wire.errors import InvalidRequest

    c = GpupoolClient(pool.url, pool.tokens["alice"])
    with pytest.raises(InvalidRequest, match="kernel_pod is for build jobs"):
        c.submit({"project": "vision", "kind": "train", "command": ["true"], "kernel_pod": request})
    with pytest.raises(InvalidRequest, match="kernel_pod.connection.key"):
        c.submit({"project": "vision", "kind": "build", "gpu_fraction": 0.25,
                  "kernel_pod": {**request, "connection": {**request["connection"], "key": ""}}})
    with pytest.raises(InvalidRequest, match="'connection' is required"):
        c.submit({"project": "vision", "kind": "build", "kernel_pod": {"argv": "python"}})
    # A share without one has no pod, and a label that claims one is the service's alone.
    plain = c.submit({"project": "vision", "kind": "build", "gpu_fraction": 0.25,
                      "labels": {"gpupool.kernel_pod": "true"}})
    assert plain["state"] == "running" and "gpupool.kernel_pod" not in plain["labels"]
    assert "kernel_pod" not in c.job(plain["id"])
    c.cancel(plain["id"])


async def test_a_kernel_pod_that_does_not_start_in_time_fails_its_start_and_frees_its_share(
        api: Any, namespace: str, pool: Pool, tmp_path: Path) -> None:
    """No kubelet runs the pod: after the admin's kernel_start_timeout the start fails saying why, the share
    is given back and the pod deleted."""
    server = lab(tmp_path, pool, "alice", kernel_start_timeout=3.0)
    try:
        started = time.monotonic()
        code, refused = start_kernel(server)
        assert code == 504, refused
        assert time.monotonic() - started < 30
        assert refused["message"].startswith("The kernel's pod did not start within 3 s:"), refused
        assert "waits for its pod (3 s at most): the kernel's container is starting" in server.text()
        jobs = gpupool(pool.url, "list", "--all")
        mine = [j for j in jobs if j["kind"] == "build" and j["user"] == "alice"]
        assert [j["state"] for j in mine] == ["cancelled"]
        def kernel_pods() -> list[Any]:
            return list(api.list_namespaced_pod(namespace, label_selector="gpupool.io/component=kernel").items)

        # Its pod (made and bound: the log above) is being deleted: with no kubelet here the API server keeps
        # it Terminating, unless a pod-GC controller removes it outright.
        wait(lambda: all(p.metadata.deletion_timestamp is not None for p in kernel_pods()),
             what="the kernel pod deleted")
        assert jupyter(server.port, "/api/kernels")[1] == []
    finally:
        server.stop()


async def test_a_kernel_that_fails_as_it_starts_fails_its_start_at_once_saying_what_it_printed(
        api: Any, namespace: str, pool: Pool, tmp_path: Path) -> None:
    """An image whose kernel cannot start (here its ``python`` exits at once, as one without ipykernel does):
    the container runs for a moment, exits 1, is restarted and exits again (CrashLoopBackOff). The start fails
    well within kernel_start_timeout with the exit code and what the kernel printed; the share goes back and
    the pod is deleted."""
    broken = tmp_path / "image-bin"
    broken.mkdir()
    (broken / "python").write_text("#!/bin/sh\necho \"/usr/bin/python: No module named ipykernel_launcher\" >&2\n"
                                   "exit 1\n")
    (broken / "python").chmod(0o755)
    server = lab(tmp_path, pool, "alice", kernel_start_timeout=60.0)
    try:
        with ProcessKubelet(api, namespace, path=os.pathsep.join([str(broken), "/usr/bin", "/bin"])) as kubelet:
            started = time.monotonic()
            code, refused = start_kernel(server)
            assert code == 409, refused
            assert time.monotonic() - started < 30
            message = refused["message"]
            assert message.startswith("The kernel's pod ended before it started: its container keeps exiting "
                                      "(CrashLoopBackOff: its container exited with code 1: "), message
            assert message.count("No module named ipykernel_launcher") == 1, message  # the last run's words
            (job,) = [j for j in gpupool(pool.url, "list", "--all") if j["user"] == "alice"]
            assert job["state"] == "cancelled"
            (name,) = kubelet.started
            wait(lambda: pod_gone(api, namespace, name), what="the kernel pod removed")
            assert jupyter(server.port, "/api/kernels")[1] == []
    finally:
        server.stop()


async def test_a_kernel_pod_outlives_a_scheduler_restart_and_is_still_deleted_at_shutdown(
        api: Any, namespace: str, gpu_nodes: Any, kubeconfig: Path, tmp_path: Path) -> None:
    """gpupool serve restarted under a running kernel: the pod is adopted (not swept as a stray), the
    kernel keeps its state and its share, and its shutdown still deletes the pod."""
    (node,) = gpu_nodes(1, gpus=4)
    port = str(free_port())
    proc, url = serve_on_cluster(tmp_path / "pool", kubeconfig, namespace, "--port", port)
    try:
        pool = ready_pool(url, node, ("alice",))
        server = lab(tmp_path, pool, "alice")
        try:
            with ProcessKubelet(api, namespace) as kubelet:
                code, kernel = start_kernel(server)
                assert code == 201, kernel
                share = share_of(pool, json.loads((await run(server, kernel["id"], "y = 7\n" + PROBE)).output))
                name = share["kernel_pod"]["name"]
                pid = kubelet.pid(name)
                proc.terminate()
                assert proc.wait(30) == 0
                proc, again_url = serve_on_cluster(tmp_path / "pool", kubeconfig, namespace, "--port", port)
                assert again_url == url
                wait(lambda: gpupool(url, "describe", share["id"]).get("kernel_pod", {}).get("ready"),
                     what="the share and its pod found again")
                await asyncio.sleep(2)  # past the restarted scheduler's sweep of pods no attempt holds
                out = await run(server, kernel["id"], "print(y, flush=True)")
                assert out.output.strip() == "7" and kubelet.pid(name) == pid
                assert api.read_namespaced_pod(name, namespace).metadata.deletion_timestamp is None
                assert gpupool(url, "describe", share["id"])["state"] == "running"
                assert jupyter(server.port, f"/api/kernels/{kernel['id']}", "DELETE")[0] == 204
                wait(lambda: pod_gone(api, namespace, name), what="the kernel pod deleted")
                assert gpupool(url, "describe", share["id"])["state"] == "cancelled"
        finally:
            server.stop()
    finally:
        stop(proc)


async def test_the_pod_of_a_killed_jupyter_server_goes_when_its_lease_runs_out(
        api: Any, namespace: str, gpu_nodes: Any, kubeconfig: Path, tmp_path: Path) -> None:
    """Nothing renews the share of a kernel whose server was killed: the scheduler cancels it when its lease
    runs out and deletes its pod, as it frees a local kernel's share."""
    (node,) = gpu_nodes(1, gpus=4)
    fast = tmp_path / "lease.json"
    fast.write_text(json.dumps({"poll_s": 0.05, "tick_s": 0.2, "min_runtime_s": 0, "resume_backoff_s": 0,
                                "pause_grace_s": 2, "run_jobs_as": "service", "lease_s": 3}))
    proc, url = serve_on_cluster(tmp_path / "pool", kubeconfig, namespace, "--config", str(fast))
    try:
        pool = ready_pool(url, node, ("alice",))
        server = lab(tmp_path, pool, "alice", lease_seconds=3.0)
        try:
            with ProcessKubelet(api, namespace) as kubelet:
                code, kernel = start_kernel(server)
                assert code == 201, kernel
                share = share_of(pool, json.loads((await run(server, kernel["id"], PROBE)).output))
                name = share["kernel_pod"]["name"]
                time.sleep(4)  # longer than the lease: the live server renews it
                assert gpupool(url, "describe", share["id"])["state"] == "running"
                server.kill()
                done = wait(lambda: (j := gpupool(url, "describe", share["id"]))["state"] == "cancelled" and j,
                            timeout=30, what="the share's lease run out")
                assert "lease" in done["reason"]
                wait(lambda: pod_gone(api, namespace, name), what="the kernel pod deleted")
                assert name in kubelet.deleted
        finally:
            server.stop()
    finally:
        stop(proc)


async def test_a_kernel_pod_deleted_from_outside_ends_its_share_and_jupyter_restarts_the_kernel_in_a_new_one(
        api: Any, namespace: str, pool: Pool, tmp_path: Path) -> None:
    server = lab(tmp_path, pool, "alice")
    try:
        with ProcessKubelet(api, namespace) as kubelet:
            code, kernel = start_kernel(server)
            assert code == 201, kernel
            first = share_of(pool, json.loads((await run(server, kernel["id"], PROBE)).output))
            api.delete_namespaced_pod(first["kernel_pod"]["name"], namespace, grace_period_seconds=0)
            ended = wait(lambda: (j := gpupool(pool.url, "describe", first["id"]))["state"] == "cancelled" and j,
                         what="the share ended with its pod")
            assert "kernel pod" in ended["reason"], ended["reason"]

            def new_share() -> dict[str, Any] | None:
                for j in gpupool(pool.url, "list"):
                    if j["labels"].get("kernel_id") == kernel["id"] and j["state"] == "running" and \
                            j["id"] != first["id"]:
                        return j  # type: ignore[no-any-return]
                return None

            second = wait(new_share, timeout=60, what="Jupyter's restart of the kernel in a new share")
            out = await run(server, kernel["id"], PROBE)
            assert json.loads(out.output)["GPUPOOL_JOB_ID"] == second["id"]
            assert len(kubelet.started) == 2
    finally:
        server.stop()
