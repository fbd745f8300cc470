"""Render a cycle's decisions in a form that is small enough to keep in git and shows what changed.

Kept in full: every start (workload, node, GPUs and shares, preemptible),
every preemption, rejection and preemptible flag: the decisions that move
work, listed so that a diff names the workload that moved. Kept as counts:
the reasons, by their wording with the numbers and names taken out, so a
changed sentence shows as one line. Kept as digests: the exact text of the
whole ``Decisions`` (reasons included, waits in order) and of the input, so
nothing else can change unseen.

``python -m tests.golden.record --write`` rewrites tests/golden/expected/ from
this checkout's policy: only for a change of the policy's decisions made on
purpose, with the diff of those files in the same commit, saying why.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import re
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.scale import applied
from gpupool.policy import Decisions, PolicyCache, Snapshot, schedule
from tests.golden.scenarios import SCENARIOS, Scenario, openb_present

EXPECTED = Path(__file__).resolve().parent / "expected"
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def canonical(value: Any) -> Any:
    """``value`` with its sets sorted, so its text does not depend on Python's hash seed (frozenset reprs do)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        # (a field added later, at its default, is left out: an input that does not use it reads as before)
        return (type(value).__name__, *(canonical(getattr(value, f.name)) for f in dataclasses.fields(value)
                                        if not (f.metadata.get("added_later") and getattr(value, f.name) == f.default)))
    if isinstance(value, frozenset | set):
        return sorted(value)
    if isinstance(value, tuple | list):
        return [canonical(v) for v in value]
    return value


def wording(reason: str) -> str:
    """A reason with its numbers (and so its names' numbers) replaced by '#': its wording alone."""
    return _NUMBER.sub("#", reason)


def _wordings(reasons: Iterator[str]) -> dict[str, int]:
    return dict(sorted(Counter(wording(r) for r in reasons).items()))


def render(snap: Snapshot, d: Decisions) -> dict[str, Any]:
    """One cycle as the golden file keeps it (see the module's note)."""
    return {
        "input": digest(repr(canonical(snap))),
        "decisions": digest(repr(d)),
        "starts": [f"{s.workload_id} {s.assignment.node} "
                   + ",".join(f"{gpu}:{milli}" for gpu, milli in s.assignment.gpus)
                   + (" preemptible" if s.preemptible else "") for s in d.starts],
        "start_reasons": _wordings(s.reason for s in d.starts),
        "preempts": [p.workload_id for p in d.preempts],
        "preempt_reasons": _wordings(p.reason for p in d.preempts),
        "rejects": [r.workload_id for r in d.rejects],
        "reject_reasons": _wordings(r.reason for r in d.rejects),
        "waits": {"count": len(d.waits), "in_order": digest(repr(d.waits)),
                  "reasons": _wordings(w.reason for w in d.waits)},
        "preemptible": list(d.preemptible),
    }


def cycles(scenario: Scenario, carry: bool = True) -> list[dict[str, Any]]:
    """The scenario's chained cycles, rendered; ``carry``: one PolicyCache through them, as the service keeps one."""
    snap = scenario.build()
    cache = PolicyCache() if carry else None
    out = []
    for n in range(scenario.cycles):
        d = schedule(snap, cache)
        out.append({"cycle": n, **render(snap, d)})
        snap = applied(snap, d)
    return out


def expected_path(scenario: Scenario) -> Path:
    return EXPECTED / f"{scenario.name}.json"


def read_expected(scenario: Scenario) -> list[dict[str, Any]]:
    return list(json.loads(expected_path(scenario).read_text())["cycles"])


def write_expected(scenario: Scenario, rendered: list[dict[str, Any]]) -> None:
    """One JSON file per scenario; one list item per line so a diff shows the workloads that moved."""
    text = json.dumps({"scenario": scenario.name, "cycles": rendered}, indent=1, sort_keys=False)
    expected_path(scenario).write_text(text + "\n")


def differences(expected: list[dict[str, Any]], got: list[dict[str, Any]], most: int = 12) -> list[str]:
    """What differs, cycle by cycle and field by field, as lines a person reads (at most ``most`` per field)."""
    out: list[str] = []
    if len(expected) != len(got):
        out.append(f"{len(got)} cycles, expected {len(expected)}")
    for want, have in zip(expected, got, strict=False):
        n = want.get("cycle")
        if want["input"] != have["input"]:
            out.append(f"cycle {n}: the INPUT snapshot changed (the scenario's generator, or an earlier cycle's "
                       "decisions): the decisions below follow from that")
        for key, value in want.items():
            if have.get(key) == value:
                continue
            other = have.get(key)
            if isinstance(value, list) and isinstance(other, list):
                gone = [x for x in value if x not in set(other)]
                new = [x for x in other if x not in set(value)]
                if not gone and not new:
                    out.append(f"cycle {n}: {key}: same items in another order")
                for sign, items in (("-", gone), ("+", new)):
                    out += [f"cycle {n}: {key}: {sign} {x}" for x in items[:most]]
                    if len(items) > most:
                        out.append(f"cycle {n}: {key}: {sign} ... and {len(items) - most} more")
            elif isinstance(value, dict) and isinstance(other, dict):
                for k in sorted(set(value) | set(other)):
                    if value.get(k) != other.get(k):
                        out.append(f"cycle {n}: {key}: {k!r}: {value.get(k)} -> {other.get(k)}")
            else:
                out.append(f"cycle {n}: {key}: {value!r} -> {other!r}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.golden.record", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the expected files (a policy change on purpose)")
    parser.add_argument("names", nargs="*", help="only these scenarios")
    args = parser.parse_args(argv)
    if not openb_present():
        print("the openb trace is missing (../shared/traces/openb beside the project root)", file=sys.stderr)
        return 1
    failed = 0
    for scenario in SCENARIOS:
        if args.names and scenario.name not in args.names:
            continue
        got = cycles(scenario)
        if args.write:
            write_expected(scenario, got)
            print(f"{scenario.name}: wrote {len(got)} cycles")
            continue
        diff = differences(read_expected(scenario), got)
        failed += bool(diff)
        print(f"{scenario.name}: {'DIFFERENT' if diff else 'same'}")
        for line in diff:
            print("  " + line)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())

