"""The SQLite store: records round-trip, WAL is on, transactions roll back, a second process sees commits."""

from __future__ import annotations

import sqlite3
import subprocess
import sys

import pytest

from gpupool.service.store import JobRecord, ProjectRecord, Store
from tests.service.helpers import older_store


def _job(num: int, **kw: object) -> JobRecord:
    base = dict(id=f"j-{num:06d}", num=num, name="n", project="p", user="alice", kind="train", state="queued",
                request={"gpus": 1, "gpu_fraction": None}, submitted_at=1.0 + num, command=["python", "x.py"],
                labels={"notebook": "a.ipynb"}, job_env={"K": "V"})
    base.update(kw)
    return JobRecord(**base)  # type: ignore[arg-type]


def test_wal_and_roundtrip(tmp_path):
    s = Store(tmp_path / "s.db")
    assert s.journal_mode == "wal"
    s.upsert_project(ProjectRecord("p", build_quota_milli=1500, train_limit_milli=None, weight=2.0))
    rec = _job(1, assignment={"node": "h", "gpus": [{"id": "GPU-1", "milli": 250}]}, preemptible=True)
    s.insert_job(rec)
    got = s.job("j-000001")
    assert got == rec
    s.update_job("j-000001", state="running", user_paused=True, env={"CUDA_VISIBLE_DEVICES": "GPU-1"})
    got = s.job("j-000001")
    assert got is not None and got.state == "running" and got.user_paused is True
    assert got.env == {"CUDA_VISIBLE_DEVICES": "GPU-1"}
    s.close()
    again = Store(tmp_path / "s.db")  # reopening finds everything
    assert again.job("j-000001") == got
    assert again.project("p") == ProjectRecord("p", 1500, 0, None, 2.0, again.project("p").created_at)  # type: ignore[union-attr]
    again.close()


def test_transaction_rolls_back(tmp_path):
    s = Store(tmp_path / "s.db")
    with pytest.raises(RuntimeError):
        with s.transaction():
            s.insert_job(_job(1))
            s.update_job("j-000001", state="running")
            raise RuntimeError("boom")
    assert s.job("j-000001") is None
    with pytest.raises(KeyError):
        s.update_job("j-000001", no_such_column=1)


def test_job_numbers_and_filters(tmp_path):
    s = Store(tmp_path / "s.db")
    nums = [s.next_job_number() for _ in range(3)]
    assert nums == [1, 2, 3]
    for n in nums:
        s.insert_job(_job(n, state="running" if n == 2 else "queued", client_key="k" if n == 3 else None))
    assert [j.id for j in s.jobs(("queued",))] == ["j-000001", "j-000003"]
    assert [j.id for j in s.jobs(newest_first=True, limit=2)] == ["j-000003", "j-000002"]
    assert s.live_job_by_key("alice", "k").id == "j-000003"  # type: ignore[union-attr]
    assert s.live_job_by_key("bob", "k") is None
    assert s.count_live_jobs("p") == 3


def test_events_bounded_and_ordered(tmp_path):
    s = Store(tmp_path / "s.db")
    for i in range(30):
        s.add_event(float(i), {"type": "job", "i": i})
    assert s.last_event_seq() == 30
    evs = s.events_since(25)
    assert [e["seq"] for e in evs] == [26, 27, 28, 29, 30] and evs[0]["i"] == 25
    s.trim_events(10)
    assert s.events_since(0)[0]["seq"] == 21
    s.add_event(99.0, {"type": "pool"})
    assert s.last_event_seq() == 31  # sequence numbers never go back after a trim


def test_history_ring(tmp_path):
    s = Store(tmp_path / "s.db")
    for i in range(20):
        s.add_history(float(i), {"t": float(i)}, keep=5)
    assert [h["t"] for h in s.history_since(None)] == [15.0, 16.0, 17.0, 18.0, 19.0]
    assert [h["t"] for h in s.history_since(17.0)] == [18.0, 19.0]


def test_commit_visible_to_another_process(tmp_path):
    s = Store(tmp_path / "s.db")
    s.insert_job(_job(1))
    code = (
        "import sqlite3,sys; db=sqlite3.connect(sys.argv[1]);"
        "print(db.execute('select state from jobs').fetchone()[0])"
    )
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "s.db")], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "queued"
    # The store keeps its single connection usable while another reader has the file open.
    other = sqlite3.connect(str(tmp_path / "s.db"))
    other.execute("select count(*) from jobs").fetchone()
    s.update_job("j-000001", state="running")
    assert other.execute("select state from jobs").fetchone()[0] == "running"


