"""Durable state in SQLite (WAL): projects, jobs, events, tokens, history.

The service writes every job transition here in a transaction *before* it
acts on it (e.g. "starting attempt 3" is committed before the process is
spawned), so a service killed at any instant restarts from a state that says
what it was doing. The store is small and synchronous: one connection, used
from the service's event-loop thread; each write is one short transaction.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from gpupool.wire.states import LIVE_STATES

SCHEMA_VERSION = 2  # 2: gpu_use (allocated vs used per job, issue 26), created in place in an older store

_LIVE_SQL = ", ".join(f"'{s}'" for s in LIVE_STATES)  # for "state IN (...)"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS projects (
    name TEXT PRIMARY KEY,
    build_quota_milli INTEGER NOT NULL DEFAULT 0,
    train_guarantee_milli INTEGER NOT NULL DEFAULT 0,
    train_limit_milli INTEGER,
    weight REAL NOT NULL DEFAULT 1.0,
    created_at REAL NOT NULL,
    members TEXT,
    idle TEXT
);
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    num INTEGER NOT NULL UNIQUE,
    name TEXT NOT NULL,
    project TEXT NOT NULL,
    user TEXT NOT NULL,
    kind TEXT NOT NULL,
    state TEXT NOT NULL,
    request TEXT NOT NULL,
    priority INTEGER NOT NULL DEFAULT 0,
    submitted_at REAL NOT NULL,
    started_at REAL,
    finished_at REAL,
    paused_at REAL,
    attempts INTEGER NOT NULL DEFAULT 0,
    preemptible INTEGER NOT NULL DEFAULT 0,
    reason TEXT NOT NULL DEFAULT '',
    assignment TEXT,
    exit_code INTEGER,
    workdir TEXT NOT NULL DEFAULT '',
    command TEXT,
    env TEXT NOT NULL DEFAULT '{}',
    job_env TEXT NOT NULL DEFAULT '{}',
    labels TEXT NOT NULL DEFAULT '{}',
    lease_expires_at REAL,
    client_key TEXT,
    user_paused INTEGER NOT NULL DEFAULT 0,
    stop_intent TEXT,
    pid INTEGER,
    pid_start INTEGER,
    replicas INTEGER NOT NULL DEFAULT 1,
    refusals INTEGER NOT NULL DEFAULT 0,
    held_until REAL,
    last_assignment TEXT,
    image TEXT
);
CREATE INDEX IF NOT EXISTS jobs_state ON jobs(state);
CREATE INDEX IF NOT EXISTS jobs_key ON jobs(user, client_key);
CREATE INDEX IF NOT EXISTS jobs_client_key ON jobs(client_key);
CREATE TABLE IF NOT EXISTS events (seq INTEGER PRIMARY KEY AUTOINCREMENT, t REAL NOT NULL, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS tokens (hash TEXT PRIMARY KEY, user TEXT NOT NULL, created_at REAL NOT NULL);
CREATE TABLE IF NOT EXISTS history (id INTEGER PRIMARY KEY AUTOINCREMENT, t REAL NOT NULL, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS history_t ON history(t);
CREATE TABLE IF NOT EXISTS usage (project TEXT NOT NULL, kind TEXT NOT NULL, value REAL NOT NULL,
    PRIMARY KEY (project, kind));
CREATE TABLE IF NOT EXISTS gpu_use (res INTEGER NOT NULL, t INTEGER NOT NULL, job INTEGER NOT NULL,
    alloc INTEGER NOT NULL, measured INTEGER NOT NULL, used INTEGER NOT NULL, peak_mem INTEGER NOT NULL,
    PRIMARY KEY (res, t, job)) WITHOUT ROWID;
"""


@dataclass
class JobRecord:
    """One job as stored. JSON columns are decoded into Python values."""

    id: str
    num: int
    name: str
    project: str
    user: str
    kind: str
    state: str
    request: dict[str, Any]
    priority: int = 0
    submitted_at: float = 0.0
    started_at: float | None = None
    finished_at: float | None = None
    paused_at: float | None = None
    attempts: int = 0
    preemptible: bool = False
    reason: str = ""
    assignment: dict[str, Any] | None = None
    exit_code: int | None = None
    workdir: str = ""
    command: list[str] | None = None
    env: dict[str, str] = field(default_factory=dict)  # GPU env the holder runs with (build jobs)
    job_env: dict[str, str] = field(default_factory=dict)  # extra env from the spec
    labels: dict[str, str] = field(default_factory=dict)
    lease_expires_at: float | None = None
    client_key: str | None = None
    user_paused: bool = False  # a user pause is sticky: no automatic resume
    stop_intent: str | None = None  # "pause" | "preempt" | "cancel" | "shutdown" | "watchdog" while stopping
    pid: int | None = None
    pid_start: int | None = None
    image: str | None = None  # the spec's container image (cluster backends); None: the configured default
    replicas: int = 1  # a multi-node gang's replica count (JobSpec.replicas); 1 for every other job
    # The assignment of the job's last attempt, kept when the attempt ends (finished, paused, preempted):
    # ``assignment`` is cleared then, because project usage counts what it holds.
    last_assignment: dict[str, Any] | None = None
    # Starts refused in a row by the cluster (the API server would not create the pod), and until when the
    # job then waits (wall time; None: not held): the policy does not see it before then.
    refusals: int = 0
    held_until: float | None = None

    @property
    def live(self) -> bool:
        return self.state in LIVE_STATES


