"""A running pod's output, copied into its job's log file while it runs, and its rest when it ends.

``gpupool logs`` (and the Lab panel) read the job's log file
(``read_log``); on Kubernetes the output is in the pod log API instead. One
poller thread per executor copies new lines from there into the file:

* **Why one poller, not a follower per pod.** A ``follow=true`` stream per
  running pod costs a thread and an open connection through the API server to
  a kubelet for every pod, all the time, mostly for logs nobody reads; at
  thousands of pods that is thousands of threads and streams. The poller makes
  plain, bounded requests (``limitBytes``) one after another, and spends them
  where someone looks: a job whose log was read in the last minute
  (:meth:`LiveLogs.viewed`, called from the executor's ``log_path``, which
  ``read_log`` asks for) is polled every second; every other running pod at
  most every ``background_s`` seconds, and no more often in all than
  ``background_rate`` requests per second, so a cluster of thousands of pods
  costs the API server a fixed trickle. A first ``gpupool logs`` thus shows
  output at most ``background_s`` old, and a follow (``gpupool logs -f``)
  about a second behind.

* **No line twice, none lost.** The log API has no byte offset; it has
  ``sinceTime`` (whole seconds) and ``timestamps=true`` (each line stamped
  by the runtime). A pod's position is ``(since, skip)``: ask from second
  ``since``, skip the first ``skip`` lines (those already copied), copy the
  rest; then ``since`` becomes the second of the last line copied and
  ``skip`` the number of lines copied from that second on. That is exact
  whatever the lines' order, since the kubelet answers every line stamped at
  or after ``since`` in log order. Only whole lines are copied while the pod
  runs (a line still being written waits). At the end the rest is copied
  from the same position, trailing partial line included, under the same lock
  as the poller, so the archive adds exactly what the file lacks; it starts
  the moment the watch sees the container end (:meth:`LiveLogs.ended`), before
  the core's monitor turns the job final, so that ``gpupool logs -f``, which
  stops at the end, almost always has the last lines too (it misses them only
  when the final copy takes longer than the monitor's next look, ``poll_s``;
  the archive has them anyway). The position is saved next to the log
  (``job.log.live``) after each copy, so a restarted scheduler goes on from it
  instead of copying again.

A pod deleted before its last lines were read (a stop: the kubelet removes the
pod once its container has ended) cannot be asked any more; the file then says
that its tail may be missing, never silently.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

log = logging.getLogger("gpupool.backends.kubernetes")

CONTAINER = "job"
CHUNK_BYTES = 1024 * 1024  # one request's most (limitBytes): a huge log is copied in steps, never at once
VIEWED_FOR_S = 60.0  # a job whose log was read this recently is followed closely
TICK_S = 0.2  # how often the poller looks for due pods while someone follows a log
IDLE_TICK_S = 1.0  # ... and while nobody does (background polls are >= 10 s apart: a finer look is wasted)
FINAL_RETRY_S = (1.0, 2.0)  # waits before the second and third try of an end's copy
_STAMP = re.compile(rb"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.\d+)?(Z|[+-]\d\d:\d\d) ")


@dataclass
class _Position:
    """Where one pod's copy stands (guarded by its own lock: the poller and ``finish`` take turns)."""

    job_id: str
    attempt: int
    pod: str
    since: int | None = None  # unix second asked from (None: from the start)
    skip: int = 0  # lines at or after ``since`` already copied
    skip_bytes: int = 0  # their size as the API sends them (stamped): asked for on top of a chunk
    header: bool = False  # the attempt's header line is in the file
    done: bool = False  # finished: nothing more is copied
    last_poll: float = 0.0
    lock: threading.Lock = field(default_factory=threading.Lock)


