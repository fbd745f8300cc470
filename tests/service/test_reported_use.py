"""Node agents' GPU use reports: who may send them, what they may say, and what they become.

The report handling (gpupool.service.reported_use) is driven with a clock
the test moves, real pool nodes and the same per-job mapping the tick uses
(gpupool.service.gpu_use.job_use): a pod's use becomes its job's; a node
whose agent fell silent leaves its jobs unmeasured, never idle. The HTTP
side (tokens, 4xx with messages) runs against a real core on simulated
nodes, served by the real API.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gpupool.policy.model import Gpu, Node
from gpupool.service.actor import Actor
from gpupool.service.gpu_use import job_use
from gpupool.service.reported_use import (
    NodeAgentActor,
    ReportedUse,
    load_node_agent_token,
)
from gpupool.service.store import JobRecord
from gpupool.wire.errors import Forbidden, InvalidRequest, NotFound

TOKEN = "node-agent-secret-0123456789"
POD_A = "11111111-2222-4333-8444-555555555555"
POD_B = "aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"
GIB = 1 << 30


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def nodes() -> tuple[Node, ...]:
    def gpus(name: str) -> tuple[Gpu, ...]:
        return tuple(Gpu(id=f"GPU-{name}-{i}", index=i, model="A100-80GB", memory_mib=81920) for i in range(2))

    return (Node("n1", 64000, 512000, gpus("n1")), Node("n2", 64000, 512000, gpus("n2")))


def running(num: int, gpu: str, milli: int = 1000) -> JobRecord:
    return JobRecord(id=f"j-{num:06d}", num=num, name="x", project="p", user="u", kind="train", state="running",
                     request={}, assignment={"node": gpu.split("-")[1], "gpus": [{"id": gpu, "milli": milli}]})


def report(*gpus: dict[str, Any], interval_s: float = 10.0) -> dict[str, Any]:
    return {"interval_s": interval_s, "gpus": list(gpus)}


def gpu(gid: str, *pods: tuple[str, float, int], measured: bool = True) -> dict[str, Any]:
    return {"id": gid, "utilization": sum(p[1] for p in pods), "memory_used": sum(p[2] for p in pods),
            "measured": measured, "pods": [{"uid": u, "sm": sm, "memory": mem} for u, sm, mem in pods]}


def nobody(pid: int) -> str | None:
    raise AssertionError(f"a reported pod's made-up pid {pid} must not be looked up in /proc")


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def ingest(clock: Clock) -> ReportedUse:
    return ReportedUse(TOKEN, nodes, lambda: {POD_A: "j-000001", POD_B: "j-000002"}, clock=clock)


AGENT = NodeAgentActor(user="gpupool:node-agent")


def test_a_pods_use_becomes_its_jobs_and_a_silent_agent_leaves_it_unmeasured(ingest: ReportedUse,
                                                                              clock: Clock) -> None:
    jobs = [running(1, "GPU-n1-0", 500), running(2, "GPU-n1-1"), running(3, "GPU-n2-0")]
    taken = ingest.record(AGENT, "n1", report(gpu("GPU-n1-0", (POD_A, 30.0, 2 * GIB)), gpu("GPU-n1-1")))
    assert taken == {"node": "n1", "gpus": 2, "pods": 1, "fresh_s": 30.0, "unknown_gpus": []}
    uses = job_use(ingest.sample(), jobs, nobody)
    # 30 % of a GPU's SMs by a half-GPU job: 300 of its 500 milli used; its memory is its pod's
    assert (uses["j-000001"].measured, uses["j-000001"].used, uses["j-000001"].memory) == (500, 300.0, 2 * GIB)
    # the job on a reported GPU with no process there is measured idle, as NVML would show it
    assert (uses["j-000002"].measured, uses["j-000002"].used) == (1000, 0.0)
    # a node that never reported: allocated, unmeasured (never idle)
    assert (uses["j-000003"].alloc, uses["j-000003"].measured) == (1000, 0)

    clock.t += 29.0
    assert job_use(ingest.sample(), jobs, nobody)["j-000001"].measured == 500  # within 3 intervals
    clock.t += 2.0
    uses = job_use(ingest.sample(), jobs, nobody)
    assert uses["j-000001"].measured == 0 and uses["j-000002"].measured == 0  # stale: unknown, not idle
    assert ingest.freshness() == {}


def test_a_gpu_that_cannot_measure_processes_leaves_its_jobs_unmeasured(ingest: ReportedUse) -> None:
    ingest.record(AGENT, "n1", report(gpu("GPU-n1-0", (POD_A, 0.0, GIB), measured=False)))
    use = job_use(ingest.sample(), [running(1, "GPU-n1-0")], nobody)["j-000001"]
    assert (use.measured, use.memory) == (0, GIB)


def test_pods_the_backend_does_not_know_count_for_nobody(ingest: ReportedUse) -> None:
    stranger = "99999999-2222-4333-8444-555555555555"
    ingest.record(AGENT, "n1", report(gpu("GPU-n1-0", (stranger, 90.0, GIB))))
    use = job_use(ingest.sample(), [running(1, "GPU-n1-0")], nobody)["j-000001"]
    assert (use.measured, use.used, use.memory) == (1000, 0.0, 0)


def test_a_gpu_the_pool_does_not_know_yet_is_left_out_and_named(ingest: ReportedUse) -> None:
    """The agent writes its node's annotation, then reports: the scheduler's watch may see the first later."""
    taken = ingest.record(AGENT, "n1", report(gpu("GPU-n1-0"), gpu("GPU-new")))
    assert (taken["gpus"], taken["unknown_gpus"]) == (1, ["GPU-new"])
    assert set(ingest.sample()) == {"GPU-n1-0"}


def test_the_report_interval_sets_how_long_it_counts(ingest: ReportedUse, clock: Clock) -> None:
    assert ingest.record(AGENT, "n1", report(gpu("GPU-n1-0"), interval_s=60))["fresh_s"] == 180.0
    clock.t += 170
    assert "GPU-n1-0" in ingest.sample()
    assert ingest.record(AGENT, "n1", report(gpu("GPU-n1-0"), interval_s=0.5))["fresh_s"] == 5.0  # a floor


def test_bad_and_foreign_reports_are_refused_with_a_message(ingest: ReportedUse) -> None:
    with pytest.raises(Forbidden, match="only a node agent"):
        ingest.record(Actor("admin", admin=True), "n1", report(gpu("GPU-n1-0")))
    with pytest.raises(Forbidden, match="is on node 'n2'"):
        ingest.record(AGENT, "n1", report(gpu("GPU-n2-0")))
    with pytest.raises(NotFound, match="not in the pool"):
        ingest.record(AGENT, "n9", report())
    with pytest.raises(InvalidRequest, match="twice"):
        ingest.record(AGENT, "n1", report(gpu("GPU-n1-0"), gpu("GPU-n1-0")))
    for bad in ({"gpus": [{"id": "GPU-n1-0", "measured": True, "pods": [{"uid": "x", "sm": 1, "memory": 0}]}]},
                {"gpus": [{"id": "GPU-n1-0", "measured": True, "pods": [{"uid": POD_A, "sm": 250, "memory": 0}]}]},
                {"gpus": "all"}, {"gpus": [], "extra": 1}, []):
        with pytest.raises(InvalidRequest):
            ingest.record(AGENT, "n1", bad)
    assert ingest.sample() == {}  # nothing refused was kept


async def test_an_agents_own_token_binds_it_to_its_node(clock: Clock) -> None:
    """The backend says which node a token's agent runs on (a TokenReview on Kubernetes): that node only."""
    checked: list[str] = []

    def node_of(token: str) -> str | None:
        checked.append(token)
        return "n1" if token == "pod-token-of-n1" else None

    ingest = ReportedUse(None, nodes, lambda: {}, clock=clock, node_of_token=node_of)
    assert ingest.enabled and ingest.authenticate("pod-token-of-n1") is None  # not the shared token
    actor = await ingest.authenticate_own("pod-token-of-n1")
    assert actor is not None and getattr(actor, "node", None) == "n1"
    assert await ingest.authenticate_own("someone-elses") is None
    assert ingest.record(actor, "n1", report(gpu("GPU-n1-0")))["gpus"] == 1
    with pytest.raises(Forbidden, match="bound to node 'n1'"):
        ingest.record(actor, "n2", report(gpu("GPU-n2-0")))
    assert checked == ["pod-token-of-n1", "someone-elses"]


