"""Random sequences of user actions against a real core: invariants hold after every step.

Checked after each action: no GPU is handed out beyond one whole GPU, a
user's pause is never undone by the scheduler, final states never change, and
the in-memory mirror of live jobs equals what the store holds.
"""

from __future__ import annotations

import asyncio
import random

import pytest

from gpupool.wire.errors import GpupoolError
from gpupool.wire.states import FINAL_STATES, LIVE_STATES
from tests.service.helpers import ADMIN, ALICE, BOB, PY, wait_for


def _check(core, user_paused: set[str], final: dict[str, str]) -> None:
    stored = {r.id: r for r in core.book.store.jobs(LIVE_STATES)}
    assert stored.keys() == core.book.live.keys()
    for jid, rec in stored.items():
        assert core.book.live[jid] == rec, f"mirror differs from store for {jid}"
    used: dict[str, int] = {}
    for rec in stored.values():
        if rec.state == "running":
            for g in rec.assignment["gpus"]:
                used[g["id"]] = used.get(g["id"], 0) + g["milli"]
    assert all(m <= 1000 for m in used.values()), used
    for jid in user_paused:
        rec = core.book.job(jid)
        assert rec.state in ("paused", "running") and (rec.state == "paused" or rec.stop_intent == "pause") \
            or rec.state in FINAL_STATES, (jid, rec.state)
    for jid, state in final.items():
        assert core.book.job(jid).state == state


@pytest.mark.parametrize("seed", [3, 4])
async def test_random_actions_keep_invariants(make_core, seed):
    rng = random.Random(seed)
    core = await make_core(pause_grace_s=0.5, reply_wait_s=0.3)
    core.set_project(ADMIN, "a", {"train_guarantee": 1, "build_quota": 1})
    core.set_project(ADMIN, "b", {"train_guarantee": 1, "build_quota": 0.5})
    jobs: list[str] = []
    user_paused: set[str] = set()
    final: dict[str, str] = {}
    for _ in range(45):
        op = rng.choice(["train", "train", "build", "pause", "resume", "cancel", "tick", "sleep"])
        actor = rng.choice([ALICE, BOB])
        try:
            if op == "train":
                req = rng.choice([{"gpus": 1}, {"gpu_fraction": 0.25}, {"gpu_fraction": 0.5}, {}])
                job, _ = await core.submit(actor, {"project": rng.choice("ab"), **req,
                                                   "command": [PY, "-c", f"import time; time.sleep({rng.uniform(0.05, 0.6):.2f})"]})
                jobs.append(job["id"])
            elif op == "build":
                job, _ = await core.submit(actor, {"project": rng.choice("ab"), "kind": "build",
                                                   "gpu_fraction": rng.choice([0.25, 0.5])})
                jobs.append(job["id"])
            elif op in ("pause", "resume", "cancel") and jobs:
                jid = rng.choice(jobs)
                out = await getattr(core, op)(ADMIN, jid)
                if op == "pause":
                    user_paused.add(jid)
                elif op == "resume":
                    user_paused.discard(jid)
                assert out["id"] == jid
            elif op == "tick":
                core.periodic.tick()
            else:
                await asyncio.sleep(0.1)
        except GpupoolError as e:
            assert e.status in (400, 409), e.message  # a refused action (finished job, build pause, quota)
        for jid in jobs:
            rec = core.book.job(jid)
            if rec.state in FINAL_STATES and jid not in final:
                final[jid] = rec.state
        _check(core, user_paused, final)
    for jid in jobs:
        rec = core.book.job(jid)
        if rec.live:
            await core.cancel(ADMIN, jid)
    await wait_for(lambda: all(core.book.job(j).state in FINAL_STATES for j in jobs), timeout=30, what="all final")
    _check(core, set(), final)
    assert not core.attempts.procs
    assert any(core.book.job(j).attempts >= 1 and core.book.job(j).kind == "train" for j in jobs)  # processes did run
    assert "cancelled" in {core.book.job(j).state for j in jobs}