class _NotThere(Exception):
    """The pod is gone (404), or has no log yet (400: not bound, container not started)."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(f"HTTP {status}: {text[:200]}")
        self.status = status


def _second(stamp: bytes) -> int | None:
    """The unix second of a kubelet stamp (RFC 3339, any fraction, Z or an offset)."""
    m = _STAMP.match(stamp)
    if m is None:
        return None
    zone = m.group(2).decode()
    when = datetime.strptime(m.group(1).decode(), "%Y-%m-%dT%H:%M:%S")
    if zone == "Z":
        return int(when.replace(tzinfo=timezone.utc).timestamp())
    return int(datetime.fromisoformat(m.group(1).decode() + zone).timestamp())


def header(job_id: str, attempt: int, pod: str) -> str:
    """The line that opens an attempt's part of the job's log."""
    return f"--- gpupool: attempt {attempt} of {job_id} (pod {pod}) ---\n"


class LiveLogs:
    """Copies the output of running pods into their jobs' log files (one thread, bounded request rate)."""

    def __init__(self, api: Any, namespace: str, log_path: Callable[[str], Path],
                 running: Callable[[], list[tuple[str, int, str]]],
                 submit: Callable[..., Any] | None = None, *, viewed_s: float = 1.0,
                 background_s: float = 10.0, background_rate: float = 20.0, timeout_s: float = 10.0) -> None:
        """``running()``: the (job id, attempt, pod name) of every single-pod attempt that may be running.

        ``submit(fn, *args)`` runs the final copy of an ended pod off the watch's thread (:meth:`ended`).
        """
        self.api = api
        self.submit = submit or (lambda fn, *args: threading.Thread(target=fn, args=args, daemon=True).start())
        self.namespace = namespace
        self.log_path = log_path
        self.running = running
        self.viewed_s = viewed_s
        self.background_s = background_s
        self.background_rate = background_rate
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._positions: dict[str, _Position] = {}  # by pod name
        self._viewed: dict[str, float] = {}  # job id -> when its log was last asked for
        self._finished: set[str] = set()  # pods finished while the poller may still hold them as running
        self._settles: dict[str, threading.Event] = {}  # ended pods' final copies (set when done)
        self._stop = threading.Event()
        self._wake = threading.Event()  # a log was asked for, or stop(): look at once
        self._thread = threading.Thread(target=self._run, daemon=True, name="gpupool-kube-logs")
        self.requests = 0  # log API calls made (for the benchmark and tests)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()

    def viewed(self, job_id: str) -> None:
        """Someone read this job's log: follow its pod closely for a while."""
        with self._lock:
            self._viewed[job_id] = time.monotonic()
        self._wake.set()

    # ------------------------------------------------------------ the poller (its thread)
    def _run(self) -> None:
        """Look for due pods every ``TICK_S`` while a log is followed, else every ``IDLE_TICK_S``.

        Each look walks every running pod (10,000 at a large pool's full
        load), so it is not done five times a second for nobody.
        """
        while True:
            self._wake.wait(TICK_S if self._viewed else IDLE_TICK_S)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                for pos in self._due():
                    if self._stop.is_set():
                        return
                    self._poll(pos)
            except Exception:  # never let one bad answer end live logs for every pod
                log.exception("live logs: poll failed")

    def _due(self) -> list[_Position]:
        """The positions to poll now, the longest-waiting first."""
        now = time.monotonic()
        pods = self.running()
        with self._lock:
            live = {pod for _, _, pod in pods}
            for name in [n for n, p in self._positions.items() if n not in live and not p.header]:
                del self._positions[name]  # never copied anything (a refused start): nothing to finish
            self._finished &= live  # a list made before the pod's release may still name it: never again
            self._viewed = {j: t for j, t in self._viewed.items() if now - t < VIEWED_FOR_S}
            background = max(self.background_s, len(pods) / self.background_rate)
            due = []
            for job_id, attempt, pod in pods:
                if pod in self._finished:
                    continue
                pos = self._positions.get(pod)
                if pos is None:
                    pos = self._positions[pod] = self._load(job_id, attempt, pod)
                    pos.last_poll = now - background * (hash(pod) % 1000) / 1000  # spread first polls out
                every = self.viewed_s if job_id in self._viewed else background
                if now - pos.last_poll >= every:
                    due.append(pos)
        return sorted(due, key=lambda p: p.last_poll)

    def _poll(self, pos: _Position) -> None:
        with pos.lock:
            if pos.done:
                return
            pos.last_poll = time.monotonic()
            try:
                self._copy(pos, final=False)
            except _NotThere:
                pass  # not started yet, or just gone: its release settles it
            except Exception as e:
                log.debug("live logs: pod %s: %s", pos.pod, e)

    # ------------------------------------------------------------ the end
    def ended(self, job_id: str, attempt: int, pod: str) -> None:
        """The watch saw the pod's container end: copy its last lines now, on a worker thread.

        Started the moment the end is seen, this usually lands before the
        core's monitor notices the end and turns the job final, so a reader
        that stops at the end (``gpupool logs -f``) has the last lines too.
        """
        with self._lock:
            if pod in self._settles:
                return
            done = self._settles[pod] = threading.Event()
        self.submit(self._settle, job_id, attempt, pod, done)

    def _settle(self, job_id: str, attempt: int, pod: str, done: threading.Event) -> None:
        try:
            self._final_copy(job_id, attempt, pod)
        finally:
            done.set()

    def finish(self, job_id: str, attempt: int, pod: str) -> None:
        """Make the attempt's part of the job's log whole (its release): the final copy, once."""
        with self._lock:
            started = self._settles.pop(pod, None)
        if started is not None:
            started.wait(self.timeout_s * 4)  # made by :meth:`ended`; each of its requests has a timeout
            return
        self._final_copy(job_id, attempt, pod)

    def _final_copy(self, job_id: str, attempt: int, pod: str) -> None:
        """Copy what the file still lacks of this pod, trailing partial line included; then stop following it."""
        with self._lock:
            pos = self._positions.pop(pod, None)
            self._finished.add(pod)
        if pos is None:
            pos = self._load(job_id, attempt, pod)
        with pos.lock:
            pos.done = True
            try:
                self._copy_retrying(pos)
            except Exception as e:
                gone = isinstance(e, _NotThere) and e.status == 404
                note = (f"(gpupool: pod {pod} was gone before its last output was read; lines after the last "
                        "live read may be missing)\n" if gone and pos.header else
                        f"(the log of pod {pod} could not be read: {_describe(e)})\n")
                self._append(pos, note)
            if not pos.header:
                self._append(pos, "")  # an attempt that printed nothing still shows in the log
            self._forget(pos)

    def _copy_retrying(self, pos: _Position) -> None:
        """The final copy; an API server that does not answer gets two more tries (the pod is deleted next)."""
        for delay in (*FINAL_RETRY_S, None):
            try:
                self._copy(pos, final=True)
                return
            except _NotThere:
                raise
            except Exception as e:
                if delay is None:
                    raise
                log.info("live logs: pod %s: final copy failed (%s); again in %g s", pos.pod, _describe(e), delay)
                time.sleep(delay)

    # ------------------------------------------------------------ copying
    def _copy(self, pos: _Position, final: bool) -> None:
        """Fetch from ``pos`` and append what is new, chunk after chunk until an answer is short."""
        while True:
            data = self._fetch(pos)
            full = len(data) >= pos.skip_bytes + CHUNK_BYTES  # cut by limitBytes: more follows
            lines = data.split(b"\n")
            tail = lines.pop()  # b"" after a final newline; else a line still being written, or cut
            if tail and ((final and not full) or len(lines) <= pos.skip):
                lines.append(tail)  # the very end of the output, or one new line longer than a chunk (cut there)
            took = self._take(pos, lines) if lines else False
            if not full:
                return
            if not took:  # cannot happen with limitBytes past the skipped lines; never loop on it
                log.warning("live logs: pod %s: a full answer held nothing new; stopping this copy", pos.pod)
                return

    def _take(self, pos: _Position, lines: list[bytes]) -> bool:
        """Append the lines past ``pos.skip`` (stamps removed) and move the position past them; any new?"""
        seconds: list[int | None] = []
        texts = []
        last = pos.since
        for raw in lines:
            m = _STAMP.match(raw)
            sec = _second(raw) if m else None
            last = sec if sec is not None else last
            seconds.append(last)
            texts.append(raw[m.end():] if m else raw)
        new = texts[pos.skip:]
        if not new:
            return False
        self._append(pos, b"\n".join(new).decode("utf-8", "replace") + "\n")
        since = seconds[-1]
        if since is None:  # no line had a stamp (not a kubelet's answer): count from the start
            pos.skip, pos.skip_bytes = len(lines), sum(len(raw) + 1 for raw in lines)
        else:
            kept = [raw for raw, sec in zip(lines, seconds, strict=True) if sec is not None and sec >= since]
            pos.skip, pos.skip_bytes = len(kept), sum(len(raw) + 1 for raw in kept)
            pos.since = since
        self._save(pos)
        return True

    def _fetch(self, pos: _Position) -> bytes:
        # limitBytes counts from ``since``: past the lines already copied, one chunk of new ones.
        query: list[tuple[str, str]] = [("container", CONTAINER), ("timestamps", "true"),
                                        ("limitBytes", str(pos.skip_bytes + CHUNK_BYTES))]
        if pos.since is not None:
            query.append(("sinceTime", datetime.fromtimestamp(pos.since, timezone.utc)
                          .strftime("%Y-%m-%dT%H:%M:%SZ")))
        client = self.api.api_client
        params = client.param_serialize("GET", "/api/v1/namespaces/{namespace}/pods/{name}/log",
                                        path_params={"namespace": self.namespace, "name": pos.pod},
                                        query_params=query, header_params={"Accept": "application/json, */*"},
                                        auth_settings=["BearerToken"])
        self.requests += 1
        resp = client.call_api(*params, _request_timeout=self.timeout_s)
        data = resp.read() or b""
        if resp.status in (400, 404):
            raise _NotThere(resp.status, data.decode("utf-8", "replace"))
        if not 200 <= resp.status < 300:
            raise RuntimeError(f"HTTP {resp.status}: {data.decode('utf-8', 'replace')[:200]}")
        return data

    # ------------------------------------------------------------ the file and the saved position
    def _append(self, pos: _Position, text: str) -> None:
        path = self.log_path(pos.job_id)
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(path, "a") as f:
            if not pos.header:
                f.write(header(pos.job_id, pos.attempt, pos.pod))
                pos.header = True
            f.write(text)

    def _saved(self, job_id: str) -> Path:
        return self.log_path(job_id).with_name("job.log.live")

    def _save(self, pos: _Position) -> None:
        path = self._saved(pos.job_id)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps({"pod": pos.pod, "since": pos.since, "skip": pos.skip,
                                   "skip_bytes": pos.skip_bytes}))
        os.replace(tmp, path)

    def _load(self, job_id: str, attempt: int, pod: str) -> _Position:
        """A fresh position, or the saved one of this pod (a restarted scheduler goes on from it)."""
        pos = _Position(job_id, attempt, pod)
        try:
            saved = json.loads(self._saved(job_id).read_text())
        except (OSError, ValueError):
            return pos
        if isinstance(saved, dict) and saved.get("pod") == pod:
            pos.since = saved.get("since") if isinstance(saved.get("since"), int) else None
            pos.skip = saved["skip"] if isinstance(saved.get("skip"), int) else 0
            pos.skip_bytes = saved["skip_bytes"] if isinstance(saved.get("skip_bytes"), int) else 0
            pos.header = True
        return pos

    def _forget(self, pos: _Position) -> None:
        try:
            self._saved(pos.job_id).unlink()
        except FileNotFoundError:
            pass


def _describe(e: BaseException) -> str:
    from gpupool.backends.kubernetes.health import describe

    return describe(e)
