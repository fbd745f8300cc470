"""Test helpers for the Kubernetes backend: GPU nodes, and a stand-in kubelet (scripts/kube runs none).

The API server and its controllers are real; only the kubelet's part is
played here. Every node made by :func:`make_gpu_node` gets its heartbeat (its
Lease in ``kube-node-lease``, renewed as a kubelet does), so the
node-lifecycle controller keeps it Ready and untainted for as long as it
exists. :class:`Kubelet` reports bound pods as running, finishes them with an
exit code when a test says so, and, as a kubelet does, answers a graceful
deletion by ending the container (the checkpoint signal's exit code) and
removing the pod.
"""

from __future__ import annotations

import datetime as dt
import http.server
import shutil
import ssl
import subprocess
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path
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
    node = api.create_node({"apiVersion": "v1", "kind": "Node",
                            "metadata": {"name": name, "labels": labels, "annotations": annotations or {}}})
    set_node_status(api, name, gpus, ready)
    HEARTBEATS.beat(api, name, node.metadata.uid)
    api.patch_node(name, {"spec": {"taints": []}})  # admission added node.kubernetes.io/not-ready


class NodeHeartbeats:
    """Renews the Lease of every node a test made, as each node's kubelet would (every 5 s here).

    The node-lifecycle controller takes a node whose Lease is older than its
    grace period (50 s by default) for lost: it marks it Unknown, taints it unreachable
    and evicts its pods. The Lease is owned by its Node, so the garbage
    collector deletes it with the node; a node that is gone drops out of the
    loop. One daemon thread for the whole test session.
    """

    PERIOD_S = 5.0
    DURATION_S = 40

    def __init__(self) -> None:
        self._nodes: dict[str, tuple[client.CoordinationV1Api, str]] = {}  # name -> (api, node uid)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def beat(self, api: client.CoreV1Api, node: str, uid: str) -> None:
        """Renew ``node``'s Lease now (creating it) and from now on, until the node is deleted."""
        coord = client.CoordinationV1Api(api.api_client)
        self._renew(coord, node, uid)
        with self._lock:
            self._nodes[node] = (coord, uid)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, daemon=True, name="test-node-heartbeats")
                self._thread.start()

    def _renew(self, coord: client.CoordinationV1Api, node: str, uid: str) -> bool:
        """Renew (or create) the Lease; False once the node is gone."""
        now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        try:
            coord.patch_namespaced_lease(node, "kube-node-lease", {"spec": {"renewTime": now}})
            return True
        except ApiException as e:
            if e.status != 404:
                raise
        try:
            coord.create_namespaced_lease("kube-node-lease", {
                "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": node, "ownerReferences": [
                    {"apiVersion": "v1", "kind": "Node", "name": node, "uid": uid}]},
                "spec": {"holderIdentity": node, "leaseDurationSeconds": self.DURATION_S, "renewTime": now}})
            return True
        except ApiException as e:
            if e.status == 409:
                return True
            if e.status == 404 or e.status == 422:
                return False
            raise

    def _run(self) -> None:
        while True:
            time.sleep(self.PERIOD_S)
            with self._lock:
                nodes = list(self._nodes.items())
            for name, (coord, uid) in nodes:
                try:
                    alive = client.CoreV1Api(coord.api_client).read_node(name).metadata.uid == uid
                    if alive:
                        alive = self._renew(coord, name, uid)
                except ApiException as e:
                    alive = e.status != 404
                except Exception:  # the API server is gone (end of the session): stop beating
                    alive = False
                if not alive:
                    with self._lock:
                        self._nodes.pop(name, None)


HEARTBEATS = NodeHeartbeats()


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


