"""Test helpers for the Kubernetes backend: GPU nodes, and a stand-in kubelet (there is none in ../shared/kube).

The API server is real; only the kubelet's part is played here: it reports
bound pods as running, finishes them with an exit code when a test says so,
and, as a kubelet does, answers a graceful deletion by ending the container
(the checkpoint signal's exit code) and removing the pod.
"""

from __future__ import annotations

import datetime as dt
import threading
import time
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException


def now_text() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def make_gpu_node(api: client.CoreV1Api, name: str, gpus: int = 8, *, product: str = "NVIDIA-A100-SXM4-80GB",
                  memory_mib: int = 81920, pool: str | None = None, annotations: dict[str, str] | None = None,
                  ready: bool = True) -> None:
    """A Node with ``gpus`` allocatable nvidia.com/gpu, GFD labels, Ready, without the not-ready taint."""
    labels = {"nvidia.com/gpu.product": product, "nvidia.com/gpu.memory": str(memory_mib),
              "kubernetes.io/hostname": name}
    if pool is not None:
        labels["gpupool.io/pool"] = pool
    api.create_node({"apiVersion": "v1", "kind": "Node",
                     "metadata": {"name": name, "labels": labels, "annotations": annotations or {}}})
    set_node_status(api, name, gpus, ready)
    api.patch_node(name, {"spec": {"taints": []}})  # admission added node.kubernetes.io/not-ready


def set_node_status(api: client.CoreV1Api, name: str, gpus: int = 8, ready: bool = True) -> None:
    res = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": str(gpus)}
    t = now_text()
    api.patch_node_status(name, {"status": {
        "capacity": res, "allocatable": res,
        "conditions": [{"type": "Ready", "status": "True" if ready else "False", "reason": "KubeletReady",
                        "message": "test", "lastHeartbeatTime": t, "lastTransitionTime": t}],
    }})


def pod_env(pod: Any) -> dict[str, str]:
    return {e.name: e.value for e in pod.spec.containers[0].env or []}


class Kubelet:
    """Plays every node's kubelet for one namespace, in a thread polling the API server."""

    def __init__(self, api: client.CoreV1Api, namespace: str, stop_exit_code: int = 143) -> None:
        self.api = api
        self.ns = namespace
        self.stop_exit_code = stop_exit_code
        self.started: list[str] = []  # pods it reported running, in order
        self.stopped: list[str] = []  # pods it ended because they were deleted
        self._finish: dict[str, int] = {}
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="test-kubelet")

    def __enter__(self) -> Kubelet:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._halt.set()
        self._thread.join(5)

    def finish(self, pod: str, exit_code: int) -> None:
        """End the pod's container on its own with ``exit_code`` (at the next poll)."""
        with self._lock:
            self._finish[pod] = exit_code

    def _run(self) -> None:
        while not self._halt.is_set():
            try:
                for pod in self.api.list_namespaced_pod(self.ns).items:
                    self._step(pod)
            except ApiException:
                pass
            self._halt.wait(0.05)

    def _terminated(self, pod: Any, code: int, phase: str | None) -> None:
        status: dict[str, Any] = {"containerStatuses": [{
            "name": "job", "ready": False, "restartCount": 0, "image": pod.spec.containers[0].image, "imageID": "",
            "state": {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                                     "startedAt": now_text(), "finishedAt": now_text()}}}]}
        if phase:
            status["phase"] = phase
        self.api.patch_namespaced_pod_status(pod.metadata.name, self.ns, {"status": status})

    def _step(self, pod: Any) -> None:
        name = pod.metadata.name
        if not pod.spec.node_name:
            return  # not bound: nothing runs it
        statuses = pod.status.container_statuses or []
        done = any(s.state.terminated for s in statuses if s.state)
        if pod.metadata.deletion_timestamp is not None:
            if not done:  # the container got SIGTERM and ended (checkpointed)
                self._terminated(pod, self.stop_exit_code, None)
                self.stopped.append(name)
            self.api.delete_namespaced_pod(name, self.ns, grace_period_seconds=0)
            return
        if done:
            return
        with self._lock:
            code = self._finish.pop(name, None)
        if code is not None:
            self._terminated(pod, code, "Succeeded" if code == 0 else "Failed")
        elif not statuses:
            self.api.patch_namespaced_pod_status(name, self.ns, {"status": {
                "phase": "Running", "startTime": now_text(),
                "containerStatuses": [{"name": "job", "ready": True, "restartCount": 0,
                                       "image": pod.spec.containers[0].image, "imageID": "",
                                       "state": {"running": {"startedAt": now_text()}}}]}})
            self.started.append(name)


def wait(pred: Any, timeout: float = 20.0, what: str = "condition") -> Any:
    """Poll ``pred`` (blocking) until truthy; fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)
