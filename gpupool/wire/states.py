"""A job's states and kinds: declared once, for the store, the API, its document and the CLI.

Why an enum of ``str``: the states are stored in SQLite, sent as JSON and
compared with what clients send, so each member *is* its wire string
(``JobState.RUNNING == "running"``), and ``str()``/``format()`` give the bare
string on every Python we support. Which states are live (the job may still
run) and which are final (it never runs again) is decided here too: a
finished job never runs again, so every part must agree on what finished is.
"""

from __future__ import annotations

from enum import Enum


class JobState(str, Enum):
    """Where a job is in its life: queued -> running <-> paused, then one final state."""

    QUEUED = "queued"  # waiting for GPUs (a new job, or one requeued after its attempt ended early)
    RUNNING = "running"  # its attempt holds GPUs
    PAUSED = "paused"  # stopped to give GPUs back (checkpoint signal), waits to resume
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"
    REJECTED = "rejected"  # refused at its first cycle (e.g. it can never fit); never ran

    __str__ = str.__str__
    __format__ = str.__format__  # type: ignore[assignment]  # (formats as the value, like __str__)

    @property
    def final(self) -> bool:
        """Whether the job is done for good (it never runs again)."""
        return self in FINAL_STATES


class JobKind(str, Enum):
    """What a job is for: training (the shared queue) or build (a kernel's share of the fixed quota)."""

    TRAIN = "train"
    BUILD = "build"

    __str__ = str.__str__
    __format__ = str.__format__  # type: ignore[assignment]  # (formats as the value, like __str__)


LIVE_STATES: tuple[JobState, ...] = (JobState.QUEUED, JobState.RUNNING, JobState.PAUSED)
FINAL_STATES: tuple[JobState, ...] = (JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.REJECTED)
ALL_STATES: tuple[JobState, ...] = LIVE_STATES + FINAL_STATES
