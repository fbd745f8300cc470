"""Two schedulers on one namespace: one leads, the other waits, takes over after a kill -9, and neither fights.

Issue 24, item 4: a second ``gpupool serve --backend kubernetes`` on the same
namespace used to delete the first one's pods as strays. Now each takes a
``coordination.k8s.io/v1`` Lease before it acts (gpupool/backends/kubernetes/leader.py),
every write of the backend passes the fence (fence.py), and a standby has no
core at all (gpupool/app/leading.py).
"""

from __future__ import annotations

import asyncio
import datetime
import statistics
import time
from pathlib import Path
from typing import Any

from kubernetes import client, config

from gpupool.app.backend import build_core
from gpupool.app.leading import Election
from gpupool.backends.kubernetes.fence import NotLeader
from gpupool.cli.tables import backend_text
from gpupool.client import GpupoolClient
from gpupool.service.actor import Actor
from tests.kube.cluster import Kubelet, wait
from tests.kube.conftest import kube_config
from tests.kube.leaders import LEASE, TOKEN, PodLedger, Scheduler, lease_holder, take_over
from tests.service.helpers import wait_for

ROUNDS = 10
JOBS_PER_ROUND = 2
NODES = -(-(ROUNDS + 1) * JOBS_PER_ROUND // 8)
ADMIN = Actor("admin", True)


def coordination(kubeconfig: Path) -> client.CoordinationV1Api:
    return client.CoordinationV1Api(config.new_client_from_config(config_file=str(kubeconfig)))


def test_ten_kill_9s_of_the_leader_the_standby_takes_over_and_nothing_is_lost_deleted_or_doubled(
        api: Any, namespace: str, gpu_nodes: Any, kubeconfig: Path, tmp_path: Path) -> None:
    gpu_nodes(NODES, gpus=8)
    coord = coordination(kubeconfig)
    state = tmp_path / "state"  # one state directory for all: the Deployment's ReadWriteMany volume
    ids: list[str] = []
    times: list[tuple[float, float]] = []
    made: list[Scheduler] = []

    def scheduler() -> Scheduler:
        made.append(Scheduler(tmp_path, kubeconfig, namespace, state, f"s{len(made)}"))
        return made[-1]

    try:
        with PodLedger(api, namespace) as ledger, Kubelet(api, namespace) as kubelet:
            leader = scheduler()
            assert not leader.standby and leader.healthz() == 200
            standby = scheduler()
            assert standby.standby and standby.healthz() == 503
            assert lease_holder(coord, namespace) == leader.identity
            c = GpupoolClient(leader.url, TOKEN)
            wait(lambda: len(c.pool()["nodes"]) == NODES, what="the nodes")
            c.set_project("vision", train_guarantee=NODES * 8)
            for _ in range(ROUNDS):
                new = [c.submit({"project": "vision", "gpus": 1, "command": ["python", "t.py"]})["id"]
                       for _ in range(JOBS_PER_ROUND)]
                ids += new
                wait(lambda new=new: all(f"gpupool-{j}-1" in kubelet.started for j in new), timeout=30,
                     what="the round's pods running")
                time.sleep(0.3)  # the standby sees a few renewals of a leader that has work
                times.append(take_over(leader, standby, coord, namespace))
                leader, standby = standby, scheduler()
                assert standby.standby, "a new instance beside a live leader must wait"
                c = GpupoolClient(leader.url, TOKEN)
                # the new leader knows every job, all still running on their first pods
                jobs = c.jobs(project="vision")
                assert sorted(j["id"] for j in jobs) == sorted(ids)
                assert all(j["state"] == "running" and j["attempts"] == 1 for j in jobs), jobs
            assert ledger.deleted == []  # no pod deleted: not by a standby, not by a new leader
            assert set(ledger.added) == {f"gpupool-{j}-1" for j in ids}  # each job's one pod, none other
            assert max(ledger.added.values()) == 1 and max(kubelet.started.count(n) for n in kubelet.started) == 1
            for j in ids:
                kubelet.finish(f"gpupool-{j}-1", 0)
            wait(lambda: all(j["state"] == "succeeded" for j in c.jobs(project="vision")), timeout=30,
                 what="every job succeeded under the last leader")
            status = c.status()["backend"]["leader"]
            assert status == {"lease": f"{namespace}/{LEASE}", "identity": leader.identity, "leader": leader.identity,
                              "this_instance": True}
            assert f"leader: {leader.identity} (this instance)" in backend_text(c.status()["backend"])
    finally:
        for s in made:
            s.stop()
    leased = [t[0] for t in times]
    ready = [t[1] for t in times]
    print(f"\ntakeover after kill -9 of the leader ({ROUNDS} rounds; lease 3 s, renew deadline 2 s, retry 0.5 s): "
          f"Lease taken min {min(leased):.2f} / median {statistics.median(leased):.2f} / max {max(leased):.2f} s; "
          f"serving min {min(ready):.2f} / median {statistics.median(ready):.2f} / max {max(ready):.2f} s")
    assert max(leased) < 3 + 2 * 0.5 * 1.2 + 1.5  # the duration, a standby's retry (jittered), and load's slack


def test_a_standby_has_no_store_and_a_leader_whose_lease_is_taken_exits_leaving_its_pods(
        api: Any, namespace: str, gpu_nodes: Any, kubeconfig: Path, tmp_path: Path) -> None:
    gpu_nodes(1, gpus=8)
    coord = coordination(kubeconfig)
    leader = Scheduler(tmp_path, kubeconfig, namespace, tmp_path / "state-a", "a")
    standby = Scheduler(tmp_path, kubeconfig, namespace, tmp_path / "state-b", "b")  # a second install
    try:
        with PodLedger(api, namespace) as ledger, Kubelet(api, namespace) as kubelet:
            assert standby.standby
            # the standby answers, but opened nothing: no database, no lock in its state directory
            assert standby.healthz() == 503
            assert not (tmp_path / "state-b" / "state.db").exists()
            assert not (tmp_path / "state-b" / "service.lock").exists()
            code, body = standby.get("/api/v1/status", token=None)
            assert code == 401
            code, body = standby.get("/api/v1/status")
            assert code == 503 and f"the leader is {leader.identity}" in body["error"], body
            code, body = standby.get("/api/v1/jobs", token="someone-elses-token")
            assert code == 503 and "standby" in body["error"] and leader.identity not in body["error"], body
            c = GpupoolClient(leader.url, TOKEN)
            wait(lambda: len(c.pool()["nodes"]) == 1, what="the node")
            c.set_project("vision", train_guarantee=8)
            j = c.submit({"project": "vision", "gpus": 1, "command": ["python", "t.py"]})["id"]
            wait(lambda: f"gpupool-{j}-1" in kubelet.started, what="the job's pod running")
            # someone takes the Lease (a third install, an admin): the leader must stop at once
            lease = coord.read_namespaced_lease(LEASE, namespace)
            lease.spec.holder_identity = "intruder"
            lease.spec.renew_time = datetime.datetime.now(datetime.timezone.utc)
            lease.spec.lease_duration_seconds = 600
            coord.replace_namespaced_lease(LEASE, namespace, lease)
            t0 = time.monotonic()
            assert leader.proc.wait(30) == 3, leader.log.read_text()[-3000:]
            print(f"\nthe leader exited {time.monotonic() - t0:.2f} s after its Lease was taken")
            assert "lost the leadership" in leader.log.read_text()
            time.sleep(1.0)
            assert ledger.deleted == [] and list(ledger.added) == [f"gpupool-{j}-1"]  # its pod left running
            assert standby.healthz() == 503  # the intruder's Lease is fresh: no takeover
    finally:
        leader.stop()
        standby.stop()


async def test_the_fence_stops_every_write_once_the_lease_is_lost_or_not_renewed_in_time(
        api: Any, namespace: str, gpu_nodes: Any, kubeconfig: Path, tmp_path: Path) -> None:
    """In one process: after the loss, a started job creates no pod and a delete does not leave the process."""
    gpu_nodes(1, gpus=8)
    cfg = kube_config(tmp_path / "state", kubeconfig, namespace, kube_lease_duration_s=6, kube_renew_deadline_s=4,
                      kube_retry_period_s=0.3, kube_leader_identity="in-process")
    lost: list[str] = []
    election = Election(cfg, lost.append)
    election.start()
    assert await election.wait_to_lead(10)
    core = build_core(cfg, leadership=election.leadership)
    await core.start()
    try:
        await wait_for(lambda: core.pool()["nodes"], what="the node")
        core.set_project(ADMIN, "vision", {"train_guarantee": 8})
        with Kubelet(api, namespace) as kubelet:
            j1, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 1, "command": ["python", "t.py"]})
            first = f"gpupool-{j1['id']}-1"
            await wait_for(lambda: first in kubelet.started, what="the first pod running")
            coord = coordination(kubeconfig)
            lease = coord.read_namespaced_lease(LEASE, namespace)
            lease.spec.holder_identity = "intruder"
            lease.spec.renew_time = datetime.datetime.now(datetime.timezone.utc)
            coord.replace_namespaced_lease(LEASE, namespace, lease)
            await wait_for(lambda: lost, timeout=3, what="the loss seen within a retry period")
            assert "held by intruder" in lost[0]
            assert not election.leading()
            j2, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 1, "command": ["python", "t.py"]})
            await asyncio.sleep(1.5)
            pods = [p.metadata.name for p in api.list_namespaced_pod(namespace).items]
            assert pods == [first]  # no pod for the second job, and the first one left alone
            try:
                core.backend.api.delete_namespaced_pod(first, namespace)  # type: ignore[attr-defined]
            except NotLeader as e:
                assert "no longer the leader" in str(e)
            else:
                raise AssertionError("a delete left a process that lost its lease")
            assert [p.metadata.name for p in api.list_namespaced_pod(namespace).items] == [first]
            assert core.status(ADMIN)["backend"]["leader"]["this_instance"] is False
    finally:
        await core.stop()
        election.stop(release=False)
    # the other way to lose it: renewals stop (the API server unreachable, the process starved) past the deadline
    quiet = kube_config(tmp_path / "state2", kubeconfig, namespace, kube_lease_name="quiet", kube_lease_duration_s=3,
                        kube_renew_deadline_s=1, kube_retry_period_s=0.2, kube_leader_identity="quiet")
    lost.clear()
    election = Election(quiet, lost.append)
    election.start()
    assert await election.wait_to_lead(10)
    election.elector._stop.set()  # no more renewals, as if every one failed
    t0 = time.monotonic()
    while election.leading():
        await asyncio.sleep(0.02)
    assert 0.4 < time.monotonic() - t0 < 1.3 and lost and "not renewed within 1 s" in lost[0]


