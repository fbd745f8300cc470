"""``gpupool node-agent``: writes a node's exact GPUs into its ``gpupool.io/gpus`` annotation.

The scheduler only sees what a Node object says. The device plugin gives a
count (``nvidia.com/gpu``) and GPU Feature Discovery a model; neither gives
the UUIDs, indices and NVLink islands the policy packs by. This agent runs on
every GPU node (a DaemonSet, deploy/kubernetes/node-agent.yaml), reads them
through :mod:`gpupool.inventory` (NVML; ``--simulate`` for machines without
GPUs) and writes them to its own Node in the format
:func:`gpupool.backends.kubernetes.nodes._annotated_gpus` reads (docs/kubernetes.md)::

    [{"id": "GPU-<uuid>", "index": 0, "model": "A100-80GB", "memory": 85899345920,
      "topology_group": "nvlink0"}, ...]

It re-checks every ``--interval`` seconds and patches only when the text the
node holds differs from what it read (a GPU fell off the bus, or someone
edited the annotation): a quiet cluster sees one GET per node per interval and
no writes, so no watch event reaches the scheduler. An API server that does
not answer is retried with backoff for as long as it takes (a DaemonSet pod
that crashes would only be restarted into the same wait); an answer that will
not change by waiting (the node does not exist, RBAC refuses) ends the agent
with a clear message and a non-zero exit, so ``kubectl get pods`` shows it.

With ``--scheduler URL`` it also reports the GPUs' use per pod to the
scheduler every ``--use-interval`` seconds (:mod:`.node_use`: NVML or the
simulation hook, pids mapped to pods by cgroup under ``--proc-root``), with
the node-agent token (``$GPUPOOL_NODE_AGENT_TOKEN`` or ``--token-file``).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from gpupool.backends.kubernetes.names import GPUS_ANNOTATION
from gpupool.inventory import GpuInfo, Inventory
from gpupool.wire.errors import InvalidRequest

log = logging.getLogger("gpupool.node-agent")

EXIT_OK = 0
EXIT_FATAL = 1  # the node is missing, RBAC refuses, no GPUs can be read: waiting will not fix it
EXIT_USAGE = 2
BACKOFF_START_S = 0.5
BACKOFF_MAX_S = 30.0
REPORT_JOIN_S = 12.0  # a report in flight when the agent stops: its request's timeout, and a little


class Fatal(Exception):
    """An answer that waiting will not change: the agent exits non-zero with this message."""


def annotation_text(gpus: list[GpuInfo]) -> str:
    """The annotation's value: compact JSON in index order, so equal GPUs always give equal text."""
    items = [{"id": g.id, "index": g.index, "model": g.model, "memory": g.memory,
              "topology_group": g.topology_group} for g in sorted(gpus, key=lambda g: g.index)]
    return json.dumps(items, separators=(",", ":"))


def read_gpus(simulate: str | None, node: str) -> list[GpuInfo]:
    """This machine's GPUs: the simulated ``SPEC``, else NVML (read afresh, so a lost GPU shows).

    Without ``--simulate`` and without a working NVML this is fatal, never a
    silent simulation: a made-up GPU list on a real node would send jobs to
    GPUs that do not exist.
    """
    if simulate:
        from gpupool.inventory.simulated import SimulatedInventory

        inv: Inventory = SimulatedInventory(simulate, node=node)
    else:
        from gpupool.inventory.nvml import NvmlInventory, nvml_usable

        if not nvml_usable():
            raise Fatal("NVML is not usable here (no NVIDIA driver, or the container lacks "
                        "NVIDIA_VISIBLE_DEVICES=all / the nvidia runtime); use --simulate SPEC on a machine "
                        "without GPUs")
        inv = NvmlInventory()
    try:
        return inv.gpus()
    finally:
        inv.close()


