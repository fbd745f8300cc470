"""GPU use reported by node agents (Kubernetes): per pod, turned into the samples the local path reads.

On a cluster the scheduler cannot see the GPUs' processes: each node's
``gpupool node-agent`` samples them (NVML, or the simulation hook on
simulated GPUs), maps each process to its pod by cgroup and sends
``POST /api/v1/nodes/{node}/use`` every ``interval_s`` (docs/design.md,
"Node agents report GPU use"). This module is that endpoint's core side:

- **who may report**: an agent's own token, which the backend binds to the
  node its pod runs on (Kubernetes: the pod's projected service account
  token, checked by a TokenReview): that agent may report for that node
  only; or the shared node-agent token (``$GPUPOOL_NODE_AGENT_TOKEN`` or
  ``<state dir>/node_agent_token``), for clusters that cannot bind tokens to
  nodes, which proves only "an agent". Either actor can do nothing else (the
  API refuses it every other endpoint);
- **what a report may say**: only its own node's GPUs (a GPU of another node
  is a 403), on a node in the pool (else 404); a GPU the pool does not know
  (yet: the node's annotation reaches the scheduler's watch a moment after
  the agent writes it) is left out and named in the answer's ``unknown_gpus``;
- **what it becomes**: each tick's :meth:`ReportedUse.sample` gives, per GPU
  of a node whose report is fresh, a :class:`~gpupool.inventory.GpuSample`
  whose "processes" are the pods (one made-up negative pid each) with their
  jobs attached (``owners``, read by :func:`gpupool.service.gpu_use.job_use`).
  The pod UID -> job map is the backend's (``pod_jobs()``: the pods it
  created or adopted). So the history, the report, the idle rules and the
  UI read the same per-job figures as on the local backend;
- **staleness**: a report counts for 3 of its agent's intervals (at least
  ``MIN_FRESH_S``); after that its GPUs are absent from the sample and their
  jobs *unmeasured*, never idle: an agent that died says nothing about use.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpupool.inventory import GpuSample
from gpupool.policy.model import Node
from gpupool.service.actor import Actor
from gpupool.wire.errors import Forbidden, InvalidRequest, NotFound
from gpupool.wire.schemas import validate

log = logging.getLogger("gpupool.service")

TOKEN_ENV = "GPUPOOL_NODE_AGENT_TOKEN"
TOKEN_FILE = "node_agent_token"
MIN_TOKEN_LENGTH = 16
STALE_INTERVALS = 3
MIN_FRESH_S = 5.0
DEFAULT_INTERVAL_S = 10.0


@dataclass(frozen=True)
class NodeAgentActor(Actor):
    """A node agent: may report GPU use, nothing else; for ``node`` only when its token proves one."""

    node_agent: bool = True
    node: str | None = None  # the node its service account token is bound to; None: the shared token


@dataclass(frozen=True)
class OwnedGpuSample(GpuSample):
    """A GPU sample whose "processes" are already mapped to jobs (a node agent's pods): pid -> job id."""

    owners: dict[int, str] = field(default_factory=dict)


@dataclass(frozen=True)
class _GpuReport:
    gpu_id: str
    utilization: float | None
    memory_used: int | None
    measured: bool
    pods: tuple[tuple[str, float, int], ...]  # (uid, percent of the GPU's SMs, bytes)


@dataclass(frozen=True)
class _NodeReport:
    t: float
    fresh_s: float
    gpus: tuple[_GpuReport, ...]


def load_node_agent_token(state_dir: Path) -> str | None:
    """The node agents' shared token: ``$GPUPOOL_NODE_AGENT_TOKEN``, else ``<state_dir>/node_agent_token``.

    None (no agent may report) when neither is set, or when the one set is
    shorter than 16 characters (a guessable token would let anyone write use
    figures that pause jobs through the idle rules).
    """
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        try:
            token = (Path(state_dir) / TOKEN_FILE).read_text().strip()
        except OSError:
            return None
    if len(token) < MIN_TOKEN_LENGTH:
        log.warning("ignoring the node agent token: it must be at least %d characters", MIN_TOKEN_LENGTH)
        return None
    return token


class ReportedUse:
    """The latest report of each node's agent, checked against the pool, and the samples they make."""

    def __init__(self, token: str | None, nodes: Callable[[], tuple[Node, ...]],
                 pod_jobs: Callable[[], Mapping[str, str]] | None,
                 clock: Callable[[], float] = time.time,
                 node_of_token: Callable[[str], str | None] | None = None) -> None:
        """``nodes``: the pool's nodes now; ``pod_jobs``: pod UID -> job id (None: a backend without pods);
        ``node_of_token``: the node whose agent holds a token (the backend's TokenReview; blocking)."""
        self._token = token.encode() if token else None
        self._node_of_token = node_of_token
        self._nodes = nodes
        self._pod_jobs = pod_jobs
        self._clock = clock
        self._reports: dict[str, _NodeReport] = {}
        self._gpu_node: dict[str, str] = {}
        self._gpu_node_of: tuple[Node, ...] | None = None

    @property
    def enabled(self) -> bool:
        """Whether any agent can report: the shared token is set, or the backend checks agents' own tokens."""
        return self._token is not None or self._node_of_token is not None

    async def authenticate_own(self, token: str) -> Actor | None:
        """The agent of the node a token is bound to (its service account token); None if it is not one.

        The check may ask the API server (cached there), so it runs in a thread, never on the loop.
        """
        if self._node_of_token is None or not token or len(token) > 16384:
            return None
        node = await asyncio.to_thread(self._node_of_token, token)
        return NodeAgentActor(user=f"gpupool:node-agent:{node}", node=node) if node else None

    def authenticate(self, token: str | None) -> Actor | None:
        """The node-agent actor for the node-agent token; None for any other token (a constant-time check)."""
        if self._token is None or not isinstance(token, str) or not token or len(token) > 512:
            return None
        if hmac.compare_digest(token.encode("utf-8", "surrogatepass"), self._token):
            return NodeAgentActor(user="gpupool:node-agent")
        return None

    def _node_of_gpu(self) -> dict[str, str]:
        nodes = self._nodes()
        if nodes is not self._gpu_node_of:
            self._gpu_node = {g.id: n.name for n in nodes for g in n.gpus}
            self._gpu_node_of = nodes
        return self._gpu_node

    def record(self, actor: Actor, node: str, body: Any) -> dict[str, Any]:
        """Keep node ``node``'s report (the ``NodeUse`` wire shape); what was taken, for the agent's log."""
        if not getattr(actor, "node_agent", False):
            raise Forbidden("only a node agent's token may report GPU use (docs/kubernetes.md, \"GPU use per pod\")")
        bound = getattr(actor, "node", None)
        if bound is not None and bound != node:
            raise Forbidden(f"this agent's token is bound to node {bound!r}: it may report only that node's GPU use")
        report = validate("NodeUse", body, "GPU use report")
        where = self._node_of_gpu()
        if not any(n.name == node for n in self._nodes()):
            raise NotFound(f"node {node!r} is not in the pool (not a GPU node, cordoned, or not ready)")
        gpus = []
        unknown = []
        pods = 0
        for g in report["gpus"]:
            gid = str(g["id"])
            owner = where.get(gid)
            if owner is None:  # not in the pool (yet): the node's new annotation reaches the scheduler a moment later
                unknown.append(gid)
                continue
            if owner != node:
                raise Forbidden(f"GPU {gid!r} is on node {owner!r}: an agent reports only its own node's GPUs")
            entries = tuple((str(p["uid"]), float(p["sm"]), int(p["memory"])) for p in g["pods"])
            pods += len(entries)
            util = g.get("utilization")
            mem = g.get("memory_used")
            gpus.append(_GpuReport(gid, float(util) if util is not None else None,
                                   int(mem) if mem is not None else None, bool(g["measured"]), entries))
        if len({g.gpu_id for g in gpus}) != len(gpus):
            raise InvalidRequest("a GPU appears twice in the report")
        interval = float(report.get("interval_s") or DEFAULT_INTERVAL_S)
        fresh = max(MIN_FRESH_S, STALE_INTERVALS * interval)
        self._reports[node] = _NodeReport(self._clock(), fresh, tuple(gpus))
        return {"node": node, "gpus": len(gpus), "pods": pods, "fresh_s": fresh, "unknown_gpus": unknown}

    def sample(self) -> dict[str, GpuSample]:
        """Per GPU of each node with a fresh report: its reading, its pods as processes owned by their jobs.

        A pod whose job the backend does not know (another scheduler's, or
        one that just ended) is a process of nobody, as a stray process is on
        the local path. Stale reports and nodes gone from the pool are dropped.
        """
        if not self._reports:
            return {}
        now = self._clock()
        where = self._node_of_gpu()
        jobs = dict(self._pod_jobs()) if self._pod_jobs is not None else {}
        out: dict[str, GpuSample] = {}
        pseudo: dict[str, int] = {}  # pod uid -> its made-up pid (negative: never a real process)
        for node, rep in list(self._reports.items()):
            if now - rep.t > rep.fresh_s:
                del self._reports[node]  # stale: its GPUs' jobs are unmeasured from now on
                continue
            for g in rep.gpus:
                if where.get(g.gpu_id) != node:
                    continue  # the GPU left the pool (or the node did) since the report
                procs: dict[int, int] = {}
                util: dict[int, float] = {}
                owners: dict[int, str] = {}
                for uid, sm, mem in g.pods:
                    pid = pseudo.setdefault(uid, -1 - len(pseudo))
                    procs[pid] = procs.get(pid, 0) + mem
                    util[pid] = util.get(pid, 0.0) + sm
                    job = jobs.get(uid)
                    if job:
                        owners[pid] = job
                out[g.gpu_id] = OwnedGpuSample(g.utilization, g.memory_used, procs,
                                               util if g.measured else None, owners)
        return out

    def freshness(self) -> dict[str, float]:
        """Seconds since each node's last report (for ``GET /status`` and tests)."""
        now = self._clock()
        return {node: round(now - r.t, 3) for node, r in sorted(self._reports.items())}
