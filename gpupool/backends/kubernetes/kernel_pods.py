"""A build share's kernel as a pod of its own (the backend's ``RunsKernelPods``; docs/kubernetes.md).

On a cluster the user's Jupyter server asks for no GPU. Its GPU kernels are
pods that gpupool makes when their share is granted, on the share's node, with
the share's GPU environment, as the user's uid, with no service-account token.
The kernel's connection file (ports and HMAC key) and the variables the server
wants kept secret (the user's scheduler token) arrive with the share's request;
they are held here in memory only, then written into a Secret owned by the pod
(so it goes when the pod goes) before the pod is bound: they never reach the
store, the pod spec or an annotation. A NetworkPolicy, also owned by the pod,
admits connections to it only from its owner's Jupyter server pod.

The kernel pod restarts its container in place (``restartPolicy: Always``): a
kernel restart keeps the pod, its address, its share and its connection file.
"""

from __future__ import annotations

import base64
import json
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from gpupool.backends.base import JobFacts, Launch
from gpupool.backends.kubernetes import objects as ob
from gpupool.backends.kubernetes.calls import START_GIVE_UP_S, Calls, Refused, post_json, raw_json, refusal
from gpupool.backends.kubernetes.executor import PodExecutor
from gpupool.backends.kubernetes.names import CONTAINER, JOB_LABEL, pod_name
from gpupool.backends.kubernetes.objects import Obj
from gpupool.backends.kubernetes.pods import PodHandle, PodSettings, label_value, pod_manifest
from gpupool.wire.errors import InvalidRequest
from gpupool.wire.schemas import KERNEL_POD_LABEL

log = logging.getLogger("gpupool.backends.kubernetes")

COMPONENT_LABEL = "gpupool.io/component"
KERNEL_COMPONENT = "kernel"
USER_LABEL = "gpupool.io/user"
ROLE_LABEL = "gpupool.io/role"
SERVER_ROLE = "jupyter-server"
OWNER_LABEL = "gpupool.io/kernel-owner"
"""A Jupyter server pod says ``gpupool.io/role: jupyter-server`` and ``gpupool.io/kernel-owner: <user>`` (the
user as :func:`label_value` writes it; the Hub's KubeSpawner config sets both): the kernel pods of that user admit
connections from it, and from nothing else (deploy/kubernetes/kernel-network-policy.yaml denies the rest)."""
CONNECTION_DIR = "/gpupool/kernel"
CONNECTION_FILE = f"{CONNECTION_DIR}/connection.json"
POD_IP_VAR = "GPUPOOL_POD_IP"
SECRET_MODE = 0o440  # the user (fsGroup) reads it; nobody else in the pod


def private_name(pod: str) -> str:
    """The Secret and the NetworkPolicy of a kernel pod: named after it, owned by it."""
    return f"{pod}-kernel"


def pod_argv(argv: list[str]) -> list[str]:
    """The kernelspec's argv for the pod: ``{connection_file}`` names the file mounted from the Secret.

    The file says ``ip: 0.0.0.0``: the kernel listens on the pod's addresses (the only one it has is the
    pod IP, where the server connects; the NetworkPolicy decides who may). ipykernel must not be told
    another address: it would then rewrite the file, which is read-only.
    """
    return [a.replace("{connection_file}", CONNECTION_FILE) for a in argv]


def connection_file(request: dict[str, Any]) -> str:
    """The kernel's connection file (JSON): the request's ports and key, listening on every address."""
    c = dict(request["connection"])
    c.setdefault("signature_scheme", "hmac-sha256")
    c.setdefault("transport", "tcp")
    c["ip"] = "0.0.0.0"
    return json.dumps(c, sort_keys=True)


