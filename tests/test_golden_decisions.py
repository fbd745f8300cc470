"""The golden decision test: the policy decides exactly as recorded in tests/golden/expected/.

Why: issue 23 refactors the policy (mixins into phases, its caches into an
object the service owns) and the service around it; every step must show
that no decision changed. Each scenario of tests/golden/scenarios.py (bench.scale's
cycles on the openb trace and the synthetic cluster, its gang rows, a reclaim
storm) runs its chained cycles here and is compared with the recorded
starts, preemptions, rejections, preemptible flags, reason wordings and the
digest of the whole ``Decisions``; a difference is reported workload by
workload. A change of decisions made on purpose rewrites the files with
``python -m tests.golden.record --write`` and says why in its commit.
"""

from __future__ import annotations

import pytest

from tests.golden.record import cycles, differences, expected_path, read_expected
from tests.golden.scenarios import SCENARIOS, Scenario, openb_present


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_the_policy_decides_as_recorded(scenario: Scenario) -> None:
    if scenario.needs_openb and not openb_present():
        pytest.skip("needs the openb trace in ../shared/traces/openb beside the project root")
    assert expected_path(scenario).exists(), f"no golden file for {scenario.name}: record it with " \
                                             f"python -m tests.golden.record --write {scenario.name}"
    diff = differences(read_expected(scenario), cycles(scenario))
    assert not diff, f"{scenario.name} decides differently from {expected_path(scenario).name}:\n" + "\n".join(diff)


@pytest.mark.parametrize("name", ["reclaim-storm", "synthetic-full-10k-pending", "gangs-10k-jobs"])
def test_the_same_decisions_without_the_cache(name: str) -> None:
    """``schedule(snapshot, cache=None)`` decides as with the PolicyCache the service carries (issue 23, item 3)."""
    scenario = next(s for s in SCENARIOS if s.name == name)
    if scenario.needs_openb and not openb_present():
        pytest.skip("needs the openb trace in ../shared/traces/openb beside the project root")
    assert scenario.cycles > 1  # the carry is used from the second cycle on
    diff = differences(read_expected(scenario), cycles(scenario, carry=False))
    assert not diff, f"{scenario.name} without the cache decides differently:\n" + "\n".join(diff)


def test_a_changed_decision_is_reported_by_workload() -> None:
    """The report a developer reads: the workload that moved, the wording that changed, not a bare hash."""
    want = [{"cycle": 0, "input": "a", "decisions": "x", "starts": ["q1 n1 g0:1000", "q2 n1 g1:1000"],
             "start_reasons": {"starts on n#": 2}, "preempts": [], "waits": {"count": 1, "reasons": {"no room": 1}}}]
    got = [{"cycle": 0, "input": "a", "decisions": "y", "starts": ["q1 n1 g0:1000", "q3 n2 g0:1000"],
            "start_reasons": {"starts on n#": 2}, "preempts": ["r9"], "waits": {"count": 1, "reasons": {"full": 1}}}]
    lines = differences(want, got)
    assert "cycle 0: starts: - q2 n1 g1:1000" in lines and "cycle 0: starts: + q3 n2 g0:1000" in lines
    assert "cycle 0: preempts: + r9" in lines
    assert "cycle 0: waits: 'reasons': {'no room': 1} -> {'full': 1}" in lines
    assert not any("INPUT" in line for line in lines)
    assert differences(want, want) == []