def test_the_deploy_rbac_holds_the_lease(kubeconfig: Path, scheduler_account: Any) -> None:
    """As the ServiceAccount of rbac.yaml: create the Lease, renew it, release it; nothing else needed."""
    from gpupool.backends.kubernetes.connect import api_client
    from gpupool.backends.kubernetes.leader import LeaderElector, Leadership, LeaseSettings

    sa_config = scheduler_account.kubeconfig  # in namespace gpupool, emptied: no Lease of an earlier test's
    coord = coordination(kubeconfig)
    leadership = Leadership(LeaseSettings(namespace="gpupool", identity="sa-test", duration_s=3,
                                          renew_deadline_s=2, retry_period_s=0.3))
    elector = LeaderElector(leadership, api_client(str(sa_config), pool_size=2))

    def leads() -> bool:  # the API server's RBAC cache takes a moment to see new roles
        try:
            return elector.try_acquire_or_renew()
        except client.ApiException:
            return False

    wait(leads, what="the Lease created as the service account")
    assert elector.try_acquire_or_renew()  # renewed (get + update by name)
    assert coord.read_namespaced_lease(LEASE, "gpupool").spec.holder_identity == "sa-test"
    elector.stop(release=True)
    assert not coord.read_namespaced_lease(LEASE, "gpupool").spec.holder_identity


