"""GPU use per pod: the node agent measures and reports it; the backend maps pod UIDs to jobs.

Agent side (``gpupool node-agent --scheduler URL``, in its own thread): every
``--use-interval`` seconds it samples this node's GPUs per process with the
same inventory code the local backend uses (NVML's per-process SM
utilisation and memory; on simulated GPUs the processes' own
``gpupool.sim_use`` reports), maps each pid to its pod by cgroup
(:mod:`gpupool.inventory.cgroups`), sums per pod and GPU, and sends
``POST /api/v1/nodes/{node}/use`` with its token (its pod's projected
service account token, re-read for each report, or the shared node-agent
token). Processes in
no pod (the host's, a container outside Kubernetes) are left out: the
scheduler could not name their owner anyway. A GPU that cannot measure
processes is sent with ``measured: false``, so its pods stay *unmeasured*,
never idle. One direct request per node per interval, and no write to the
API server: the Node object is patched only when its GPUs change.

A refused report (bad token, unknown GPU) is logged once per distinct
answer and retried at the next interval; a scheduler that does not answer is
retried too: reporting never stops the agent's annotation work.

Scheduler side: :func:`pod_jobs`, pod UID -> job id for the pods this
backend created (job, gang replica and kernel pods carry the job label) or
adopted (kubectl pods), which :mod:`gpupool.service.reported_use` reads; and
:class:`NodeTokens`, which node an agent's own token is bound to.
"""

from __future__ import annotations

import json
import logging
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any

from gpupool.inventory import GpuInfo, GpuSample
from gpupool.inventory.cgroups import pod_uid_of_pid

log = logging.getLogger("gpupool.node-agent")

REQUEST_TIMEOUT_S = 10.0
NODE_AGENT_ACCOUNT = "gpupool-node-agent"  # the DaemonSet's service account (deploy/kubernetes/node-agent-rbac.yaml)
TOKEN_AUDIENCE = "gpupool"  # the audience of the agent's projected token: not usable against the API server
NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
MAX_REVIEWS_KEPT = 4096
UNKNOWN_GPUS_WARN_AFTER = 5  # reports in a row naming GPUs the scheduler does not know before the agent says so


# ------------------------------------------------------------------ scheduler side
def pod_jobs(*sources: Any) -> dict[str, str]:
    """Pod UID -> job id of every pod the backend runs or adopted, as its watches show them now.

    ``sources``: the parts that know pods (the pod executor, kubectl pods, admitted batch Jobs),
    each answering ``pod_jobs()`` under its own lock: one pass, on the core's tick, only while
    node agents report.
    """
    out: dict[str, str] = {}
    for source in sources:
        out.update(source.pod_jobs())
    return out


