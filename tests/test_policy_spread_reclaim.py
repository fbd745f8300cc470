"""Guarantee reclaim when the jobs flagged over the guarantee are spread thin.

Which of a project's jobs are "beyond its guarantee" (flagged preemptible) is
fixed by pause order, not by where they run. When every node also runs one
of its jobs counted within the guarantee, pausing the flagged ones frees no
node whole, and a project below its guarantee would wait for good while the
other holds twice its guarantee. The engine then may pause any of that
project's jobs (past the minimum run time) on one node, as long as the
project keeps its guarantee.
"""

from __future__ import annotations

from gpupool.policy import schedule
from tests.test_policy_helpers import apply, node, on, project, snap, train, violations


def spread_world(b_gpus: int = 2, a_guarantee: float = 2):
    a = [on(train("a1", "A", t=1), "n1", 0, started=1), on(train("a2", "A", t=2), "n2", 0, started=2),
         on(train("a3", "A", t=3), "n1", 1, started=3), on(train("a4", "A", t=4), "n2", 1, started=4)]
    return snap([node("n1", 2), node("n2", 2)], [project("A", a_guarantee), project("B", 2)],
                [*a, train("b1", "B", gpus=b_gpus, t=10)], now=1000.0)


def test_a_project_below_its_guarantee_gets_a_whole_node_from_one_holding_twice_its_own():
    s = spread_world()
    d = schedule(s)
    # the node whose jobs ran least (a4 started last) is freed: both of A's jobs there
    assert [(x.workload_id, x.assignment.node) for x in d.starts] == [("b1", "n2")]
    assert sorted(p.workload_id for p in d.preempts) == ["a2", "a4"]
    assert all("below its 2 GPUs guarantee" in p.reason for p in d.preempts)
    after = apply(s, d)
    assert violations(after) == []
    # A keeps exactly its guarantee, B has its own; the next cycle changes nothing (no flapping)
    again = schedule(after)
    assert again.starts == () and again.preempts == ()


def test_it_never_takes_the_other_project_below_its_guarantee():
    # A's guarantee is 3 of the 4 GPUs it holds: only one GPU may go, no node can be freed whole
    d = schedule(spread_world(a_guarantee=3))
    assert d.starts == () and d.preempts == ()
    (w,) = d.waits
    assert w.workload_id == "b1"


def test_a_single_flagged_job_is_still_the_first_choice():
    # B asks one GPU: pausing one flagged job (the latest, a4) is enough, protected ones stay
    d = schedule(spread_world(b_gpus=1))
    assert [p.workload_id for p in d.preempts] == ["a4"]
    assert [x.workload_id for x in d.starts] == ["b1"]
