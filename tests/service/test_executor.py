"""The local executor with real processes: logs, exit codes, process-group stop with grace, re-adoption."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from pathlib import Path

from gpupool.backends.local.executor import LocalExecutor, proc_start_time

PY = sys.executable


def _wait_dead(ex: LocalExecutor, h, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while ex.alive(h) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not ex.alive(h)


def test_runs_in_workdir_logs_and_records_exit(tmp_path):
    ex = LocalExecutor(tmp_path / "jobs")
    wd = tmp_path / "wd"
    code = "import os,sys; print('cwd', os.getcwd()); print('env', os.environ['FOO']); print('err', file=sys.stderr); sys.exit(3)"
    h = ex.spawn("j-1", 1, [PY, "-c", code], str(wd), {**os.environ, "FOO": "bar"})
    assert os.getpgid(h.pid) == h.pid  # own process group
    _wait_dead(ex, h)
    assert ex.exit_code("j-1", 1) == 3
    log = ex.log_path("j-1").read_text()
    assert f"cwd {wd}" in log and "env bar" in log and "err" in log and "attempt 1" in log


def test_missing_program_is_exit_127(tmp_path):
    ex = LocalExecutor(tmp_path / "jobs")
    h = ex.spawn("j-1", 1, ["/nonexistent/prog"], str(tmp_path), dict(os.environ))
    _wait_dead(ex, h)
    assert ex.exit_code("j-1", 1) == 127
    assert "cannot start" in ex.log_path("j-1").read_text()


async def test_stop_signals_whole_group_and_honours_grace(tmp_path):
    ex = LocalExecutor(tmp_path / "jobs")
    # Parent starts a grandchild in the same group; both write a marker on SIGTERM.
    code = (
        "import signal,subprocess,sys,time,os\n"
        "child = subprocess.Popen([sys.executable, '-c', 'import signal,time,sys\\n"
        "signal.signal(signal.SIGTERM, lambda *a: (open(\"child.term\",\"w\").close(), sys.exit(0)))\\n"
        "open(\"child.ready\",\"w\").close()\\ntime.sleep(60)'])\n"
        "def term(*a):\n    open('parent.term','w').close(); child.wait(); sys.exit(0)\n"
        "signal.signal(signal.SIGTERM, term)\n"
        "time.sleep(60)\n"
    )
    h = ex.spawn("j-1", 1, [PY, "-c", code], str(tmp_path / "wd"), dict(os.environ))
    for _ in range(500):
        if (tmp_path / "wd" / "child.ready").exists():
            break
        await asyncio.sleep(0.02)
    graceful = await ex.stop(h, grace_s=10)
    assert graceful
    assert (tmp_path / "wd" / "parent.term").exists() and (tmp_path / "wd" / "child.term").exists()
    assert ex.exit_code("j-1", 1) == 0


async def test_stop_kills_after_grace(tmp_path):
    ex = LocalExecutor(tmp_path / "jobs")
    code = "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); open('ready','w').close(); time.sleep(60)"
    h = ex.spawn("j-1", 1, [PY, "-c", code], str(tmp_path / "wd"), dict(os.environ))
    for _ in range(500):
        if (tmp_path / "wd" / "ready").exists():
            break
        await asyncio.sleep(0.02)
    graceful = await ex.stop(h, grace_s=0.3)
    assert not graceful
    assert not ex.alive(h) and not ex.group_alive(h)
    assert ex.exit_code("j-1", 1) is None  # the wrapper died with the group: no status recorded


def test_adopt_by_pid_and_start_time(tmp_path):
    ex = LocalExecutor(tmp_path / "jobs")
    h = ex.spawn("j-1", 1, [PY, "-c", "import time; time.sleep(30)"], str(tmp_path), dict(os.environ))
    try:
        other = LocalExecutor(tmp_path / "jobs")  # as a restarted service would
        adopted = other.adopt("j-1", 1, h.pid, h.start_time)
        assert adopted is not None and other.alive(adopted)
        assert other.adopt("j-1", 1, h.pid, h.start_time + 1) is None  # pid reused by someone else: not ours
        assert proc_start_time(h.pid) == h.start_time
    finally:
        os.killpg(h.pid, signal.SIGKILL)
        h.popen.wait()  # type: ignore[union-attr]
    assert other.adopt("j-1", 1, h.pid, h.start_time) is None


def test_revoked_launch_never_runs(tmp_path):
    ex = LocalExecutor(tmp_path / "jobs")
    # A recovery that finds no pid for the attempt revokes the ticket before the wrapper claims it.
    prefix = Path(str(ex.job_dir("j-1") / "run" / "attempt-1"))
    prefix.parent.mkdir(parents=True)
    Path(str(prefix) + ".launch").write_text("x")
    assert ex.recover_unrecorded("j-1", 1).outcome == "not-started"
    from gpupool.backends.local import _wrapper

    marker = tmp_path / "ran"
    rc = _wrapper.main([str(prefix), "--", PY, "-c", f"open({str(marker)!r},'w')"])
    assert rc == _wrapper.REVOKED_EXIT and not marker.exists()


def test_claimed_attempt_is_found_running_or_finished(tmp_path):
    ex = LocalExecutor(tmp_path / "jobs")
    h = ex.spawn("j-1", 1, [PY, "-c", "import time; time.sleep(30)"], str(tmp_path), dict(os.environ))
    try:
        for _ in range(500):
            if Path(str(ex.job_dir("j-1") / "run" / "attempt-1.pid")).exists():
                break
            time.sleep(0.02)
        found = ex.recover_unrecorded("j-1", 1)
        assert found.outcome == "running" and found.handle is not None and found.handle.pid == h.pid
    finally:
        os.killpg(h.pid, signal.SIGTERM)
        h.popen.wait()  # type: ignore[union-attr]
    found = ex.recover_unrecorded("j-1", 1)
    assert found.outcome == "finished" and found.exit_code == -signal.SIGTERM