@dataclass(frozen=True)
class KernelHome:
    """The user's home in kernel pods (the admin's kube_kernel_home_claim and _path): a claim per user."""

    claim: str  # a PersistentVolumeClaim name template: "{user}" is the share's user
    path: str

    @staticmethod
    def of(claim: str | None, path: str) -> KernelHome | None:
        return KernelHome(claim, path) if claim else None

    def volume(self, user: str) -> tuple[Obj, Obj]:
        """(the pod's volume, the container's mount)."""
        return ({"name": "home", "persistentVolumeClaim": {"claimName": self.claim.format(user=user)}},
                {"name": "home", "mountPath": self.path})


def kernel_pod_manifest(launch: Launch, user: str, request: dict[str, Any], settings: PodSettings,
                        home: KernelHome | None = None) -> Obj:
    """The kernel's pod: a job pod of the share (labels, GPU environment, placement), run as ``uid``, the
    connection file mounted from its Secret, the secret variables read from it, no API token, and the
    user's home claim when the admin names one."""
    plain = Launch(launch.job_id, launch.attempt, pod_argv(list(request["argv"])), request.get("workdir") or "",
                   launch.user, launch.project, dict(request.get("env") or {}), launch.gpu_env, launch.assignment,
                   image=request.get("image") or "", placement=launch.placement)
    manifest = pod_manifest(plain, PodSettings(settings.namespace, settings.image, settings.scheduler_name,
                                               settings.grace_s, None, settings.start_timeout_s))
    name = manifest["metadata"]["name"]
    manifest["metadata"]["labels"].update({COMPONENT_LABEL: KERNEL_COMPONENT, USER_LABEL: label_value(user)})
    spec = manifest["spec"]
    spec["restartPolicy"] = "Always"  # a kernel restart: the same pod, share and address, a fresh process
    spec["automountServiceAccountToken"] = False
    spec["enableServiceLinks"] = False
    security: dict[str, Any] = {}
    if request.get("uid") is not None:
        security.update(runAsUser=int(request["uid"]), runAsNonRoot=int(request["uid"]) != 0)
    if request.get("gid") is not None:
        security.update(runAsGroup=int(request["gid"]), fsGroup=int(request["gid"]))
    if security:
        spec["securityContext"] = security
    secret = private_name(name)
    spec["volumes"] = [{"name": "kernel-connection", "secret": {
        "secretName": secret, "defaultMode": SECRET_MODE, "items": [{"key": "connection.json",
                                                                     "path": "connection.json"}]}}]
    container = spec["containers"][0]
    # A kernel that exits at start (an image without ipykernel, a broken kernelspec) says why in its status.
    container["terminationMessagePolicy"] = "FallbackToLogsOnError"
    container["volumeMounts"] = [{"name": "kernel-connection", "mountPath": CONNECTION_DIR, "readOnly": True}]
    env = [e for e in container["env"] if e["name"] != POD_IP_VAR]
    env.insert(0, {"name": POD_IP_VAR, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    env += [{"name": k, "valueFrom": {"secretKeyRef": {"name": secret, "key": f"env.{k}"}}}
            for k in sorted(request.get("secret_env") or {})]
    container["env"] = env
    if home is not None:
        volume, mount = home.volume(user)
        spec["volumes"].append(volume)
        container["volumeMounts"].append(mount)
    return manifest


def owned_by(pod: Obj) -> list[dict[str, Any]]:
    return [{"apiVersion": "v1", "kind": "Pod", "name": ob.name(pod), "uid": ob.uid(pod),
             "blockOwnerDeletion": False}]


def kernel_secret(pod: Obj, request: dict[str, Any]) -> Obj:
    """The Secret of a kernel pod: its connection file and secret variables (``env.NAME``), owned by the pod."""
    data = {"connection.json": connection_file(request)}
    data.update({f"env.{k}": v for k, v in (request.get("secret_env") or {}).items()})
    return {"apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": private_name(ob.name(pod)), "namespace": ob.namespace(pod),
                         "labels": {JOB_LABEL: ob.labels(pod).get(JOB_LABEL, ""),
                                    COMPONENT_LABEL: KERNEL_COMPONENT},
                         "ownerReferences": owned_by(pod)},
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}}


