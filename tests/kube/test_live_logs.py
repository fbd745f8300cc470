"""A Kubernetes job's output in `gpupool logs` while its pod runs, and each line exactly once after it ends.

The API server proxies ``pods/log`` to the stand-in kubelet's log endpoint
(tests/kube/cluster.py); the scheduler copies running pods' output into the
job's log file (gpupool/backends/kubernetes/logs.py).
"""

from __future__ import annotations

import os
import queue
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from gpupool.backends.kubernetes import logs as live_logs
from gpupool.backends.kubernetes.logs import LiveLogs
from tests.kube.cluster import Kubelet, make_gpu_node, wait
from tests.kube.test_serve_cli import TOKEN, gpupool, serve


def cli(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "GPUPOOL_URL": url, "GPUPOOL_TOKEN": TOKEN}
    return subprocess.run([sys.executable, "-m", "gpupool", *args], env=env, capture_output=True, text=True,
                          timeout=60)


def test_gpupool_logs_shows_a_running_pods_output_and_the_archive_adds_each_line_once(
        api: Any, namespace: str, gpu_nodes: Any, kubeconfig: Path, tmp_path: Path) -> None:
    gpu_nodes(1, gpus=8)
    proc, url = serve(tmp_path, "--backend", "kubernetes", "--kubeconfig", str(kubeconfig), "--namespace", namespace)
    follower = None
    try:
        wait(lambda: gpupool(url, "status")["pool"]["nodes"], what="the node in the pool")
        gpupool(url, "projects", "set", "vision", "--guarantee", "8")
        job = gpupool(url, "submit", "--project", "vision", "--gpus", "1", "--", "python", "train.py")
        pod = f"gpupool-{job['id']}-1"
        with Kubelet(api, namespace) as kubelet:
            wait(lambda: pod in kubelet.started, what="the pod running")
            kubelet.print(pod, "epoch 1 loss 0.93")
            shown = wait(lambda: "epoch 1 loss 0.93" in (r := cli(url, "logs", job["id"])).stdout and r.stdout,
                         what="the running pod's line in gpupool logs")
            assert api.read_namespaced_pod(pod, namespace).status.phase == "Running"
            assert gpupool(url, "describe", job["id"])["state"] == "running"
            assert shown == f"--- gpupool: attempt 1 of {job['id']} (pod {pod}) ---\nepoch 1 loss 0.93\n"

            env = {**os.environ, "GPUPOOL_URL": url, "GPUPOOL_TOKEN": TOKEN}
            follower = subprocess.Popen([sys.executable, "-m", "gpupool", "logs", "-f", job["id"]], env=env,
                                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            lines: queue.Queue[str] = queue.Queue()
            assert follower.stdout is not None
            threading.Thread(target=lambda: [lines.put(x) for x in follower.stdout], daemon=True).start()  # type: ignore[union-attr]
            got = [lines.get(timeout=30), lines.get(timeout=30)]
            assert got[1] == "epoch 1 loss 0.93\n"
            for i in range(2, 6):  # lines across seconds, some in the same second
                kubelet.print(pod, f"epoch {i} loss 0.{90 - i}")
                got.append(lines.get(timeout=30))
                assert got[-1] == f"epoch {i} loss 0.{90 - i}\n"  # shown while it runs
                time.sleep(0.4 * (i % 2))
            kubelet.print(pod, "saved checkpoint\nbye")  # printed just before the end
            kubelet.finish(pod, 0)
            wait(lambda: gpupool(url, "describe", job["id"])["state"] == "succeeded", what="the job succeeded")
            out, err = follower.communicate(timeout=60)
            rest = []
            while not lines.empty():
                rest.append(lines.get())
        seen = "".join(got) + "".join(rest) + out
        expected = [f"--- gpupool: attempt 1 of {job['id']} (pod {pod}) ---", "epoch 1 loss 0.93",
                    *[f"epoch {i} loss 0.{90 - i}" for i in range(2, 6)], "saved checkpoint", "bye"]
        final = cli(url, "logs", job["id"]).stdout  # the archived log: every line, each once, in order
        assert final.splitlines() == expected
        # The follower saw every line, each once, the two printed just before the end included: it is told
        # "end of log" only once the pod's final copy has landed.
        assert seen == final, err
    finally:
        if follower is not None and follower.poll() is None:
            follower.kill()
        proc.terminate()
        proc.wait(30)


@pytest.fixture
def pod(api: Any, namespace: str) -> Any:
    """A bound pod on a fresh node, its kubelet playing, and a LiveLogs copying it into tmp/job.log."""

    class Pod:
        pass

    node = f"{namespace}-n0"
    make_gpu_node(api, node, 1)
    api.create_namespaced_pod(namespace, {"metadata": {"name": "p"}, "spec": {
        "schedulerName": "gpupool", "containers": [{"name": "job", "image": "busybox"}]}})
    api.create_namespaced_pod_binding("p", namespace, {"metadata": {"name": "p"},
                                                       "target": {"kind": "Node", "name": node}},
                                      _preload_content=False)
    with Kubelet(api, namespace) as kubelet:
        wait(lambda: "p" in kubelet.started, what="the pod running")
        p = Pod()
        p.kubelet = kubelet  # type: ignore[attr-defined]
        yield p
    api.delete_node(node)


def copier(api: Any, namespace: str, tmp_path: Path) -> LiveLogs:
    """A LiveLogs for pod p of job J1, whose log is being read: every ``_due()`` offers it."""
    logs = LiveLogs(api, namespace, lambda job: tmp_path / job / "job.log", lambda: [("J1", 1, "p")],
                    viewed_s=0.0)
    logs.viewed("J1")
    return logs


def test_chunked_copies_across_seconds_then_a_restart_and_the_end_copy_each_line_once(
        api: Any, namespace: str, pod: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(live_logs, "CHUNK_BYTES", 100)  # a few lines per request: exercises limitBytes
    first = copier(api, namespace, tmp_path)
    printed = []
    for burst in range(5):
        for k in range(7):  # several lines in one second, bursts in different seconds
            printed.append(f"burst {burst} line {k} " + "x" * (k * 9))
            pod.kubelet.print("p", printed[-1])
        (due,) = first._due()
        first._poll(due)
        if burst == 2:
            first = copier(api, namespace, tmp_path)  # a restarted scheduler: goes on from the saved position
        time.sleep(0.35)
    pod.kubelet.print("p", "last words")
    printed.append("last words")
    first.finish("J1", 1, "p")
    text = (tmp_path / "J1" / "job.log").read_text()
    assert text.splitlines() == ["--- gpupool: attempt 1 of J1 (pod p) ---", *printed]
    assert not (tmp_path / "J1" / "job.log.live").exists()
    assert first.requests > 10  # chunked: many small requests, not one


def test_a_pod_gone_before_its_last_read_says_its_tail_may_be_missing(api: Any, namespace: str, pod: Any,
                                                                     tmp_path: Path) -> None:
    logs = copier(api, namespace, tmp_path)
    pod.kubelet.print("p", "step 1")
    (due,) = logs._due()
    logs._poll(due)
    api.delete_namespaced_pod("p", namespace, grace_period_seconds=0)
    wait(lambda: not [x for x in api.list_namespaced_pod(namespace).items if x.metadata.name == "p"],
         what="the pod gone")
    logs.finish("J1", 1, "p")
    lines = (tmp_path / "J1" / "job.log").read_text().splitlines()
    assert lines[:2] == ["--- gpupool: attempt 1 of J1 (pod p) ---", "step 1"]
    assert lines[2].startswith("(gpupool: pod p was gone before its last output was read")
    assert len(lines) == 3


def test_the_poller_spends_its_requests_where_someone_reads(api: Any, namespace: str, pod: Any,
                                                           tmp_path: Path) -> None:
    """Unread pods are polled every background_s at most; a pod whose log is read, every viewed_s."""
    many = [(f"J{i}", 1, "p" if i == 0 else f"absent-{i}") for i in range(50)]
    logs = LiveLogs(api, namespace, lambda job: tmp_path / job / "job.log", lambda: many, viewed_s=0.2,
                    background_s=5.0, background_rate=20.0)
    logs.start()
    try:
        time.sleep(2.0)
        quiet = logs.requests
        logs.viewed("J0")
        pod.kubelet.print("p", "hello")
        wait(lambda: "hello" in ((tmp_path / "J0" / "job.log").read_text()
                                 if (tmp_path / "J0" / "job.log").exists() else ""), what="the read pod's line")
        time.sleep(1.0)
        busy = logs.requests - quiet
    finally:
        logs.stop()
    # 50 pods, 5 s apart at least: about 20 requests in the first 2 s (spread), never 50 x 10 polls.
    assert quiet <= 40, quiet
    assert busy >= 4, busy  # the read one, about every 0.2 s


def test_an_api_server_away_at_the_end_is_tried_three_times_then_named(
        namespace: str, kubeconfig: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kubernetes import client, config

    from tests.kube.test_node_agent import kubeconfig_as

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    away = client.CoreV1Api(config.new_client_from_config(
        config_file=str(kubeconfig_as(kubeconfig, tmp_path, server=f"https://127.0.0.1:{port}"))))
    monkeypatch.setattr(live_logs, "FINAL_RETRY_S", (0.1, 0.2))
    logs = LiveLogs(away, namespace, lambda job: tmp_path / job / "job.log", lambda: [])
    logs.finish("J1", 1, "p")
    assert logs.requests == 3
    lines = (tmp_path / "J1" / "job.log").read_text().splitlines()
    assert lines[0] == "--- gpupool: attempt 1 of J1 (pod p) ---"
    assert lines[1].startswith("(the log of pod p could not be read: ") and len(lines) == 2
