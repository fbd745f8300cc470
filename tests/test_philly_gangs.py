"""The Philly replay with real job sizes: jobs wider than a node run as multi-node gangs.

Small synthetic traces, worked out by hand: a trace job of G > 8 GPUs is one
job of the replay and ``replicas`` workloads of the snapshot; it starts whole
on several nodes, is paused whole, completes when its duration has run with
all replicas, and a job that can never run under a policy is reported as
such, not dropped.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from test_philly_sim import T0, jobs_of, write_trace

from bench import philly
from bench.sim.baselines import pooled_fifo, static_partitions
from bench.sim.cluster import partitioned_cluster, projects_for, shared_cluster
from bench.sim.gangs import replica_ids, replica_shape
from bench.sim.guarantees import Episode
from bench.sim.metrics import summarize
from bench.sim.simulator import InvalidDecision, SimConfig, SimResult, Simulator
from gpupool.policy.model import MILLI, Assignment, Decisions, Preempt, Snapshot, Start

ScheduleFn = Callable[[Snapshot], Decisions]


@pytest.fixture
def engine() -> ScheduleFn:
    from gpupool.policy import schedule

    return schedule


class Watch:
    """Wraps a policy and checks every snapshot and every decision of the whole run for partial gangs."""

    def __init__(self, schedule: ScheduleFn) -> None:
        self.schedule = schedule
        self.snapshots = 0
        self.gang_starts: dict[str, list[set[str]]] = defaultdict(list)  # gang -> nodes of each start
        self.gang_pauses: dict[str, int] = defaultdict(int)

    def __call__(self, snap: Snapshot) -> Decisions:
        self.snapshots += 1
        running: dict[str, int] = defaultdict(int)
        seen: dict[str, int] = {}
        for w in snap.workloads:
            if w.gang:
                seen[w.gang] = w.gang_size
                running[w.gang] += w.running
        for gang, size in seen.items():
            assert running[gang] in (0, size), f"gang {gang} partly running: {running[gang]} of {size} at {snap.now}"
        decisions = self.schedule(snap)
        by_id = {w.id: w for w in snap.workloads}
        started: dict[str, set[str]] = defaultdict(set)
        for s in decisions.starts:
            w = by_id[s.workload_id]
            if w.gang:
                started[w.gang].add(s.assignment.node)
        for gang, nodes in started.items():
            self.gang_starts[gang].append(nodes)
        for p in decisions.preempts:
            if by_id[p.workload_id].gang:
                self.gang_pauses[by_id[p.workload_id].gang] += 1
        return decisions


def replay(rows, guarantees, schedule, nodes, **cfg) -> SimResult:
    config = SimConfig(gang_width=8, **cfg)
    return Simulator(jobs_of(rows), nodes, projects_for(guarantees), schedule, config).run()


# ----------------------------------------------------------------- how a wide job is cut


@pytest.mark.parametrize(("gpus", "shape"), [
    (1, (1, 1)), (8, (1, 8)), (16, (2, 8)), (24, (3, 8)), (128, (16, 8)), (12, (2, 6)), (20, (4, 5)), (17, (17, 1)),
])
def test_a_job_becomes_the_fewest_identical_replicas_that_hold_exactly_its_gpus(gpus, shape) -> None:
    assert replica_shape(gpus, 8) == shape
    replicas, per = shape
    assert replicas * per == gpus and per <= 8


def test_a_one_node_job_keeps_its_id_and_a_gang_gets_one_id_per_replica() -> None:
    assert replica_ids("j7", 1) == ("j7",)
    assert replica_ids("j7", 3) == ("j7-r0", "j7-r1", "j7-r2")


# ----------------------------------------------------------------- gangs in the replay


@pytest.mark.parametrize("policy", ["engine", "fifo", "static"])
def test_a_16_gpu_job_starts_whole_as_two_replicas_on_two_nodes(policy, engine) -> None:
    rows = [(10, 3000, 16, "a")]
    if policy == "static":
        nodes, owner = partitioned_cluster({"a": 16, "b": 8}, 8)
        schedule: ScheduleFn = static_partitions(owner, backfill=True)
    else:
        nodes = shared_cluster(3, 8)
        schedule = engine if policy == "engine" else pooled_fifo(backfill=True)
    watch = Watch(schedule)
    result = replay(rows, {"a": 16, "b": 8}, watch, nodes, cycle_s=60)
    (job,) = result.jobs
    assert (job.replicas, job.replica_gpus) == (2, 8)
    assert watch.gang_starts[job.trace.id] == [{nodes[0].name, nodes[1].name}]  # one start, two nodes
    assert (job.first_start - T0, job.jct, job.pauses) == (60, 3050, 0)
    assert job.finish is not None and job.assignment is None  # finished: holds nothing
    assert result.busy_gpu_s_window == 16 * 3000


def test_a_gang_never_runs_partly_through_a_busy_replay_with_reclaims(engine) -> None:
    # Team a (no guarantee) floods 4 racked nodes with one-GPU jobs and gangs; b (guarantee 24) then asks
    # for 2 x 8 gangs, 8-GPU and 1-GPU jobs, so the engine pauses work of a, gangs whole, to give b back its
    # guarantee. Every snapshot and every decision of the run is checked for a partly running gang.
    rows = [(30 * k, 6000 + 300 * (k % 5), [1, 16, 2, 24, 1, 12][k % 6], "a") for k in range(24)]
    rows += [(3000 + 20 * k, 2000, [16, 1, 8][k % 3], "b") for k in range(9)]
    nodes = shared_cluster(4, 8, rack_nodes=2)
    watch = Watch(engine)
    result = replay(rows, {"a": 0, "b": 24}, watch, nodes, cycle_s=300, checkpoint_interval_s=600)
    assert watch.snapshots > 10
    assert all(r.finish is not None for r in result.jobs)
    gangs = {r.trace.id: r for r in result.jobs if r.replicas > 1}
    assert len(gangs) == 15
    paused = [g for g, n in watch.gang_pauses.items() if n]
    assert paused, "the scenario is meant to make the engine pause a gang"
    for gang in paused:
        rec = gangs[gang]
        assert watch.gang_pauses[gang] == rec.pauses * rec.replicas  # every replica, every time
        assert len(watch.gang_starts[gang]) == rec.runs == rec.pauses + 1
    # every GPU-second of work was done once, plus the work lost to pauses
    work = sum(r.trace.gpus * r.trace.duration for r in result.jobs)
    lost = sum(r.lost_gpu_s for r in result.jobs)
    assert result.busy_gpu_s_window == pytest.approx(work + lost)


def test_a_gang_replica_started_alone_is_reported_as_a_policy_bug() -> None:
    def first_replica_only(snap: Snapshot) -> Decisions:
        w = next(w for w in snap.workloads if not w.running)
        node = snap.nodes[0]
        return Decisions(starts=(Start(w.id, Assignment(node.name, tuple((g.id, MILLI) for g in node.gpus)),
                                       False, "half a gang"),))

    with pytest.raises(InvalidDecision, match="start together"):
        replay([(0, 100, 16, "a")], {"a": 16}, first_replica_only, shared_cluster(2, 8))


def test_a_preempt_of_one_replica_pauses_the_whole_gang_and_keeps_its_checkpointed_work() -> None:
    # j0 = 2 x 8 GPUs for 5000 s; the script pauses only its replica r1 at 4020 s and restarts both at
    # 4080 s. Checkpoints every 1800 s: 420 s of work lost on all 16 GPUs, 1400 s left after the restart.
    # j1 (8 GPUs, pending until j0 is done) keeps the cycles coming.
    seen_paused: list[tuple[bool, bool]] = []

    def script(snap: Snapshot) -> Decisions:
        by = {w.id: w for w in snap.workloads}
        r0, r1 = by.get("j0-r0"), by.get("j0-r1")
        if r0 is None:
            n = snap.nodes[0]
            return Decisions(starts=(Start("j1", Assignment(n.name, tuple((g.id, MILLI) for g in n.gpus)), False,
                                           "after j0"),))
        if snap.now == T0 + 4080:
            seen_paused.append((r0.running, r1.running))
        if r0.running and snap.now == T0 + 4020:
            return Decisions(preempts=(Preempt("j0-r1", "scripted"),))
        if not r0.running and (r0.attempts == 0 or snap.now >= T0 + 4080):
            return Decisions(starts=tuple(
                Start(w.id, Assignment(n.name, tuple((g.id, MILLI) for g in n.gpus)), True, "scripted")
                for w, n in ((r0, snap.nodes[0]), (r1, snap.nodes[1]))
            ))
        return Decisions()

    result = replay([(0, 5000, 16, "a"), (0, 10, 8, "a")], {"a": 16}, script, shared_cluster(2, 8),
                    cycle_s=60, checkpoint_interval_s=1800)
    gang = result.jobs[0]
    assert seen_paused == [(False, False)]  # both replicas were pending after the one-replica preempt
    assert gang.pauses == 1 and gang.runs == 2
    assert gang.lost_gpu_s == 16 * 420
    assert gang.jct == 4080 + 1400


@pytest.mark.parametrize("policy", ["engine", "fifo", "fifo-strict", "static"])
def test_a_job_wider_than_the_whole_cluster_is_reported_as_never_runnable(policy, engine) -> None:
    rows = [(0, 600, 1, "a"), (5, 700, 32, "a"), (10, 600, 8, "b")]
    if policy == "static":
        nodes, owner = partitioned_cluster({"a": 8, "b": 8}, 8)
        schedule: ScheduleFn = static_partitions(owner, backfill=True)
    else:
        nodes = shared_cluster(2, 8)
        schedule = engine if policy == "engine" else pooled_fifo(backfill=policy == "fifo")
    result = replay(rows, {"a": 8, "b": 8}, schedule, nodes, cycle_s=60)
    wide = result.jobs[1]
    assert [r.trace.id for r in result.jobs] == ["j0", "j1", "j2"]  # still in the result, not dropped
    assert wide.never is not None and wide.first_start is None and wide.finish is None
    assert [r.trace.id for r in result.never_ran] == ["j1"]
    assert result.jobs[0].finish is not None and result.jobs[2].finish is not None
    summary = summarize(policy, result, T0)
    assert (summary.jobs, summary.never_ran) == (2, 1)
    assert summary.never_ran_gpu_h == pytest.approx(32 * 700 / 3600)
    assert summary.never_ran_reasons[0].startswith("j1 (32 GPUs, team a): ")
    assert result.busy_gpu_s_window == 600 + 8 * 600  # nothing of j1 ever ran


def test_static_partitions_refuse_a_job_wider_than_the_teams_partition_but_the_pool_runs_it(engine) -> None:
    # b's partition is 11 GPUs (8 + 3): its 16-GPU job can never run there; on the shared 32 GPUs it runs.
    rows = [(0, 1000, 16, "b"), (0, 1000, 2, "a")]
    nodes, owner = partitioned_cluster({"a": 21, "b": 11}, 8)
    static = replay(rows, {"a": 21, "b": 11}, static_partitions(owner, backfill=True), nodes)
    assert "team b's partition (11 GPUs on 2 nodes, largest 8)" in (static.jobs[0].never or "")
    pooled = replay(rows, {"a": 21, "b": 11}, engine, shared_cluster(4, 8))
    assert pooled.jobs[0].never is None and pooled.jobs[0].jct == 1000
    ratios = philly.vs_static_same_jobs({
        "static": {r.trace.id: r.jct for r in static.jobs if r.never is None},
        "engine": {r.trace.id: r.jct for r in pooled.jobs if r.never is None},
    })
    assert ratios["engine"]["jobs"] == 1  # compared on j1 only, the job both ran


def test_baselines_keep_a_gang_inside_one_rack_when_one_can_hold_it() -> None:
    # racks r00 = n000, n001 and r01 = n002, n003; a 1-GPU job holds n000, so the 2 x 8 gang goes to rack r01.
    rows = [(0, 5000, 1, "a"), (30, 1000, 16, "a")]
    nodes = shared_cluster(4, 8, rack_nodes=2)
    watch = Watch(pooled_fifo(backfill=True))
    result = replay(rows, {"a": 32}, watch, nodes)
    assert watch.gang_starts["j1"] == [{"n002", "n003"}]
    assert result.jobs[1].racks_per_run == [1]
    summary = summarize("fifo", result, T0)
    assert (summary.gang_runs, summary.gang_runs_across_racks) == (1, 0)


def test_a_gang_no_rack_can_hold_is_spread_across_racks_and_counted() -> None:
    # racks of 2 nodes; a 1-GPU job in each rack leaves one free node per rack: the 2 x 8 gang spans both.
    rows = [(0, 5000, 1, "a"), (0, 5000, 1, "a"), (30, 1000, 16, "a")]
    nodes = shared_cluster(4, 8, rack_nodes=2)

    def one_job_per_rack(snap: Snapshot) -> Decisions:
        pending = [w for w in snap.workloads if not w.running and not w.gang]
        starts = tuple(Start(w.id, Assignment(n, ((f"{n}/g0", MILLI),)), False, "pinned")
                       for w, n in zip(pending, ["n000", "n002"], strict=False))
        if starts:
            return Decisions(starts=starts)
        return pooled_fifo(backfill=True)(snap)

    result = replay(rows, {"a": 32}, one_job_per_rack, nodes)
    assert result.jobs[2].racks_per_run == [2]
    assert summarize("x", result, T0).gang_runs_across_racks == 1


def test_violation_gpu_seconds_weigh_the_shortfall_beyond_one_cycle() -> None:
    # b (guarantee 2) has two 1-GPU jobs pending from 30 s; a holds the node until 1000 s; both of b's jobs
    # start at the 1020 s cycle: an episode of 990 s, 930 s of it beyond one cycle, short 2 GPUs all along.
    rows = [(0, 1000, 2, "a"), (30, 100, 1, "b"), (30, 100, 1, "b")]
    result = replay(rows, {"a": 0, "b": 2}, pooled_fifo(backfill=True), shared_cluster(1, 2), cycle_s=60)
    assert result.violation_s["b"] == 930.0
    assert result.violation_gpu_s["b"] == 2 * 930.0
    assert result.violation_gang_gpu_s["b"] == 2 * 930.0
    assert result.violation_episodes == result.violation_gang_episodes == 1
    assert result.violation_log == {"b": [Episode(T0 + 30, 930.0, 2, 0, {1: 2})]}


# ----------------------------------------------------------------- the command line


WIDE_TRACE = [(60 * k, 900 + 37 * k, [1, 2, 4, 8][k % 4], "ab"[k % 2]) for k in range(20)] + [
    (1300, 2000, 16, "a"), (1400, 1500, 12, "b"), (1500, 800, 64, "a"),
]


def test_the_default_replay_still_leaves_wide_jobs_out_and_counts_them(tmp_path: Path, capsys) -> None:
    write_trace(tmp_path, WIDE_TRACE, {"a": 1, "b": 1})
    code = philly.run(["--trace-dir", str(tmp_path), "--start", "2017-10-01", "--days", "1", "--gpus", "32",
                       "--policies", "static,fifo", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["excluded_jobs"] == {"wider than 8 GPUs": 3}
    assert out["excluded_gpu_h"]["wider than 8 GPUs"] == pytest.approx((16 * 2000 + 12 * 1500 + 64 * 800) / 3600)
    assert out["jobs"] == 20 and out["real_sizes"] is False and out["rack_nodes"] == 0
    assert all(r["jobs"] == 20 and r["never_ran"] == 0 for r in out["results"])


def test_real_sizes_replays_wide_jobs_as_gangs_and_reports_what_never_ran(tmp_path: Path, capsys) -> None:
    write_trace(tmp_path, WIDE_TRACE, {"a": 1, "b": 1})
    code = philly.run(["--trace-dir", str(tmp_path), "--start", "2017-10-01", "--days", "1", "--gpus", "32",
                       "--policies", "static,fifo,engine", "--real-sizes", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["excluded_jobs"] == {} and out["jobs"] == 23
    assert out["gang_jobs"] == 3 and out["gang_shapes"] == {"2 x 8": 1, "2 x 6": 1, "8 x 8": 1}
    assert out["large_jobs"] == 2 and out["rack_nodes"] == 4
    rows = {r["policy"]: r for r in out["results"]}
    # the 64-GPU job fits no policy's cluster (32 GPUs); static's 16-GPU partitions also cannot hold it
    assert {p: r["never_ran"] for p, r in rows.items()} == {"static": 1, "fifo": 1, "engine": 1}
    assert all(r["jobs"] == 22 and r["large_jobs"] == 1 for r in rows.values())
    assert all(r["large_queue_p95_h"] is not None for r in rows.values())
    assert out["vs_static_same_jobs"]["engine"]["jobs"] == 22
    waits = {w["id"]: w for w in out["large_job_waits"]["engine"]}
    assert sorted(waits) == ["j000020", "j000022"]  # the 16- and 64-GPU jobs; the 12-GPU one is not large
    assert waits["j000022"]["queue_h"] is None and "even empty" in waits["j000022"]["never"]
    assert waits["j000020"]["queue_h"] >= 0 and waits["j000020"]["never"] is None


def test_real_sizes_prints_the_gang_table(tmp_path: Path, capsys) -> None:
    write_trace(tmp_path, WIDE_TRACE, {"a": 1, "b": 1})
    assert philly.run(["--trace-dir", str(tmp_path), "--start", "2017-10-01", "--days", "1", "--gpus", "32",
                       "--policies", "static,engine", "--real-sizes"]) == 0
    text = capsys.readouterr().out
    assert "3 jobs wider than 8 GPUs run as gangs (1 x 2 x 8, 1 x 2 x 6, 1 x 8 x 8)" in text
    assert "never ran under engine: j000022 (64 GPUs, team a)" in text
    assert "engine vs static on the 22 jobs both ran" in text


@pytest.mark.parametrize("flags", [["--rack-nodes", "-1"], ["--large-gpus", "0"], ["--max-reservations", "-2"]])
def test_bad_real_size_flags_are_refused_with_a_message(tmp_path: Path, capsys, flags) -> None:
    write_trace(tmp_path, WIDE_TRACE, {"a": 1, "b": 1})
    with pytest.raises(SystemExit) as exc:
        philly.run(["--trace-dir", str(tmp_path), "--real-sizes", *flags])
    assert exc.value.code == 2
    assert "must be" in capsys.readouterr().err
