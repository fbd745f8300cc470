"""Leader takeover on Kubernetes: kill -9 of the leading `gpupool serve`, time until the standby acts (issue 24, item 4).

Starts its own kube-apiserver + etcd (scripts/kube, as tests/kube/conftest.py
does), GPU Node objects, a stand-in kubelet (tests/kube/cluster.py), and two
``gpupool serve --backend kubernetes`` processes of this checkout on one
namespace and one state directory (the Deployment's two replicas on a
ReadWriteMany volume). Each round submits jobs to the leader, waits for
their pods to run, kills the leader with SIGKILL, and times:

- **lease**: kill -9 -> the Lease names the standby;
- **serving**: kill -9 -> the standby's ``/healthz`` answers 200 (its core
  built: store opened, jobs recovered, pods re-adopted);

then starts a new standby for the next round. At the end it checks what the
issue asks: no pod deleted (by a standby or anyone), none created twice, no
job lost (every job still running on its first pod under the last leader).

    .venv/bin/python bench/kube_leader.py [--rounds 10] [--lease 15 --deadline 10 --retry 2]

The takeover is bounded by the lease's terms, not by CPU: a standby takes over
one lease duration after it *saw* the last renewal (its own clock: no two
machines' clocks are compared; it reads the Lease every retry period, jittered
up to 1.2x, and once more the moment that duration runs out), and the leader
renews every retry period; so after a kill -9 the Lease changes hands between
about (duration - retry) and (duration + 1.2 x retry) seconds: 13 to 17.4 s
with the defaults.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kubernetes import client, config  # noqa: E402

from gpupool.client import GpupoolClient  # noqa: E402
from tests.kube.cluster import Kubelet, make_gpu_node, wait  # noqa: E402
from tests.kube.leaders import TOKEN, PodLedger, Scheduler, lease_holder, take_over  # noqa: E402

KUBE = Path(os.environ.get("GPUPOOL_KUBE_DIR", ROOT / "scripts" / "kube"))
JOBS_PER_ROUND = 2


def start_api_server(work: Path) -> Path:
    if not (KUBE / "start").exists():
        raise SystemExit(f"no Kubernetes test kit at {KUBE} (set GPUPOOL_KUBE_DIR)")
    r = subprocess.run([str(KUBE / "start"), str(work / "kube")], capture_output=True, text=True)
    if r.returncode != 0:
        raise SystemExit(f"could not start the API server ({KUBE}/start):\n{r.stderr[-3000:]}")
    return work / "kube" / "kubeconfig"


def spread(values: list[float]) -> str:
    return f"{min(values):.2f} | {statistics.median(values):.2f} | {max(values):.2f}"


def run(work: Path, kubeconfig: Path, rounds: int, terms: dict[str, float]) -> dict[str, Any]:
    api = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
    coord = client.CoordinationV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
    ns = f"bench-{uuid.uuid4().hex[:6]}"
    api.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    nodes = -(-(rounds + 1) * JOBS_PER_ROUND // 8)
    for i in range(nodes):
        make_gpu_node(api, f"{ns}-n{i}", 8)
    settings = {"kube_lease_duration_s": terms["lease"], "kube_renew_deadline_s": terms["deadline"],
                "kube_retry_period_s": terms["retry"]}
    made: list[Scheduler] = []

    def scheduler() -> Scheduler:
        made.append(Scheduler(work / ns, kubeconfig, ns, work / ns / "state", f"s{len(made)}", settings))
        return made[-1]

    times: list[tuple[float, float]] = []
    ids: list[str] = []
    try:
        with PodLedger(api, ns) as ledger, Kubelet(api, ns) as kubelet:
            leader, standby = scheduler(), scheduler()
            assert not leader.standby and standby.standby and lease_holder(coord, ns) == leader.identity
            c = GpupoolClient(leader.url, TOKEN)
            wait(lambda: len(c.pool()["nodes"]) == nodes, what="the nodes")
            c.set_project("vision", train_guarantee=nodes * 8)
            for r in range(rounds):
                new = [c.submit({"project": "vision", "gpus": 1, "command": ["python", "t.py"]})["id"]
                       for _ in range(JOBS_PER_ROUND)]
                ids += new
                wait(lambda new=new: all(f"gpupool-{j}-1" in kubelet.started for j in new), timeout=60,
                     what="the round's pods running")
                time.sleep(terms["retry"] * 2)  # the standby has seen the leader renew
                times.append(take_over(leader, standby, coord, ns, timeout_s=terms["lease"] * 4 + 30))
                print(f"round {r + 1}: lease {times[-1][0]:.2f} s, serving {times[-1][1]:.2f} s", flush=True)
                leader, standby = standby, scheduler()
                c = GpupoolClient(leader.url, TOKEN)
            jobs = c.jobs(project="vision")
            lost = len(set(ids) - {j["id"] for j in jobs if j["state"] == "running" and j["attempts"] == 1})
            deleted = len(ledger.deleted)
            doubled = sum(n - 1 for n in ledger.added.values()) + len(set(ledger.added) - {f"gpupool-{j}-1"
                                                                                          for j in ids})
    finally:
        for s in made:
            s.stop()
    return {"rounds": rounds, "terms": terms, "lease": [t[0] for t in times], "serving": [t[1] for t in times],
            "jobs": len(ids), "deleted": deleted, "doubled": doubled, "lost": lost}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--lease", type=float, default=15.0, help="kube_lease_duration_s (default 15, as deployed)")
    ap.add_argument("--deadline", type=float, default=10.0, help="kube_renew_deadline_s (default 10)")
    ap.add_argument("--retry", type=float, default=2.0, help="kube_retry_period_s (default 2)")
    args = ap.parse_args()
    terms = {"lease": args.lease, "deadline": args.deadline, "retry": args.retry}
    with tempfile.TemporaryDirectory(prefix="gpupool-leader-") as tmp:
        work = Path(tmp)
        os.environ.setdefault("GPUPOOL_RUNTIME_DIR", str(work / "runtime"))  # no runtime files in the user's dirs
        kubeconfig = start_api_server(work)
        try:
            out = run(work, kubeconfig, args.rounds, terms)
        finally:
            subprocess.run([str(KUBE / "stop"), str(work / "kube")], capture_output=True)
    print(f"\nmachine: {platform.node()}, {os.cpu_count()} cores; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print(f"terms: lease {args.lease:g} s, renew deadline {args.deadline:g} s, retry {args.retry:g} s; "
          f"{out['rounds']} kill -9s of the leader, {out['jobs']} jobs running across them\n")
    print("| takeover after kill -9 | min s | median s | max s |")
    print("|---|---|---|---|")
    print(f"| the Lease names the standby | {spread(out['lease'])} |")
    print(f"| the standby serves (/healthz 200) | {spread(out['serving'])} |")
    print(f"\npods deleted: {out['deleted']}, created twice or not a job's: {out['doubled']}, jobs lost: {out['lost']}")
    if out["deleted"] or out["doubled"] or out["lost"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