_JSON_COLS = {"request", "assignment", "command", "env", "job_env", "labels", "last_assignment"}
_BOOL_COLS = {"preemptible", "user_paused"}
_CODED_COLS = _JSON_COLS | _BOOL_COLS
_COLS = [f.name for f in fields(JobRecord)]


def _column(k: str, v: Any) -> Any:
    """One field's value as stored: JSON columns as text, booleans as 0/1."""
    if k in _JSON_COLS:
        return None if v is None else json.dumps(v)
    if k in _BOOL_COLS:
        return int(bool(v))
    return v


def _encode(rec: JobRecord) -> dict[str, Any]:
    """A row for INSERT. Field by field, not ``asdict``: asdict deep-copies every nested value."""
    row = {k: getattr(rec, k) for k in _COLS}
    for k in _CODED_COLS:
        row[k] = _column(k, row[k])
    return row


def _decode(row: sqlite3.Row) -> JobRecord:
    data = {k: row[k] for k in _COLS}
    for k in _JSON_COLS:
        data[k] = None if data[k] is None else json.loads(data[k])
    for k in _BOOL_COLS:
        data[k] = bool(data[k])
    return JobRecord(**data)


@dataclass
class ProjectRecord:
    name: str
    build_quota_milli: int = 0
    train_guarantee_milli: int = 0
    train_limit_milli: int | None = None
    weight: float = 1.0
    created_at: float = 0.0
    members: list[str] | None = None  # None: open to every user; else user names and "@group" entries
    idle: dict[str, Any] | None = None  # the idle rules as set (gpupool.service.idle); None: the defaults


def _project_of(row: sqlite3.Row) -> ProjectRecord:
    data = {k: row[k] for k in row.keys()}
    data["members"] = None if data.get("members") is None else json.loads(data["members"])
    data["idle"] = None if data.get("idle") is None else json.loads(data["idle"])
    return ProjectRecord(**data)


_ADDED_COLUMNS = (("projects", "members", "TEXT"), ("projects", "idle", "TEXT"), ("jobs", "image", "TEXT"),
                  ("jobs", "replicas", "INTEGER NOT NULL DEFAULT 1"), ("jobs", "last_assignment", "TEXT"),
                  ("jobs", "refusals", "INTEGER NOT NULL DEFAULT 0"), ("jobs", "held_until", "REAL"))
"""Columns added after a table was first released: added to an older store when it is opened."""