def kernel_network_policy(pod: Obj, user: str, request: dict[str, Any]) -> Obj:
    """Only the owner's Jupyter server pod reaches the kernel's ports (deploy/ denies the rest)."""
    c = request["connection"]
    ports = [{"protocol": "TCP", "port": int(c[f"{k}_port"])} for k in ("shell", "iopub", "stdin", "control", "hb")]
    return {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
            "metadata": {"name": private_name(ob.name(pod)), "namespace": ob.namespace(pod),
                         "labels": {JOB_LABEL: ob.labels(pod).get(JOB_LABEL, ""),
                                    COMPONENT_LABEL: KERNEL_COMPONENT},
                         "ownerReferences": owned_by(pod)},
            "spec": {"podSelector": {"matchLabels": {JOB_LABEL: ob.labels(pod).get(JOB_LABEL, ""),
                                                     COMPONENT_LABEL: KERNEL_COMPONENT}},
                     "policyTypes": ["Ingress"],
                     "ingress": [{"from": [{"namespaceSelector": {}, "podSelector": {"matchLabels": {
                         OWNER_LABEL: label_value(user), ROLE_LABEL: SERVER_ROLE}}}], "ports": ports}]}}


CRASH_LOOP = "CrashLoopBackOff"
"""The kubelet's reason for a container it keeps restarting because it keeps exiting."""
TAIL_CHARS = 600


def _last_end(cs: Obj) -> Obj | None:
    return ob.terminated(cs) or (cs.get("lastState") or {}).get("terminated")


def last_exit(cs: Obj) -> str:
    """A container's latest exit as a user reads it: its code and the last lines it printed (the kubelet's
    termination message, which ``FallbackToLogsOnError`` fills from the log's tail); "" if it never exited."""
    term = _last_end(cs)
    if not term:
        return ""
    code = ob.exit_code(term)
    words = f"its container exited with code {code}" if code is not None else "its container ended"
    tail = " | ".join(line.strip() for line in str(term.get("message") or "").strip().splitlines()[-5:])
    return f"{words}: {tail[-TAIL_CHARS:]}" if tail else words


def describe_pod(pod: Obj | None, name: str) -> dict[str, Any]:
    """What the Job shows of its kernel pod: where it listens, and why it does not yet (the kubelet's reason,
    and for a container that exited, its code and last lines: a kernel that cannot start says why)."""
    if pod is None:
        return {"name": name, "ip": "", "phase": "Creating", "ready": False, "restarts": 0, "reason": "",
                "last_exit_code": None, "message": "the kernel's pod is being created"}
    statuses = [cs for cs in ob.container_statuses(pod) if cs.get("name") == CONTAINER]
    cs = statuses[0] if statuses else {}
    waiting = ob.waiting(cs) or {}
    term = ob.terminated(cs)
    reason = "" if cs.get("ready") else str(waiting.get("reason") or (term or {}).get("reason") or "")
    if not ob.node_name(pod):
        message = "the kernel's pod is being bound to its node"
    elif waiting.get("reason") == CRASH_LOOP:
        message = f"{CRASH_LOOP}: {last_exit(cs) or waiting.get('message') or 'its container keeps exiting'}"
    elif waiting:
        message = f"{waiting.get('reason') or 'waiting'}: {waiting.get('message') or ''}".strip(": ")
    elif term is not None:
        message = last_exit(cs)
    elif not cs.get("ready"):
        message = "the kernel's container is starting"
    else:
        message = ""
    return {"name": name, "ip": str(ob.status(pod).get("podIP") or ""), "phase": str(ob.phase(pod) or "Pending"),
            "ready": bool(cs.get("ready")), "restarts": int(cs.get("restartCount") or 0), "reason": reason,
            "last_exit_code": ob.exit_code(end) if (end := _last_end(cs)) is not None else None, "message": message}