class NodeTokens:
    """Node agents' own service account tokens, checked by a TokenReview: which node's agent sends one.

    The DaemonSet's pods get a projected token (audience ``gpupool``) that the
    kubelet binds to the pod, and the API server to the pod's node: a
    TokenReview of it answers the service account and, in ``extra``,
    ``authentication.kubernetes.io/node-name`` (Kubernetes 1.30 and later).
    So an agent can only speak for the node it runs on, which the shared
    token cannot prove. An answer is kept ``ttl_s`` (a report every 10 s
    must not cost an API call each); the API server not answering is
    :class:`~gpupool.wire.errors.Unavailable` (a 503: try again), not a refusal.
    """

    def __init__(self, api_client: Any, namespace: str, service_account: str = NODE_AGENT_ACCOUNT,
                 audience: str = TOKEN_AUDIENCE, ttl_s: float = 60.0) -> None:
        from kubernetes import client

        self.api = client.AuthenticationV1Api(api_client)
        self.username = f"system:serviceaccount:{namespace}:{service_account}"
        self.audience = audience
        self.ttl_s = ttl_s
        self.reviews = 0
        self._lock = threading.Lock()
        self._seen: dict[str, tuple[str | None, float]] = {}  # sha256 of the token -> (node or None, until)

    def node_of(self, token: str) -> str | None:
        """The node whose agent holds ``token``; None when it is not such a token (blocking: a thread's call)."""
        import hashlib
        import time

        from kubernetes import client
        from kubernetes.client.rest import ApiException

        from gpupool.wire.errors import Unavailable

        key = hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()
        now = time.monotonic()
        with self._lock:
            hit = self._seen.get(key)
            if hit is not None and hit[1] > now:
                return hit[0]
        try:
            review = self.api.create_token_review(
                client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token, audiences=[self.audience])))
        except ApiException as e:
            if e.status in (400, 422):  # a token the API server cannot even parse: not an agent's
                return None
            raise Unavailable(f"cannot check the node agent's token with the API server (HTTP {e.status})") from e
        except OSError as e:
            raise Unavailable(f"cannot check the node agent's token with the API server: {e}") from e
        self.reviews += 1
        node = self._node(review.status)
        with self._lock:
            if len(self._seen) > MAX_REVIEWS_KEPT:
                self._seen = {k: v for k, v in self._seen.items() if v[1] > now}
            self._seen[key] = (node, now + self.ttl_s)
        return node

    def _node(self, status: Any) -> str | None:
        if status is None or not status.authenticated or status.user is None:
            return None
        if status.user.username != self.username or self.audience not in (status.audiences or []):
            return None
        names = (status.user.extra or {}).get(NODE_NAME_EXTRA) or []
        return str(names[0]) if names else None


# ------------------------------------------------------------------ agent side
def node_report(gpus: list[GpuInfo], sample: Mapping[str, GpuSample], pod_of: Callable[[int], str | None],
                interval_s: float) -> dict[str, Any]:
    """The ``NodeUse`` body for one sample: per GPU, its reading and its pods' SM percent and memory.

    ``pod_of`` is asked once per pid, whatever the number of GPUs a process
    is on; a pod with several processes on a GPU gets their sum (at most 100).
    """
    pods_of: dict[int, str | None] = {}
    out = []
    for g in sorted(gpus, key=lambda g: g.index):
        s = sample.get(g.id)
        per_pod: dict[str, list[float]] = {}  # uid -> [percent, bytes]
        if s is not None:
            for pid in set(s.processes) | set(s.process_util or {}):
                if pid not in pods_of:
                    pods_of[pid] = pod_of(pid)
                uid = pods_of[pid]
                if uid is None:
                    continue
                acc = per_pod.setdefault(uid, [0.0, 0.0])
                acc[0] += float((s.process_util or {}).get(pid, 0.0))
                acc[1] += float(s.processes.get(pid, 0))
        out.append({
            "id": g.id, "index": g.index,
            "utilization": None if s is None or s.utilization is None else min(100.0, max(0.0, s.utilization)),
            "memory_used": None if s is None or s.memory_used is None else max(0, int(s.memory_used)),
            "measured": s is not None and s.process_util is not None,
            "pods": [{"uid": uid, "sm": round(min(100.0, max(0.0, sm)), 3), "memory": int(mem)}
                     for uid, (sm, mem) in sorted(per_pod.items())],
        })
    return {"interval_s": interval_s, "gpus": out}