class Store:
    """SQLite-backed state. Open once per service; close at stop."""

    def __init__(self, path: Path, synchronous: str = "NORMAL") -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(str(self.path), isolation_level=None, timeout=30.0)
        self._db.row_factory = sqlite3.Row
        self._db.execute("PRAGMA journal_mode=WAL")
        # NORMAL (default): in WAL mode a commit is not fsynced on its own (the WAL is synced at
        # checkpoints), so a killed or crashed process loses nothing it committed; an OS crash or
        # power loss may lose the last commits. FULL syncs every commit: power loss loses nothing.
        if synchronous not in ("FULL", "NORMAL"):
            raise ValueError(f"synchronous must be FULL or NORMAL, not {synchronous!r}")
        self._db.execute(f"PRAGMA synchronous={synchronous}")
        self._db.execute("PRAGMA foreign_keys=ON")
        self._depth = 0
        with self.transaction():
            for stmt in _SCHEMA.split(";"):
                if stmt.strip():
                    self._db.execute(stmt)
            for table, column, decl in _ADDED_COLUMNS:
                have = {r[1] for r in self._db.execute(f"PRAGMA table_info({table})")}
                if column not in have:
                    self._db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {decl}")
            self._db.execute(  # an older store upgraded in place above says so
                "INSERT INTO meta(key, value) VALUES ('schema_version', ?) ON CONFLICT(key) DO UPDATE SET "
                "value=excluded.value WHERE CAST(value AS INTEGER) < CAST(excluded.value AS INTEGER)",
                (str(SCHEMA_VERSION),))
            self._db.execute("INSERT OR IGNORE INTO meta(key, value) VALUES ('next_job', '1')")

    def close(self) -> None:
        self._db.close()

    @property
    def journal_mode(self) -> str:
        return str(self._db.execute("PRAGMA journal_mode").fetchone()[0])

    @contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """``BEGIN IMMEDIATE`` ... ``COMMIT`` (nested calls join the outer one); rollback on error."""
        if self._depth:
            self._depth += 1
            try:
                yield self._db
            finally:
                self._depth -= 1
            return
        self._db.execute("BEGIN IMMEDIATE")
        self._depth = 1
        try:
            yield self._db
        except BaseException:
            self._depth = 0
            self._db.execute("ROLLBACK")
            raise
        self._depth = 0
        self._db.execute("COMMIT")

    def query(self, sql: str, args: Iterable[Any] = ()) -> list[sqlite3.Row]:
        """A read of tables whose writers keep their SQL in their own module (gpupool.service.use_history)."""
        return self._db.execute(sql, tuple(args)).fetchall()

    # ------------------------------------------------------------ meta
    def get_meta(self, key: str) -> str | None:
        row = self._db.execute("SELECT value FROM meta WHERE key=?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        with self.transaction() as db:
            db.execute("INSERT INTO meta(key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value=excluded.value", (key, value))

    # ------------------------------------------------------------ projects
    def upsert_project(self, rec: ProjectRecord) -> None:
        with self.transaction() as db:
            db.execute(
                "INSERT INTO projects(name, build_quota_milli, train_guarantee_milli, train_limit_milli, weight, created_at,"
                " members, idle) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(name) DO UPDATE SET"
                " build_quota_milli=excluded.build_quota_milli, train_guarantee_milli=excluded.train_guarantee_milli,"
                " train_limit_milli=excluded.train_limit_milli, weight=excluded.weight, members=excluded.members,"
                " idle=excluded.idle",
                (rec.name, rec.build_quota_milli, rec.train_guarantee_milli, rec.train_limit_milli, rec.weight,
                 rec.created_at or time.time(), None if rec.members is None else json.dumps(rec.members),
                 None if rec.idle is None else json.dumps(rec.idle)),
            )

    def delete_project(self, name: str) -> None:
        with self.transaction() as db:
            db.execute("DELETE FROM projects WHERE name=?", (name,))

    def projects(self) -> list[ProjectRecord]:
        rows = self._db.execute("SELECT * FROM projects ORDER BY name").fetchall()
        return [_project_of(r) for r in rows]

    def project(self, name: str) -> ProjectRecord | None:
        r = self._db.execute("SELECT * FROM projects WHERE name=?", (name,)).fetchone()
        return None if r is None else _project_of(r)

    # ------------------------------------------------------------ jobs
    def next_job_number(self) -> int:
        """Allocate a job number (inside the caller's transaction when there is one)."""
        with self.transaction() as db:
            n = int(db.execute("SELECT value FROM meta WHERE key='next_job'").fetchone()[0])
            db.execute("UPDATE meta SET value=? WHERE key='next_job'", (str(n + 1),))
        return n

    def insert_job(self, rec: JobRecord) -> None:
        row = _encode(rec)
        cols = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        with self.transaction() as db:
            db.execute(f"INSERT INTO jobs({cols}) VALUES ({marks})", tuple(row.values()))

    def update_job(self, job_id: str, **changes: Any) -> None:
        """Write some columns of one job (one transaction unless inside one)."""
        if not changes:
            return
        enc = {}
        for k, v in changes.items():
            if k not in _COLS or k in ("id", "num"):
                raise KeyError(k)
            enc[k] = _column(k, v)
        sets = ", ".join(f"{k}=?" for k in enc)
        with self.transaction() as db:
            db.execute(f"UPDATE jobs SET {sets} WHERE id=?", (*enc.values(), job_id))

    def job(self, job_id: str) -> JobRecord | None:
        r = self._db.execute("SELECT * FROM jobs WHERE id=?", (job_id,)).fetchone()
        return None if r is None else _decode(r)

    def jobs(
        self,
        states: tuple[str, ...] | list[str] | None = None,
        project: str | None = None,
        user: str | None = None,
        kind: str | None = None,
        limit: int | None = None,
        newest_first: bool = False,
    ) -> list[JobRecord]:
        where: list[str] = []
        args: list[object] = []
        if states:
            where.append(f"state IN ({', '.join('?' for _ in states)})")
            args.extend(states)
        for col, val in (("project", project), ("user", user), ("kind", kind)):
            if val is not None:
                where.append(f"{col}=?")
                args.append(val)
        sql = "SELECT * FROM jobs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY num " + ("DESC" if newest_first else "ASC")
        if limit is not None:
            sql += " LIMIT ?"
            args.append(int(limit))
        return [_decode(r) for r in self._db.execute(sql, args).fetchall()]

    def live_job_by_key(self, user: str, client_key: str) -> JobRecord | None:
        r = self._db.execute(
            f"SELECT * FROM jobs WHERE user=? AND client_key=? AND state IN ({_LIVE_SQL}) ORDER BY num DESC",
            (user, client_key),
        ).fetchone()
        return None if r is None else _decode(r)

    def count_live_jobs(self, project: str) -> int:
        return int(self._db.execute(
            f"SELECT COUNT(*) FROM jobs WHERE project=? AND state IN ({_LIVE_SQL})", (project,)
        ).fetchone()[0])

    # ------------------------------------------------------------ events
    def add_event(self, t: float, body: dict[str, Any]) -> int:
        """Append an event; returns its sequence number.

        One INSERT: ``seq`` and ``t`` live in their columns and are merged into the
        body when read, so an event costs a single statement (submits write one each).
        """
        with self.transaction() as db:
            cur = db.execute("INSERT INTO events(t, body) VALUES (?, ?)", (t, json.dumps(body)))
        return int(cur.lastrowid or 0)

    def events_since(self, seq: int, limit: int = 1000) -> list[dict[str, Any]]:
        rows = self._db.execute("SELECT seq, t, body FROM events WHERE seq>? ORDER BY seq LIMIT ?",
                                (seq, limit)).fetchall()
        return [{"seq": int(r[0]), "t": float(r[1]), **json.loads(r[2])} for r in rows]

    def last_event_seq(self) -> int:
        r = self._db.execute("SELECT MAX(seq) FROM events").fetchone()
        return int(r[0] or 0)

    def trim_events(self, keep: int) -> int:
        with self.transaction() as db:
            cur = db.execute("DELETE FROM events WHERE seq <= (SELECT MAX(seq) FROM events) - ?", (keep,))
        return cur.rowcount

    # ------------------------------------------------------------ tokens
    def add_token(self, token_hash: str, user: str) -> None:
        with self.transaction() as db:
            db.execute("INSERT INTO tokens(hash, user, created_at) VALUES (?, ?, ?)", (token_hash, user, time.time()))

    def token_user(self, token_hash: str) -> tuple[str, str] | None:
        r = self._db.execute("SELECT hash, user FROM tokens WHERE hash=?", (token_hash,)).fetchone()
        return None if r is None else (str(r[0]), str(r[1]))

    # ------------------------------------------------------------ history
    def add_history(self, t: float, body: dict[str, Any], keep: int) -> None:
        with self.transaction() as db:
            db.execute("INSERT INTO history(t, body) VALUES (?, ?)", (t, json.dumps(body)))
            db.execute("DELETE FROM history WHERE id <= (SELECT MAX(id) FROM history) - ?", (keep,))

    # ------------------------------------------------------------ decayed usage
    def save_usage(self, t: float, rows: Iterable[tuple[str, str, float]]) -> None:
        """Replace the decayed usage (milli-GPU-seconds per project and kind) as of time ``t``."""
        with self.transaction() as db:
            db.execute("DELETE FROM usage")
            db.executemany("INSERT INTO usage(project, kind, value) VALUES (?, ?, ?)", list(rows))
            db.execute("INSERT INTO meta(key, value) VALUES ('usage_t', ?) "
                       "ON CONFLICT(key) DO UPDATE SET value=excluded.value", (repr(float(t)),))

    def load_usage(self) -> tuple[float, dict[tuple[str, str], float]]:
        """``(t, {(project, kind): value})`` as last saved; ``(0.0, {})`` when never saved."""
        t = self.get_meta("usage_t")
        rows = self._db.execute("SELECT project, kind, value FROM usage").fetchall()
        return (float(t) if t else 0.0), {(str(r[0]), str(r[1])): float(r[2]) for r in rows}

    def history_since(self, since: float | None, limit: int = 10000) -> list[dict[str, Any]]:
        rows = self._db.execute(
            "SELECT body FROM history WHERE t > ? ORDER BY id DESC LIMIT ?", (since if since is not None else -1.0, limit)
        ).fetchall()
        return [json.loads(r[0]) for r in reversed(rows)]
