"""Project membership (issue 16, item 6): only a project's members (users, @groups) may submit into it.

A project without a members list stays open, so a single-user setup needs no
configuration; admins may use every project.
"""

from __future__ import annotations

import pytest

from gpupool.service.core import Actor
from gpupool.service.store import Store
from gpupool.wire.errors import Forbidden, InvalidRequest
from tests.service.helpers import ADMIN, ALICE, BOB, PY

CAROL_IN_ML = Actor("carol", groups=frozenset({"ml", "staff"}))


async def test_only_members_submit_into_a_project_with_members(make_core):
    core = await make_core()
    core.set_project(ADMIN, "vision", {"build_quota": 1, "train_guarantee": 1, "members": ["alice", "@ml"]})
    core.set_project(ADMIN, "open", {"build_quota": 1})
    spec = {"project": "vision", "gpus": 1, "command": [PY, "-c", "pass"]}
    before = core.last_event_seq
    for kind_spec in (spec, {"project": "vision", "kind": "build", "gpu_fraction": 0.25},
                      {**spec, "priority": 1_000_000}):
        with pytest.raises(Forbidden, match="bob is not a member of project 'vision'") as e:
            await core.submit(BOB, kind_spec)
        assert e.value.status == 403
    assert core.list_jobs(ADMIN, {}) == [] and core.last_event_seq == before  # nothing stored
    mine, _ = await core.submit(ALICE, spec)
    frac = {k: v for k, v in spec.items() if k != "gpus"}
    theirs, _ = await core.submit(CAROL_IN_ML, {**frac, "gpu_fraction": 0.5})
    admins, _ = await core.submit(ADMIN, {**frac, "gpu_fraction": 0.25})
    assert {j["user"] for j in (mine, theirs, admins)} == {"alice", "carol", "admin"}
    await core.submit(BOB, {**spec, "project": "open"})  # no members list: open to everyone

    seen = {p["name"]: (p["member"], p["members"]) for p in core.list_projects(BOB)}
    assert seen == {"open": (True, None), "vision": (False, ["@ml", "alice"])}
    assert [p["member"] for p in core.status(CAROL_IN_ML)["projects"]] == [True, True]

    # the admin takes alice off the list: her next submit is refused, her running job is left alone
    core.set_project(ADMIN, "vision", {"members": ["@ml"]})
    with pytest.raises(Forbidden):
        await core.submit(ALICE, spec)
    assert core.get_job(ALICE, mine["id"])["state"] in ("queued", "running", "succeeded")
    core.set_project(ADMIN, "vision", {"members": None})  # open again
    await core.submit(ALICE, spec)


@pytest.mark.parametrize("members, words", [
    ("alice", "must be a list"), (["@"], "group names"), (["-x"], "member '-x'"), ([7], r"not 7 \(members\.0\)"),
    (["a"] * 1001, "at most 1000"), (["@bad group"], "group names"),
])
async def test_bad_members_are_refused_and_change_nothing(make_core, members, words):
    core = await make_core()
    core.set_project(ADMIN, "p", {"members": ["alice"]})
    with pytest.raises(InvalidRequest, match=words):
        core.set_project(ADMIN, "p", {"members": members})
    assert core.list_projects()[0]["members"] == ["alice"]


async def test_only_an_admin_sets_members(make_core):
    core = await make_core()
    core.set_project(ADMIN, "p", {})
    with pytest.raises(Forbidden):
        core.set_project(ALICE, "p", {"members": ["alice"]})


def test_a_store_from_before_members_is_upgraded_in_place(tmp_path):
    """A state.db made before projects had members opens with every project open, nothing lost."""
    import sqlite3

    db = sqlite3.connect(tmp_path / "state.db")
    db.execute("CREATE TABLE projects (name TEXT PRIMARY KEY, build_quota_milli INTEGER NOT NULL DEFAULT 0, "
               "train_guarantee_milli INTEGER NOT NULL DEFAULT 0, train_limit_milli INTEGER, "
               "weight REAL NOT NULL DEFAULT 1.0, created_at REAL NOT NULL)")
    db.execute("INSERT INTO projects(name, build_quota_milli, created_at) VALUES ('old', 2000, 1.0)")
    db.commit()
    db.close()
    store = Store(tmp_path / "state.db")
    old = store.project("old")
    assert old is not None and old.build_quota_milli == 2000 and old.members is None
    old.members = ["alice"]
    store.upsert_project(old)
    assert store.project("old").members == ["alice"]  # type: ignore[union-attr]
    store.close()
