"""The Kubernetes backend: the cluster's GPU nodes (kept current by a watch) and the pod executor.

The node watch thread only records what it sees; :meth:`KubeBackend.refresh`
(called by the core on its loop) turns that into the pool the policy reads,
so the pool never changes under a running cycle. A node leaves the pool when
it is cordoned, NotReady, tainted by the node controller, deleted, or loses
its GPUs; the core then requeues its jobs (gpupool/service/attempts.py).

Two more watches, each behind an optional capability of the seam
(gpupool.backends.base): pods users create with kubectl for gpupool to place
(:mod:`.foreign_jobs`; :mod:`.adoption` queues them as jobs, an
``AdoptsForeignPods``), and other schedulers' pods holding GPUs on pool nodes
(:mod:`.other_pods`, ``HoldsOutsideWork``), which the core counts as used
capacity. The settings come from the app (gpupool.app.backend builds them from
the service's config), so this package needs nothing of the service.
"""

from __future__ import annotations

import gc
import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kubernetes import client

from gpupool.backends.kubernetes.adoption import PodAdoption
from gpupool.backends.kubernetes.batch_adoption import Adoptions, JobAdoption
from gpupool.backends.kubernetes.batch_jobs import BatchJobs
from gpupool.backends.kubernetes.calls import Calls
from gpupool.backends.kubernetes.connect import api_client
from gpupool.backends.kubernetes.dra_allocation import DraPods
from gpupool.backends.kubernetes.dra_own_pods import OwnPodClaims
from gpupool.backends.kubernetes.dra_slices import DraSlices
from gpupool.backends.kubernetes.dra_templates import DraTemplates
from gpupool.backends.kubernetes.executor import PodExecutor
from gpupool.backends.kubernetes.fence import fence
from gpupool.backends.kubernetes.foreign_jobs import KubectlPods
from gpupool.backends.kubernetes.health import Health
from gpupool.backends.kubernetes.kernel_pods import KernelHome, KernelPodRunner
from gpupool.backends.kubernetes.leader import Leadership
from gpupool.backends.kubernetes.node_use import NodeTokens, pod_jobs
from gpupool.backends.kubernetes.nodes import PoolNode, read_node
from gpupool.backends.kubernetes.objects import Obj
from gpupool.backends.kubernetes.objects import name as name_of
from gpupool.backends.kubernetes.other_pods import OtherPods
from gpupool.backends.kubernetes.pod_namespaces import PodNamespaces
from gpupool.backends.kubernetes.pods import PodSettings
from gpupool.backends.kubernetes.routing import KubeExecutor
from gpupool.backends.kubernetes.watcher import ListWatch
from gpupool.backends.kubernetes.workload_gang_jobs import WorkloadGangs
from gpupool.inventory import GpuInfo, GpuSample
from gpupool.policy.model import Node

log = logging.getLogger("gpupool.backends.kubernetes")


@dataclass(frozen=True)
class KubeSettings:
    """What the Kubernetes backend reads of the service's config (ServiceConfig fields of the same names)."""

    jobs_dir: Path  # logs of pods, copied here after they end
    kubeconfig: str | None = None
    namespace: str = "gpupool"
    image: str = "python:3.12-slim"
    kube_scheduler_name: str = "gpupool"
    pause_grace_s: float = 10.0
    kube_workdir_pvc: str | None = None
    kube_start_timeout_s: float = 300.0
    kube_pod_namespaces: dict[str, list[str]] | None = None
    kube_kernel_home_claim: str | None = None  # GPU kernels as pods: the user's home claim ("{user}" in it)
    kube_kernel_home_path: str = "/home/jovyan"