class NodeAgent:
    """Keeps one Node's ``gpupool.io/gpus`` equal to the GPUs read on this machine."""

    def __init__(self, api: Any, node: str, read: Callable[[], list[GpuInfo]], interval_s: float) -> None:
        self.api = api
        self.node = node
        self.read = read
        self.interval_s = interval_s
        self.stopping = threading.Event()
        self.checked = threading.Event()
        """Set once the node's annotation is known to be current: use reports name GPUs the scheduler knows."""
        self.patches = 0

    def check(self) -> bool:
        """Read the GPUs and the node once; patch when they differ. True when it patched.

        Raises :class:`Fatal` for a missing node or a refusal, and the
        client's own exception for anything worth retrying.
        """
        from kubernetes.client.rest import ApiException

        text = annotation_text(self.read())
        try:
            current = self.api.read_node(self.node)
            held = (current.metadata.annotations or {}).get(GPUS_ANNOTATION)
            if held == text:
                return False
            # A merge patch of one annotation: other annotations and labels stay as they are.
            self.api.patch_node(self.node, {"metadata": {"annotations": {GPUS_ANNOTATION: text}}})
        except ApiException as e:
            fatal = self._fatal(e)
            if fatal is None:
                raise
            raise fatal from e
        self.patches += 1
        log.info("node %s: wrote %s (%d GPUs)", self.node, GPUS_ANNOTATION, len(json.loads(text)))
        return True

    def _fatal(self, e: Any) -> Fatal | None:
        if e.status == 404:
            return Fatal(f"node {self.node!r} does not exist in the cluster (check --node or the NODE_NAME "
                         "the DaemonSet sets from spec.nodeName)")
        if e.status in (401, 403):
            return Fatal(f"the API server refused to read or patch node {self.node!r} (HTTP {e.status}): the "
                         "agent's service account needs get and patch on nodes "
                         "(deploy/kubernetes/node-agent-rbac.yaml)")
        if e.status == 422:
            return Fatal(f"the API server refused the {GPUS_ANNOTATION} annotation on {self.node!r}: {e.reason}")
        return None

    def run(self, once: bool = False) -> int:
        """Check now, then every interval, until stopped; retry with backoff while the API server is away."""
        from gpupool.backends.kubernetes.calls import transient
        from gpupool.backends.kubernetes.health import describe

        delay = BACKOFF_START_S
        while not self.stopping.is_set():
            try:
                self.check()
            except Fatal as e:
                log.error("%s", e)
                return EXIT_FATAL
            except Exception as e:
                if not transient(e):
                    log.error("node %s: %s", self.node, describe(e))
                    return EXIT_FATAL
                log.warning("node %s: the API server did not answer (%s); retrying in %.1f s", self.node,
                            describe(e), delay)
                self.stopping.wait(delay)
                delay = min(delay * 2, BACKOFF_MAX_S)
                continue
            delay = BACKOFF_START_S
            self.checked.set()
            if once:
                return EXIT_OK
            self.stopping.wait(self.interval_s)
        return EXIT_OK


def add_parser(sub: Any) -> argparse.ArgumentParser:
    """The ``gpupool node-agent`` command line (registered by gpupool/cli/main.py)."""
    p = sub.add_parser("node-agent", help="write this node's GPUs to its Node (runs as a DaemonSet)",
                       description="Read this node's GPUs (NVML) and keep them in the annotation "
                                   f"{GPUS_ANNOTATION} of its Kubernetes Node, for gpupool serve --backend "
                                   "kubernetes (docs/kubernetes.md).")
    p.add_argument("--node", default=os.environ.get("NODE_NAME"),
                   help="this node's name (default: $NODE_NAME, set by the DaemonSet from spec.nodeName)")
    p.add_argument("--kubeconfig", metavar="PATH", help="the cluster's kubeconfig (default: the in-cluster "
                   "service account, else $KUBECONFIG or ~/.kube/config)")
    p.add_argument("--simulate", metavar="SPEC", help="simulated GPUs instead of NVML, e.g. 4xA100-80GB")
    p.add_argument("--interval", type=float, default=60.0, metavar="SECONDS",
                   help="seconds between checks (default 60); the node is patched only on a change")
    p.add_argument("--once", action="store_true", help="check and patch once (and report use once), then exit")
    p.add_argument("--scheduler", metavar="URL", default=os.environ.get("GPUPOOL_SCHEDULER_URL"),
                   help="also report the GPUs' use per pod to this scheduler (default: $GPUPOOL_SCHEDULER_URL; "
                        "unset: no reports)")
    p.add_argument("--token-file", metavar="PATH", default=os.environ.get("GPUPOOL_NODE_AGENT_TOKEN_FILE"),
                   help="file holding the token for use reports, read for each report: the pod's projected "
                        "service account token (audience gpupool), or the shared node agent token (default: "
                        "$GPUPOOL_NODE_AGENT_TOKEN_FILE, else the token $GPUPOOL_NODE_AGENT_TOKEN)")
    p.add_argument("--use-interval", type=float, default=10.0, metavar="SECONDS",
                   help="seconds between use reports (default 10)")
    p.add_argument("--proc-root", default="/proc", metavar="PATH",
                   help="where the node's processes are seen, to map GPU processes to pods by cgroup "
                        "(default /proc: the DaemonSet runs with hostPID)")
    p.add_argument("--sim-use-dir", metavar="DIR", default=os.environ.get("GPUPOOL_SIM_USE_DIR"),
                   help="with --simulate: the folder simulated pods' gpupool.sim_use reports are in "
                        "(default: $GPUPOOL_SIM_USE_DIR)")
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    return p