def test_only_the_node_agent_token_is_a_node_agent(ingest: ReportedUse) -> None:
    actor = ingest.authenticate(TOKEN)
    assert actor is not None and getattr(actor, "node_agent", False)
    assert ingest.authenticate(TOKEN + "x") is None and ingest.authenticate("") is None
    assert ReportedUse(None, nodes, None).authenticate(TOKEN) is None  # no token set: no agent may report


def test_the_token_comes_from_the_environment_or_the_state_dir(tmp_path: Path, monkeypatch: Any) -> None:
    monkeypatch.delenv("GPUPOOL_NODE_AGENT_TOKEN", raising=False)
    assert load_node_agent_token(tmp_path) is None
    (tmp_path / "node_agent_token").write_text("short\n")
    assert load_node_agent_token(tmp_path) is None  # too short to be a secret
    (tmp_path / "node_agent_token").write_text(TOKEN + "\n")
    assert load_node_agent_token(tmp_path) == TOKEN
    monkeypatch.setenv("GPUPOOL_NODE_AGENT_TOKEN", "another-token-of-enough-length")
    assert load_node_agent_token(tmp_path) == "another-token-of-enough-length"


# ------------------------------------------------------------------ over HTTP, against a real core
async def call(url: str, method: str, token: str, body: Any = None) -> tuple[int, dict[str, Any]]:
    from tornado.httpclient import AsyncHTTPClient

    reply = await AsyncHTTPClient().fetch(url, method=method, raise_error=False,
                                          headers={"Authorization": f"token {token}"},
                                          body=None if body is None and method != "POST" else json.dumps(body))
    return reply.code, json.loads(reply.body)


