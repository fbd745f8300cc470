"""The daily fairness measure of bench/philly.py (bench.sim.daily): booking by day and Jain's index."""

from __future__ import annotations

import pytest

from bench.sim.daily import DAY, DailyLedger, daily_fairness, jain


def test_a_run_across_midnight_is_booked_to_both_days_and_nothing_before_the_origin():
    ledger = DailyLedger(origin=1000.0)
    ledger.add(ledger.received, "a", 1000.0 + DAY - 600, 1000.0 + DAY + 1200, 2)
    ledger.add(ledger.received, "a", 0.0, 1100.0, 1)  # only the 100 s after the origin count
    assert ledger.received["a"][0] == pytest.approx(2 * 600 + 100)
    assert ledger.received["a"][1] == pytest.approx(2 * 1200)


def test_jain_is_one_when_all_get_the_same_fraction_and_falls_as_one_team_is_starved():
    assert jain([0.5, 0.5, 0.5]) == pytest.approx(1.0)
    assert jain([1.0, 0.0]) == pytest.approx(0.5)
    assert jain([]) == 1.0


def test_a_day_is_fair_when_each_team_receives_its_share_of_what_it_wanted():
    ledger = DailyLedger(origin=0.0)
    # 8 GPUs, guarantees 4 and 4; a wants 8 all day, b wants 2: b's entitlement is its 2, a's the other 6
    ledger.add(ledger.wanted, "a", 0.0, DAY, 8)
    ledger.add(ledger.wanted, "b", 0.0, DAY, 2)
    ledger.add(ledger.received, "a", 0.0, DAY, 6)
    ledger.add(ledger.received, "b", 0.0, DAY, 2)
    assert daily_fairness(ledger, 8, {"a": 4, "b": 4}, 1) == [pytest.approx(1.0)]
    unfair = DailyLedger(origin=0.0)
    unfair.wanted, unfair.received = ledger.wanted, {"a": {0: 8 * DAY}, "b": {0: 0.0}}
    assert daily_fairness(unfair, 8, {"a": 4, "b": 4}, 1)[0] < 0.6