def main(args: argparse.Namespace) -> int:
    """Run the agent for ``args`` (from :func:`add_parser`); the exit status."""
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s gpupool node-agent %(levelname)s %(message)s")
    logging.getLogger("urllib3").setLevel(logging.ERROR)  # its per-try warnings: the agent says it once
    if not args.node:
        sys.stderr.write("gpupool: error: node-agent needs --node NAME or $NODE_NAME\n")
        return EXIT_USAGE
    if not args.interval > 0:
        sys.stderr.write("gpupool: error: --interval must be above 0 seconds\n")
        return EXIT_USAGE
    try:
        if args.simulate:
            read_gpus(args.simulate, args.node)  # a bad spec is a usage error now, not at the first check
        from kubernetes import client

        from gpupool.backends.kubernetes.connect import api_client

        api = client.CoreV1Api(api_client(args.kubeconfig))
    except InvalidRequest as e:
        sys.stderr.write(f"gpupool: error: {e.message}\n")
        return EXIT_USAGE
    agent = NodeAgent(api, args.node, lambda: read_gpus(args.simulate, args.node), args.interval)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: agent.stopping.set())
    log.info("node %s: checking every %g s (%s)", args.node, args.interval,
             f"simulated {args.simulate}" if args.simulate else "NVML")
    if not args.scheduler:
        return agent.run(once=args.once)
    return _run_with_reports(agent, args)


def _token(args: argparse.Namespace) -> Callable[[], str] | None:
    """How to get the token for each report: the file read afresh each time (a projected service account
    token is rotated by the kubelet), else ``$GPUPOOL_NODE_AGENT_TOKEN``; None when there is none."""
    path = args.token_file
    if path:
        def read() -> str:  # an OSError later (the file gone for a moment) is a report not sent, said once
            with open(path) as f:
                return f.read().strip()

        try:
            return read if read() else None
        except OSError as e:
            raise Fatal(f"cannot read the node agent token from {path}: {e.strerror}") from e
    token = os.environ.get("GPUPOOL_NODE_AGENT_TOKEN", "").strip()
    return (lambda: token) if token else None


def _run_with_reports(agent: NodeAgent, args: argparse.Namespace) -> int:
    """The annotation loop here, the use reports in a thread beside it: both end with the agent."""
    from gpupool.backends.kubernetes.node_use import UseReporter, use_source

    if not args.use_interval > 0:
        sys.stderr.write("gpupool: error: --use-interval must be above 0 seconds\n")
        return EXIT_USAGE
    try:
        token = _token(args)
        if token is None:
            sys.stderr.write("gpupool: error: --scheduler needs a token: --token-file PATH (the pod's projected "
                             "service account token, or the shared node agent token) or $GPUPOOL_NODE_AGENT_TOKEN\n")
            return EXIT_USAGE
        if not args.simulate:
            read_gpus(None, args.node)  # NVML missing is fatal here too, with its message
        gpus, sample, close = use_source(args.simulate, args.node, args.sim_use_dir)
    except Fatal as e:
        log.error("%s", e)
        return EXIT_FATAL
    reporter = UseReporter(args.scheduler, args.node, token, gpus, sample, args.proc_root, args.use_interval,
                           agent.stopping)
    log.info("node %s: reporting GPU use per pod to %s every %g s", args.node, args.scheduler, args.use_interval)
    try:
        if args.once:
            code = agent.run(once=True)
            reporter.report_once()
            return code
        def report_when_annotated() -> None:
            while not agent.checked.wait(0.2):
                if agent.stopping.is_set():
                    return
            reporter.run()

        thread = threading.Thread(target=report_when_annotated, name="gpupool-use-reports", daemon=True)
        thread.start()
        code = agent.run()
        agent.stopping.set()
        thread.join(timeout=REPORT_JOIN_S)
        return code
    except Exception as e:  # --once: a refused or failed report is the command's answer
        log.error("node %s: %s", args.node, e)
        return EXIT_FATAL
    finally:
        close()