class ReportRefused(Exception):
    """The scheduler answered the report with a 4xx: its message says why (waiting will not change it)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


class UseReporter:
    """Samples this node's GPU use per pod and posts it to the scheduler every ``interval_s``."""

    def __init__(self, scheduler_url: str, node: str, token: Callable[[], str], gpus: list[GpuInfo],
                 sample: Callable[[], Mapping[str, GpuSample]], proc_root: str, interval_s: float,
                 stopping: threading.Event) -> None:
        self.url = f"{scheduler_url.rstrip('/')}/api/v1/nodes/{urllib.parse.quote(node, safe='')}/use"
        self.node = node
        self.token = token
        self.gpus = gpus
        self.sample = sample
        self.proc_root = proc_root
        self.interval_s = interval_s
        self.stopping = stopping
        self.reports = 0
        self._last_problem = ""
        self._unknown_for = 0  # reports in a row the scheduler answered with GPUs it does not know

    def body(self) -> dict[str, Any]:
        """This moment's report: the sample per pod (a /proc read per GPU process)."""
        return node_report(self.gpus, self.sample(), lambda pid: pod_uid_of_pid(pid, self.proc_root),
                           self.interval_s)

    def report_once(self) -> dict[str, Any]:
        """Sample and post once; the scheduler's answer. Raises :class:`ReportRefused` on a 4xx, OSError else."""
        data = json.dumps(self.body(), separators=(",", ":")).encode()
        req = urllib.request.Request(self.url, data=data, method="POST", headers={
            "Authorization": f"Bearer {self.token()}", "Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as resp:
                answer: dict[str, Any] = json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as e:
            if 400 <= e.code < 500:
                try:
                    message = str(json.loads(e.read()).get("error") or e.reason)
                except (ValueError, AttributeError, OSError):
                    message = str(e.reason)
                raise ReportRefused(e.code, message) from e
            raise
        self.reports += 1
        return answer

    def run(self) -> None:
        """Report every interval until stopped; each distinct problem logged once (then at debug)."""
        while not self.stopping.is_set():
            try:
                answer = self.report_once()
                if self._last_problem:
                    log.info("node %s: GPU use reports are taken again", self.node)
                self._last_problem = ""
                log.debug("node %s: reported use: %s", self.node, answer)
                self._unknown_gpus(answer.get("unknown_gpus") or [])
            except ReportRefused as e:
                hint = "; check --scheduler and the node agent token" if e.status in (401, 403) else ""
                self._problem(f"the scheduler refused the GPU use report ({e}){hint}")
            except (OSError, ValueError) as e:  # URLError, timeouts, a reply that is not JSON
                self._problem(f"could not report GPU use to {self.url}: {e}")
            except Exception:  # a sampling bug must not end the agent's annotation work
                log.exception("node %s: sampling GPU use failed", self.node)
            self.stopping.wait(self.interval_s)

    def _unknown_gpus(self, unknown: list[str]) -> None:
        """GPUs the scheduler does not know: normal for a moment after the annotation changes; said if it lasts."""
        self._unknown_for = self._unknown_for + 1 if unknown else 0
        if self._unknown_for == UNKNOWN_GPUS_WARN_AFTER:
            log.warning("node %s: the scheduler does not know GPUs %s of this node (is its gpupool.io/gpus "
                        "annotation current, is the node in the pool?); their pods are unmeasured", self.node,
                        ", ".join(unknown))

    def _problem(self, text: str) -> None:
        if text != self._last_problem:
            log.error("node %s: %s", self.node, text)
            self._last_problem = text
        else:
            log.debug("node %s: %s", self.node, text)


def use_source(simulate: str | None, node: str, sim_use_dir: str | None
               ) -> tuple[list[GpuInfo], Callable[[], Mapping[str, GpuSample]], Callable[[], None]]:
    """(GPUs, a sampler, close) for this node: NVML kept open (its per-process reads are "since the last"),
    or the simulated GPUs read through the processes' ``gpupool.sim_use`` reports in ``sim_use_dir``."""
    if simulate:
        from pathlib import Path

        from gpupool.inventory import sim_use
        from gpupool.inventory.simulated import SimulatedInventory

        gpus = SimulatedInventory(simulate, node=node).gpus()
        ids = [g.id for g in gpus]
        if not sim_use_dir:
            return gpus, lambda: {}, lambda: None  # nothing reports: every GPU unmeasured
        folder = Path(sim_use_dir)
        return gpus, lambda: sim_use.read(folder, ids), lambda: None
    from gpupool.inventory.nvml import NvmlInventory

    inv = NvmlInventory()
    return inv.gpus(), inv.sample, inv.close