class KubeBackend:
    """A cluster as the pool (a :class:`gpupool.backends.base.Backend`, ``AdoptsForeignPods``,
    ``HoldsOutsideWork`` and ``RunsKernelPods``)."""

    simulated = False
    elastic = True  # nodes join, drain and leave: what does not fit now may fit later

    def __init__(self, config: KubeSettings, initial_sync_s: float = 10.0,
                 leadership: Leadership | None = None) -> None:
        """Connect, start the node and pod watches, and wait up to ``initial_sync_s`` for the first node list.

        An API server that does not answer is no reason not to start: the
        service runs with an empty pool, says so in ``GET /status``, and the
        watches keep retrying. With ``leadership`` (leader election, built by
        the app), every write of this backend passes the fence
        (gpupool/backends/kubernetes/fence.py): none leaves while it does not lead.
        """
        self.config = config
        self.leadership = leadership
        self.api = client.CoreV1Api(api_client(config.kubeconfig))
        if leadership is not None:
            fence(self.api.api_client, leadership)
        self.health_state = Health()
        self.calls = Calls(self.health_state)
        self.gpus: dict[str, GpuInfo] = {}
        self.nodes: tuple[Node, ...] = ()
        self._lock = threading.Lock()
        self._seen: dict[str, PoolNode] = {}  # every GPU node, in the pool or not (watch thread writes)
        self._raw: dict[str, Obj] = {}  # every node's JSON: a node's ResourceSlices may come after it
        self._changed = True
        self._in_pool: dict[str, PoolNode] = {}
        self.node_watch = ListWatch("nodes", self.api.list_node, self._on_reset, self._on_event, self.health_state)
        self.dra_slices = DraSlices(self.api.api_client, self.health_state, self._on_slices)
        """GPUs the DRA driver publishes as ResourceSlices: nodes without nvidia.com/gpu are in the pool too."""
        settings = PodSettings(config.namespace, config.image, config.kube_scheduler_name, config.pause_grace_s,
                               config.kube_workdir_pvc, config.kube_start_timeout_s)
        self.pod_executor = PodExecutor(self.api, settings, config.jobs_dir, self.calls, self.health_state,
                                        self.node_lost)
        self.kubectl = KubectlPods(self.api, PodNamespaces.from_setting(config.namespace, config.kube_pod_namespaces),
                                   config.kube_scheduler_name, self.calls, self.health_state, config.jobs_dir,
                                   self.node_lost)
        """Pods users create with kubectl (``schedulerName`` ours), their watch and their attempts."""
        self.batch_jobs = BatchJobs(client.BatchV1Api(self.api.api_client), self.api, self.kubectl, self.calls,
                                    self.health_state)
        """batch/v1 Jobs labelled with a project, admitted as one gang each (suspend, unsuspend, bind)."""
        self.gangs = WorkloadGangs(self.api, self.kubectl, self.calls, self.health_state)
        """PodGroups (the Workload API) whose pods are kubectl pods for gpupool: one gang job each."""
        self.dra_pods = DraPods(self.api, self.dra_slices, self.calls, self.health_state, self.kubectl.warn_once)
        """kubectl pods whose GPUs come from ResourceClaims: queued from their claims, devices written at binding."""
        self.kubectl.before_bind = self.dra_pods.allocate
        self.dra_templates = DraTemplates(self.api.api_client, self.health_state, self.dra_pods)
        """Jobs' and JobSets' pod templates claiming GPUs: their ResourceClaimTemplates, each pod's claim written."""
        self.batch_jobs.before_bind = self.dra_templates.allocate
        self.batch_jobs.held_gpus = self.dra_templates.held
        self.gangs.pod_ask = self.dra_templates.pod_ask
        self.gangs.dra_nodes = self.dra_templates.any_nodes
        self.gangs.claims_changes = self.dra_templates.generation
        self.gangs.claims_synced = lambda: self.dra_templates.synced
        self.gangs.before_bind = self.dra_pods.allocate
        self.pod_executor.starts.claims = OwnPodClaims(self.api, self.dra_slices).prepare
        """gpupool's own pods on nodes whose GPUs come from slices: each with a claim of its GPUs."""
        pod_adoption = PodAdoption(self.kubectl)
        pod_adoption.read_claims = self.dra_pods.amend
        pod_adoption.claims_changes = self.dra_pods.generation
        pod_adoption.made_elsewhere = lambda pod: self.batch_jobs.owns_pod(pod) or self.gangs.owns_pod(pod)
        job_adoption = JobAdoption(self.batch_jobs, config.kube_scheduler_name)
        job_adoption.claims = self.dra_templates
        job_adoption.claims_changes = self.dra_templates.generation
        job_adoption.claims_synced = lambda: self.dra_templates.synced
        self.foreign_pods = Adoptions(pod_adoption, job_adoption, self.gangs)
        """Those pods as jobs: the core queues a job for each (gpupool.backends.base.AdoptsForeignPods)."""
        self.other_pods = OtherPods(self.api, config.kube_scheduler_name, self.health_state)
        self.other_pods.claimed_gpus = self.dra_pods.claimed_gpus  # (their DRA claims: exactly which GPUs)
        self.dra_pods.claims.on_change = self.other_pods.touch
        """Other schedulers' pods holding GPUs on pool nodes: used capacity."""
        self.executor = KubeExecutor(self.pod_executor, self.kubectl, self.batch_jobs, self.gangs)
        self.kernel_pods = KernelPodRunner(self.pod_executor, settings, self.calls,
                                           KernelHome.of(config.kube_kernel_home_claim, config.kube_kernel_home_path))
        """Build shares whose kernel runs in a pod of its own (gpupool.backends.base.RunsKernelPods)."""
        self.node_tokens = NodeTokens(self.api.api_client, config.namespace)
        """Node agents' own service account tokens -> their nodes (their GPU use reports)."""
        self.dra_slices.start()  # first: a node listed before its slices would briefly leave the pool
        self.dra_slices.watch.synced.wait(min(initial_sync_s, 5.0))  # (bounded: RBAC may not grant them)
        self.node_watch.start()
        self.pod_executor.start()
        self.dra_pods.start()
        self.dra_templates.start()
        self.kubectl.start()
        self.batch_jobs.start()
        self.gangs.start()
        self.other_pods.start()
        if not self.node_watch.synced.wait(initial_sync_s):
            log.warning("no node list from the API server yet; starting with an empty pool")
        self.refresh()
        tune_gc()

    # ------------------------------------------------------------ node watch (its thread)
    def _on_reset(self, items: list[Obj]) -> None:
        seen = {}
        for n in items:
            pn = read_node(n, self.dra_slices.node(name_of(n)))
            if pn is not None:
                seen[pn.name] = pn
        with self._lock:
            self._raw = {name_of(n): n for n in items}
            self._seen = seen
            self._changed = True

    def _on_slices(self, names: set[str]) -> None:
        """Nodes whose ResourceSlices changed: read again (the slice watch's thread)."""
        with self._lock:
            for name in names:
                raw = self._raw.get(name)
                pn = read_node(raw, self.dra_slices.node(name)) if raw is not None else None
                if pn is None:
                    self._seen.pop(name, None)
                else:
                    self._seen[name] = pn
            self._changed = True

    def _on_event(self, kind: str, node: Obj) -> None:
        with self._lock:  # (read under the lock: the slice watch re-reads nodes too)
            pn = None if kind == "DELETED" else read_node(node, self.dra_slices.node(name_of(node)))
            if kind == "DELETED":
                self._raw.pop(name_of(node), None)
            else:
                self._raw[name_of(node)] = node
            if pn is None:
                if self._seen.pop(name_of(node), None) is None:
                    return
            elif self._seen.get(pn.name) == pn:
                return  # a heartbeat: nothing the pool sees changed
            else:
                self._seen[pn.name] = pn
            self._changed = True

    # ------------------------------------------------------------ the core's side (its loop)
    def refresh(self) -> bool:
        """Apply what the node watch saw; True when the pool (GPUs, nodes, pools) changed."""
        with self._lock:
            changed, self._changed = self._changed, False
            in_pool = {name: n for name, n in sorted(self._seen.items()) if not n.problem} if changed else None
        if in_pool is None or in_pool == self._in_pool:
            return self.other_pods.refresh(self.nodes)  # GPUs other schedulers' pods took or gave back
        for name in sorted(set(self._in_pool) - set(in_pool)):
            why = self._seen.get(name)
            log.info("node %s left the pool (%s)", name, why.problem if why is not None else "deleted")
        self._in_pool = in_pool
        self.nodes = tuple(n.policy_node() for n in in_pool.values())
        self.gpus = {g.id: g for n in in_pool.values() for g in n.gpus}
        self.other_pods.refresh(self.nodes, force=True)
        return True

    def node_lost(self, name: str) -> bool:
        """Whether no kubelet will ever finish that node's pods: deleted, NotReady (cordoned or not) or without
        GPUs."""
        with self._lock:
            n = self._seen.get(name)
        return n is None or n.lost

    def admit(self, user: str, workdir: str | None, submit_dir: str | None) -> str | None:
        """Jobs run in pods, not as Unix accounts of this machine: nothing to refuse; the folder is the spec's."""
        return workdir

    def sample(self) -> dict[str, GpuSample]:
        """Nothing read here: each node's agent measures its GPUs and reports to the scheduler's API
        (gpupool.service.reported_use turns those reports into samples, by :meth:`pod_jobs`)."""
        return {}

    def node_agent_node(self, token: str) -> str | None:
        """The node whose agent holds ``token`` (its pod's service account token; a TokenReview, cached)."""
        return self.node_tokens.node_of(token)

    def pod_jobs(self) -> dict[str, str]:
        """Pod UID -> job id of the pods gpupool runs or adopted: what a node agent's per-pod report names."""
        return pod_jobs(self.pod_executor, self.kubectl, self.batch_jobs, self.gangs)

    def health(self) -> dict[str, Any]:
        """The API server's state and why GPU nodes are out of the pool, for ``GET /status``."""
        with self._lock:
            out = {name: n.problem for name, n in sorted(self._seen.items()) if n.problem}
        h = self.health_state.snapshot()
        h.update(backend="kubernetes", namespace=self.config.namespace, api_server=self.api.api_client.configuration.host,
                 nodes_out=out, pod_namespaces=self.kubectl.namespaces.describe())
        if self.leadership is not None:
            h["leader"] = self.leadership.describe()
        return h

    def close(self) -> None:
        self.node_watch.stop(wait_s=0.5)
        self.dra_slices.close()
        self.dra_pods.close()
        self.dra_templates.close()
        self.other_pods.close()
        self.kubectl.close()
        self.batch_jobs.close()
        self.gangs.close()
        self.pod_executor.close()
        self.calls.close()


def tune_gc() -> None:
    """Fewer full garbage collections in a service whose heap grows to hundreds of MiB.

    A cluster's scheduler holds every node, pod and live job: at 1,000 nodes
    and 10,000 jobs, 4.5 s of its 33 s of CPU went to the cyclic collector,
    mostly in full collections (up to 0.4 s each, the loop frozen meanwhile)
    that rescan the whole heap each time it has grown by a quarter. What is
    loaded by now (modules, the client, the first node list) lives as long as
    the process: frozen, later full collections skip it. The oldest
    generation is collected after 100 younger collections instead of 10;
    nearly all of the service's garbage is freed by reference counting anyway
    (plain JSON, records), the collector only finds cycles.
    """
    gc.freeze()
    young, middle, _old = gc.get_threshold()
    gc.set_threshold(max(young, 7000), middle, 100)
