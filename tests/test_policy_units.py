"""Unit tests of the policy's building blocks: fair shares, the fair queue, failure memos, reasons."""

from __future__ import annotations

import pytest

from gpupool.policy import Kind, Request, Workload
from gpupool.policy.fairshare import ShareInput, fair_shares
from gpupool.policy.memo import FailureMemo
from gpupool.policy.queue import FairQueue
from gpupool.policy.reasons import describe, gpus, holders


def share(g: float = 0, limit: float | None = None, weight: float = 1.0, demand: float = 0) -> ShareInput:
    return ShareInput(int(g * 1000), None if limit is None else int(limit * 1000), weight, int(demand * 1000))


def test_guarantees_first_then_idle_capacity_by_weight() -> None:
    s = fair_shares(10_000, {"a": share(2, weight=3, demand=100), "b": share(2, weight=1, demand=100)})
    # 4 guaranteed, 6 idle split 3:1
    assert s["a"] == pytest.approx(2000 + 4500)
    assert s["b"] == pytest.approx(2000 + 1500)


def test_water_filling_caps_at_demand_and_limit_and_repours() -> None:
    s = fair_shares(12_000, {
        "small": share(0, demand=1),          # wants only 1 GPU
        "capped": share(0, limit=3, demand=50),  # limit 3
        "big": share(0, demand=50),
    })
    assert s["small"] == pytest.approx(1000)
    assert s["capped"] == pytest.approx(3000)
    assert s["big"] == pytest.approx(8000)  # everything the others cannot use


def test_guarantee_without_demand_is_not_reserved_in_the_share() -> None:
    s = fair_shares(8_000, {"idle": share(4, demand=0), "busy": share(4, demand=20)})
    assert s["idle"] == 0 and s["busy"] == pytest.approx(8000)


def test_zero_weight_gets_only_its_guarantee() -> None:
    s = fair_shares(8_000, {"z": share(1, weight=0, demand=20), "w": share(1, demand=20)})
    assert s["z"] == pytest.approx(1000) and s["w"] == pytest.approx(7000)


def _job(wid: str, project: str, prio: int = 0, t: float = 0.0) -> Workload:
    return Workload(wid, project, Kind.TRAIN, Request(gpus=1), priority=prio, submitted_at=t)


def test_fair_queue_orders_by_priority_then_share_then_submission() -> None:
    usage = {"A": 0, "B": 0}
    shares = {"A": 4.0, "B": 4.0}
    jobs = [_job("a1", "A", t=1), _job("a2", "A", t=2), _job("b1", "B", t=5), _job("hi", "B", prio=3, t=9)]
    q = FairQueue(jobs, lambda p: usage[p] / shares[p])
    order = []
    while (w := q.pop()) is not None:
        order.append(w.id)
        usage[w.project] += 1  # as if it started
        q.touch(w.project)
    # hi first (priority); then a1 (ratio 0 < B's 0.25 after hi); then both at 0.25: a2 was submitted first
    assert order == ["hi", "a1", "a2", "b1"]


def test_fair_queue_prefers_the_project_furthest_below_its_share() -> None:
    usage = {"A": 3, "B": 0}
    q = FairQueue([_job("a", "A", t=0), _job("b", "B", t=10)], lambda p: usage[p] / 4)
    assert q.pop().id == "b"  # type: ignore[union-attr]


def test_failure_memo_dominance() -> None:
    memo: FailureMemo[str] = FailureMemo()
    small = Request(gpus=1, cpu_milli=2000)
    memo.add("pool", small, 0, "no room")
    assert memo.get("pool", Request(gpus=2, cpu_milli=4000), 0) == "no room"
    assert memo.get("pool", Request(gpus=1, cpu_milli=1000), 0) is None  # asks less CPU: unknown
    assert memo.get("other", Request(gpus=2, cpu_milli=4000), 0) is None  # other context
    assert memo.get("pool", Request(gpus=2, cpu_milli=4000, gpu_models=frozenset({"T4"})), 0) is None
    assert memo.get("pool", Request(gpus=2, cpu_milli=4000), 1) is None  # capacity grew: forgotten
    frac = Request(gpu_milli=500)
    memo.add("pool", frac, 1, "no share")
    assert memo.get("pool", Request(gpus=1), 1) == "no share"  # a whole GPU needs more than half of one
    assert memo.get("pool", Request(gpu_milli=250), 1) is None


def test_reason_wording() -> None:
    assert gpus(1000) == "1 GPU" and gpus(1500) == "1.5 GPUs" and gpus(250) == "0.25 GPUs"
    assert describe(Request(gpus=2, gpu_models=frozenset({"A100"}))) == "2 whole GPUs on one node (A100)"
    assert describe(Request(gpu_milli=250, cpu_milli=2000)) == "0.25 of one GPU with 2 CPU"
    assert holders([("k1", 250)] * 10, limit=2) == "k1 (0.25 GPUs), k1 (0.25 GPUs) and 8 more"


def test_schedule_leaves_the_garbage_collector_as_it_found_it() -> None:
    """The cycle holds the cyclic GC off for speed; the caller's setting comes back, even on an error."""
    import gc

    from gpupool.policy import Snapshot, schedule

    empty = Snapshot((), (), ())
    was = gc.isenabled()
    try:
        gc.enable()
        schedule(empty)
        assert gc.isenabled()
        gc.disable()
        schedule(empty)
        assert not gc.isenabled()
        gc.enable()
        with pytest.raises(AttributeError):
            schedule(None)  # type: ignore[arg-type]
        assert gc.isenabled()
    finally:
        if was:
            gc.enable()
        else:
            gc.disable()


def test_ledger_whole_gpu_counts_follow_takes_and_gives() -> None:
    from gpupool.policy import Assignment, Gpu, Node
    from gpupool.policy.capacity import Ledger

    node = Node("n", 8_000, 8_000, tuple(Gpu(f"g{i}", i, "A100", 40_000) for i in range(4)))
    half = Workload("h", "A", Kind.TRAIN, Request(gpu_milli=500), assignment=Assignment("n", (("g0", 500),)))
    ledger = Ledger([node], [half])
    assert ledger.whole["n"] == 3
    two = Assignment("n", (("g1", 1000), ("g2", 1000)))
    ledger.take(two, Request(gpus=2))
    assert ledger.whole["n"] == 1 and not ledger.fits("n", Request(gpus=2))
    ledger.give(half.assignment, half.request)  # type: ignore[arg-type]
    assert ledger.whole["n"] == 2 and ledger.fits("n", Request(gpus=2))
    ledger.give(two, Request(gpus=2))
    assert ledger.whole["n"] == 4