class KernelPodRunner:
    """The Kubernetes backend's :class:`gpupool.backends.base.KernelPods`: requests in memory, pods by the
    :class:`PodExecutor` (watched, stopped and recovered as any attempt's)."""

    def __init__(self, executor: PodExecutor, settings: PodSettings, calls: Calls,
                 home: KernelHome | None = None) -> None:
        self.executor = executor
        self.home = home
        self.settings = settings
        self.calls = calls
        self._lock = threading.Lock()
        self._requests: dict[str, tuple[str, dict[str, Any]]] = {}  # job id -> (user, request): secrets inside
        self._pods: dict[str, str] = {}  # job id -> its kernel pod's name

    def check(self, request: dict[str, Any]) -> None:
        if not str(request.get("connection", {}).get("key") or ""):
            raise InvalidRequest("kernel_pod.connection.key must be the kernel's HMAC key (not empty)")
        argv = request.get("argv") or []
        if not argv or not argv[0]:
            raise InvalidRequest("kernel_pod.argv must be the kernel's command")

    def expect(self, job_id: str, user: str, request: dict[str, Any]) -> None:
        with self._lock:
            self._requests[job_id] = (user, request)

    def runs(self, job: JobFacts) -> bool:
        return job.labels.get(KERNEL_POD_LABEL) == "true"

    def launch(self, launch: Launch) -> PodHandle:
        with self._lock:
            held = self._requests.get(launch.job_id)
        if held is None:
            raise RuntimeError("the scheduler restarted before the pod was made and no longer has the kernel's "
                               "connection; start the kernel again")
        user, request = held
        manifest = kernel_pod_manifest(launch, user, request, self.settings, self.home)
        name = pod_name(launch.job_id, launch.attempt)
        with self._lock:
            self._pods[launch.job_id] = name
        node = str(launch.assignment.get("node", ""))
        return self.executor.launch_pod(launch.job_id, launch.attempt, name, node, manifest,
                                        before_bind=lambda pod: self._private_parts(pod, user, request))

    def _private_parts(self, pod: Obj, user: str, request: dict[str, Any]) -> None:
        """Before the bind (worker thread): the pod's Secret and NetworkPolicy, both owned by it."""
        ns, api = self.settings.namespace, self.executor.api
        net = client.NetworkingV1Api(api.api_client)
        self._create(f"/api/v1/namespaces/{ns}/secrets", kernel_secret(pod, request),
                     lambda n: api.delete_namespaced_secret(n, ns))
        self._create(f"/apis/networking.k8s.io/v1/namespaces/{ns}/networkpolicies",
                     kernel_network_policy(pod, user, request), lambda n: net.delete_namespaced_network_policy(n, ns))

    def _create(self, path: str, body: Obj, delete: Callable[[str], object]) -> None:
        """POST ``body``; one of the same name (left by an earlier pod of this attempt, whose owner is gone)
        is replaced; a refusal raises :class:`Refused` (the share waits, as for a refused pod)."""
        name = body["metadata"]["name"]

        def post() -> Obj:
            try:
                return raw_json(post_json(self.executor.api, path, body))
            except ApiException as e:
                if e.status == 409:
                    delete(name)
                    return raw_json(post_json(self.executor.api, path, body))
                why = refusal(e)
                if why is None:
                    raise
                raise Refused(f"the API server refused the kernel's {body['kind']} {name}: {why}") from e

        self.calls.retrying("start", post, START_GIVE_UP_S)

    def describe(self, job_id: str) -> dict[str, Any] | None:
        with self._lock:
            name = self._pods.get(job_id)
        if name is None:
            name = self._find(job_id)
            if name is None:
                return None
        return describe_pod(self.executor.pod(name), name)

    def _find(self, job_id: str) -> str | None:
        """After a restart: the share's kernel pod among our pods (its job label)."""
        want = label_value(job_id)
        for attempt in range(1, 4):
            name = pod_name(job_id, attempt)
            pod = self.executor.pod(name)
            if pod is not None and ob.labels(pod).get(JOB_LABEL) == want:
                with self._lock:
                    self._pods[job_id] = name
                return name
        return None

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._requests.pop(job_id, None)
            self._pods.pop(job_id, None)
