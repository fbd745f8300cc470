"""A process's line of ``/proc/<pid>/stat`` (Linux), read one way for every part that needs it.

Why in one place: a process id alone does not name a process (ids are
reused), so the local executor, its job wrapper and the runtime files all
tell a process from a later one with the same id by its start time (field 22,
in clock ticks since boot, which no clock change moves). The command name in
field 2 may hold spaces and parentheses: the fields are read after its last
``)``. Imports nothing: every CLI call and the isolated job wrapper import it.
"""

from __future__ import annotations


def stat_fields(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (the state first), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rindex(b")") + 2:].decode(errors="replace").split()


def start_ticks(pid: int) -> int | None:
    """When process ``pid`` started, in clock ticks since boot; None when it is gone or unreadable."""
    fields = stat_fields(pid)
    try:
        return int(fields[19]) if fields else None
    except (ValueError, IndexError):
        return None