def test_synchronous_normal_by_default_full_on_request(tmp_path):
    from gpupool.service.config import ServiceConfig

    assert ServiceConfig(state_dir=tmp_path).sqlite_synchronous == "NORMAL"
    normal, full = Store(tmp_path / "n.db"), Store(tmp_path / "f.db", synchronous="FULL")
    try:
        # PRAGMA synchronous answers 1 for NORMAL and 2 for FULL.
        assert normal._db.execute("PRAGMA synchronous").fetchone()[0] == 1
        assert full._db.execute("PRAGMA synchronous").fetchone()[0] == 2
        assert normal.journal_mode == "wal"
    finally:
        normal.close()
        full.close()
    with pytest.raises(ValueError):
        Store(tmp_path / "x.db", synchronous="OFF")


def test_event_rows_written_before_seq_in_body_still_read(tmp_path):
    s = Store(tmp_path / "s.db")
    with s.transaction() as db:  # an event as the previous schema wrote it: seq and t inside the body too
        db.execute("INSERT INTO events(t, body) VALUES (5.0, '{\"seq\": 1, \"t\": 5.0, \"type\": \"pool\"}')")
    s.add_event(6.0, {"type": "job", "job_id": "j-000001"})
    assert s.events_since(0) == [{"seq": 1, "t": 5.0, "type": "pool"},
                                 {"seq": 2, "t": 6.0, "type": "job", "job_id": "j-000001"}]
    s.close()


def test_a_store_from_before_job_images_is_upgraded_in_place(tmp_path):
    """A state.db whose jobs table has no image column opens with its jobs intact (no image) and stores images."""
    assert "image" not in older_store(tmp_path / "state.db", ",\n    image TEXT\n", "\n")
    s = Store(tmp_path / "state.db")
    old = s.job("j-000001")
    assert old is not None and old.name == "old" and old.command == ["true"] and old.image is None
    s.insert_job(_job(2, image="registry.example/x:2"))
    s.close()
    again = Store(tmp_path / "state.db")
    assert again.job("j-000002").image == "registry.example/x:2"  # type: ignore[union-attr]
    assert again.job("j-000001").image is None  # type: ignore[union-attr]
    again.close()


def test_a_store_from_before_last_assignments_is_upgraded_in_place(tmp_path):
    """A state.db whose jobs table has no last_assignment column opens with its jobs intact and then keeps one."""
    older_store(tmp_path / "state.db", "\n    last_assignment TEXT,", row=(
        "INSERT INTO jobs(id, num, name, project, user, kind, state, request, submitted_at, finished_at) "
        "VALUES ('j-000001', 1, 'old', 'p', 'alice', 'train', 'succeeded', '{\"gpus\": 1}', 1.0, 2.0)"))
    s = Store(tmp_path / "state.db")
    old = s.job("j-000001")
    assert old is not None and old.state == "succeeded" and old.last_assignment is None
    ran = {"node": "testhost", "gpus": [{"id": "GPU-0", "index": 0, "model": "A100-80GB", "milli": 1000}]}
    s.update_job("j-000001", last_assignment=ran)
    s.close()
    again = Store(tmp_path / "state.db")
    assert again.job("j-000001").last_assignment == ran  # type: ignore[union-attr]
    again.close()


def test_a_store_from_before_refusal_holds_is_upgraded_in_place(tmp_path):
    """A state.db without the refusals and held_until columns opens with its jobs intact and then keeps them."""
    older_store(tmp_path / "state.db", "\n    refusals INTEGER NOT NULL DEFAULT 0,\n    held_until REAL,")
    s = Store(tmp_path / "state.db")
    old = s.job("j-000001")
    assert old is not None and old.name == "old" and (old.refusals, old.held_until) == (0, None)
    s.update_job("j-000001", refusals=2, held_until=123.5)
    s.close()
    again = Store(tmp_path / "state.db")
    assert (again.job("j-000001").refusals, again.job("j-000001").held_until) == (2, 123.5)  # type: ignore[union-attr]
    again.close()