def rfc3339_nano(ns: int) -> str:
    """Go's time.RFC3339Nano in UTC, as a kubelet stamps log lines: trailing zeros of the fraction dropped."""
    seconds, frac = divmod(ns, 1_000_000_000)
    base = dt.datetime.fromtimestamp(seconds, dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S")
    fraction = f"{frac:09d}".rstrip("0")
    return f"{base}.{fraction}Z" if fraction else f"{base}Z"


class LogServer:
    """The kubelet's container log endpoint, which the API server proxies ``pods/log`` to.

    A kubelet serves HTTPS on the port its Node's ``status.daemonEndpoints``
    names; the API server (no ``--kubelet-certificate-authority`` here) does
    not check its certificate, so a self-signed one serves. It answers
    ``GET /containerLogs/NS/POD/CONTAINER`` with ``timestamps``, ``sinceTime``
    (whole seconds, as the API server passes it on), ``sinceSeconds``,
    ``tailLines`` and ``limitBytes`` as a kubelet does; ``follow`` is not
    played (the answer ends with what was printed so far).
    """

    def __init__(self) -> None:
        self._lines: dict[tuple[str, str], list[tuple[int, str]]] = {}  # (ns, pod) -> [(ns time, text)]
        self._lock = threading.Lock()
        self._dir = Path(tempfile.mkdtemp(prefix="test-kubelet-"))
        cert, key = self._dir / "kubelet.crt", self._dir / "kubelet.key"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                        "-nodes", "-days", "1", "-subj", "/CN=test-kubelet", "-keyout", str(key), "-out", str(cert)],
                       check=True, capture_output=True)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(str(cert), str(key))
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 (the http.server name)
                server._answer(self)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True, name="test-kubelet-logs")
        self._thread.start()

    def print(self, namespace: str, pod: str, text: str) -> None:
        """The container writes ``text`` (one line per line of it), stamped now."""
        with self._lock:
            lines = self._lines.setdefault((namespace, pod), [])
            for line in text.splitlines():
                lines.append((max(time.time_ns(), lines[-1][0] if lines else 0), line))

    def _answer(self, req: http.server.BaseHTTPRequestHandler) -> None:
        url = urllib.parse.urlsplit(req.path)
        parts = url.path.strip("/").split("/")
        q = {k: v[-1] for k, v in urllib.parse.parse_qs(url.query).items()}
        if len(parts) != 4 or parts[0] != "containerLogs" or parts[3] != "job":
            req.send_error(404, "no such container")
            return
        with self._lock:
            lines = list(self._lines.get((parts[1], parts[2]), []))
        if "sinceTime" in q:
            since = dt.datetime.fromisoformat(q["sinceTime"].replace("Z", "+00:00")).timestamp()
            lines = [x for x in lines if x[0] >= int(since * 1e9)]
        elif "sinceSeconds" in q:
            lines = [x for x in lines if x[0] >= time.time_ns() - int(q["sinceSeconds"]) * 1_000_000_000]
        if "tailLines" in q:
            lines = lines[-int(q["tailLines"]):] if int(q["tailLines"]) else []
        stamp = q.get("timestamps") == "true"
        body = "".join(f"{rfc3339_nano(t)} {text}\n" if stamp else f"{text}\n" for t, text in lines).encode()
        if "limitBytes" in q:
            body = body[:int(q["limitBytes"])]
        req.send_response(200)
        req.send_header("Content-Type", "text/plain")
        req.send_header("Content-Length", str(len(body)))
        req.end_headers()
        req.wfile.write(body)

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        shutil.rmtree(self._dir, ignore_errors=True)


class Kubelet:
    """Plays every node's kubelet for one namespace, in a thread polling the API server.

    Its :class:`LogServer` serves the pods' output (``print``): the first time
    a pod is bound to a node, the node's status gets the server's address and
    port, as a kubelet registers its endpoint.
    """

    def __init__(self, api: client.CoreV1Api, namespace: str, stop_exit_code: int = 143,
                 unpullable: dict[str, str] | None = None) -> None:
        self.api = api
        self.ns = namespace
        self.stop_exit_code = stop_exit_code
        self.unpullable = dict(unpullable or {})
        """Image -> the waiting reason a pod of it gets instead of running (ImagePullBackOff, InvalidImageName)."""
        self.started: list[str] = []  # pods it reported running, in order
        self.stopped: list[str] = []  # pods it ended because they were deleted
        self._finish: dict[str, int] = {}
        self._lock = threading.Lock()
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="test-kubelet")
        self.logs: LogServer | None = None
        self._registered: set[str] = set()  # nodes whose status names our log server

    def __enter__(self) -> Kubelet:
        self.logs = LogServer()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._halt.set()
        self._thread.join(5)
        if self.logs is not None:
            self.logs.close()

    def print(self, pod: str, text: str) -> None:
        """The pod's container prints ``text`` (served by the pod log API)."""
        assert self.logs is not None, "print needs the kubelet started (with Kubelet(...) as kubelet)"
        self.logs.print(self.ns, pod, text)

    def _register(self, node: str) -> None:
        if node in self._registered or self.logs is None:
            return
        self.api.patch_node_status(node, {"status": {
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": self.logs.port}}}})
        self._registered.add(node)

    def finish(self, pod: str, exit_code: int) -> None:
        """End the pod's container on its own with ``exit_code`` (at the next poll)."""
        with self._lock:
            self._finish[pod] = exit_code

    def _run(self) -> None:
        while not self._halt.is_set():
            try:
                pods = self.api.list_namespaced_pod(self.ns).items
            except ApiException:
                pods = []
            for pod in pods:
                try:
                    self._step(pod)
                except ApiException:  # this pod or its node went meanwhile: as each node's kubelet, the rest go on
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
        self._register(pod.spec.node_name)
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
        image = pod.spec.containers[0].image
        if code is not None:
            self._terminated(pod, code, "Succeeded" if code == 0 else "Failed")
        elif image in self.unpullable:  # as a kubelet says it: Pending, the container waiting, and why
            reason = self.unpullable[image]
            message = (f'Back-off pulling image "{image}"' if reason == "ImagePullBackOff"
                       else f'Failed to apply default image tag "{image}": invalid reference format')
            if not statuses or (statuses[0].state.waiting or client.V1ContainerStateWaiting()).reason != reason:
                self.api.patch_namespaced_pod_status(name, self.ns, {"status": {
                    "phase": "Pending", "containerStatuses": [{
                        "name": "job", "ready": False, "restartCount": 0, "image": image, "imageID": "",
                        "state": {"waiting": {"reason": reason, "message": message}}}]}})
        elif not statuses:
            self.started.append(name)  # before the report: whoever sees the pod Running finds it here already
            try:
                self.api.patch_namespaced_pod_status(name, self.ns, {"status": {
                    "phase": "Running", "startTime": now_text(), "podIP": "127.0.0.1",
                    "containerStatuses": [{"name": "job", "ready": True, "restartCount": 0,
                                           "image": pod.spec.containers[0].image, "imageID": "",
                                           "state": {"running": {"startedAt": now_text()}}}]}})
            except Exception:
                self.started.remove(name)
                raise


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
