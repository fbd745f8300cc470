"""What the service itself says and shows, through the real core (issue 22, item 13).

Each test runs the real :class:`SchedulerCore` on simulated GPUs and checks
what a user reads: the event log's words, a job's wire form, a project's
fair-share standing.
"""

from __future__ import annotations


async def test_the_start_event_counts_gpus_in_words(make_core, tmp_path):
    one = await make_core(simulate="1xA100-80GB", state_dir=tmp_path / "one")
    two = await make_core(simulate="2xA100-80GB", state_dir=tmp_path / "two")
    said = {}
    for name, core in (("one", one), ("two", two)):
        said[name] = [e["reason"] for e in core.events_since(0) if e["type"] == "pool"]
    assert said["one"] == ["scheduler started with 1 simulated GPU"], said
    assert said["two"] == ["scheduler started with 2 simulated GPUs"], said