async def test_the_api_takes_a_node_agents_report_and_nothing_else_from_it(make_core: Any,
                                                                           monkeypatch: Any) -> None:
    from tornado.httpserver import HTTPServer
    from tornado.netutil import bind_sockets

    from gpupool.api.app import make_app

    monkeypatch.setenv("GPUPOOL_NODE_AGENT_TOKEN", TOKEN)
    core = await make_core(simulate="a=2xA100-80GB;b=2xA100-80GB")
    sockets = bind_sockets(0, "127.0.0.1")
    server = HTTPServer(make_app(core))
    server.add_sockets(sockets)
    url = f"http://127.0.0.1:{sockets[0].getsockname()[1]}"
    try:
        a0 = next(g.id for g in core.pool_state.gpus.values() if g.node == "a")
        b0 = next(g.id for g in core.pool_state.gpus.values() if g.node == "b")
        body = report(gpu(a0, (POD_A, 40.0, GIB)))
        status, answer = await call(f"{url}/api/v1/nodes/a/use", "POST", TOKEN, body)
        assert (status, answer["gpus"], answer["pods"]) == (200, 1, 1)
        assert a0 in core.reported_use.sample()
        # the agent's token reads nothing
        for method, path in (("GET", "/api/v1/jobs"), ("GET", "/api/v1/pool"), ("GET", "/api/v1/whoami"),
                             ("POST", "/api/v1/tokens"), ("GET", "/api/v1/nothing-here")):
            status, answer = await call(f"{url}{path}", method, TOKEN, {} if method == "POST" else None)
            assert status == 403 and "node agent" in answer["error"], (path, answer)
        # users and the admin cannot report use
        status, answer = await call(f"{url}/api/v1/nodes/a/use", "POST", "admin-secret", body)
        assert status == 403 and "only a node agent" in answer["error"]
        # another node's GPU, an unknown node, a malformed body, a wrong token: 4xx with a message
        status, answer = await call(f"{url}/api/v1/nodes/a/use", "POST", TOKEN, report(gpu(b0)))
        assert status == 403 and "is on node 'b'" in answer["error"]
        status, answer = await call(f"{url}/api/v1/nodes/zz/use", "POST", TOKEN, report())
        assert status == 404 and "not in the pool" in answer["error"]
        status, answer = await call(f"{url}/api/v1/nodes/a/use", "POST", TOKEN, {"gpus": [{"id": a0}]})
        assert status == 400 and "measured" in answer["error"]
        status, answer = await call(f"{url}/api/v1/nodes/a/use", "POST", TOKEN + "-not", body)
        assert status == 401
    finally:
        server.stop()