def test_the_lease_settings_and_flags_are_checked_before_anything_starts(tmp_path: Path) -> None:
    from gpupool.app.serve import BadFlags, ServeOptions, service_settings
    from gpupool.service.config import ServiceConfig
    from gpupool.wire.errors import InvalidRequest

    settings, _ = service_settings(ServeOptions(state_dir=str(tmp_path), backend="kubernetes", leader_elect=False,
                                                lease_name="team-a-scheduler"))
    assert settings["kube_leader_election"] is False and settings["kube_lease_name"] == "team-a-scheduler"
    for local in (ServeOptions(state_dir=str(tmp_path), leader_elect=True),
                  ServeOptions(state_dir=str(tmp_path), lease_name="x")):
        try:
            service_settings(local)
        except BadFlags as e:
            assert "--backend kubernetes" in str(e)
        else:
            raise AssertionError("a leader election flag without the kubernetes backend was taken")
    for bad, words in (({"kube_lease_duration_s": 10, "kube_renew_deadline_s": 10}, "kube_lease_duration_s (10) >"),
                       ({"kube_retry_period_s": 0}, "numbers > 0"), ({"kube_lease_name": "Not_A_Name"}, "Kubernetes name")):
        try:
            ServiceConfig(state_dir=tmp_path, backend="kubernetes", **bad)
        except InvalidRequest as e:
            assert words in str(e), (bad, str(e))
        else:
            raise AssertionError(f"{bad} was taken")
