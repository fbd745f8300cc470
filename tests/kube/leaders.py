"""Schedulers that elect a leader, for tests/kube/test_leader.py and bench/kube_leader.py.

Each :class:`Scheduler` is a real ``gpupool serve --backend kubernetes``
process. Several share one state directory, as two replicas of the
Deployment share a ReadWriteMany volume: only the leader opens the store
there, and the state-dir lock keeps a new leader out until the old one's
process is gone. (With a state directory each, a new leader would not know
the old one's jobs: that is no standby, that is a second install.)
"""

from __future__ import annotations

import collections
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from kubernetes import client, watch

TOKEN = "leader-test-admin-token"
LEASE = "gpupool-scheduler"
FAST: dict[str, Any] = {
    "poll_s": 0.05, "tick_s": 0.2, "min_runtime_s": 0, "resume_backoff_s": 0, "pause_grace_s": 2,
    "cycle_min_interval_s": 0, "run_jobs_as": "service",
    # short terms so that ten takeovers fit in a test; a 2-core machine shared with other tests' load
    # still renews well within the deadline (every 0.5 s, 2 s allowed)
    "kube_lease_duration_s": 3, "kube_renew_deadline_s": 2, "kube_retry_period_s": 0.5,
}


class Scheduler:
    """One ``gpupool serve`` process: it leads at once, or says it is a standby (its first line)."""

    def __init__(self, work: Path, kubeconfig: Path, namespace: str, state_dir: Path, name: str,
                 settings: dict[str, Any] | None = None) -> None:
        work.mkdir(parents=True, exist_ok=True)
        cfg = work / f"{name}.json"
        cfg.write_text(json.dumps({**FAST, **(settings or {})}))
        self.log = work / f"{name}.log"
        self.name = name
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gpupool", "serve", "--port", "0", "--state-dir", str(state_dir), "--config",
             str(cfg), "--backend", "kubernetes", "--kubeconfig", str(kubeconfig), "--namespace", namespace],
            env={**os.environ, "GPUPOOL_ADMIN_TOKEN": TOKEN}, stdout=subprocess.PIPE,
            stderr=open(self.log, "w"), text=True)  # kept for a failure's reader
        self.identity = f"{socket.gethostname()}_{self.proc.pid}"
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if "listening on " in line:
            self.url, self.standby = line.split("listening on ")[1].split()[0], False
        elif "standby on " in line:
            self.url, self.standby = line.split("standby on ")[1].split()[0].rstrip(":"), True
            assert f"this instance is {self.identity}" in line, line
        else:
            raise AssertionError(f"{name}: {line!r} (exit {self.proc.poll()}): {self.log.read_text()[-3000:]}")

    def healthz(self) -> int:
        """The status of ``GET /healthz``: 200 leading, 503 standby, 0 not answering."""
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=2) as r:
                return int(r.status)
        except urllib.error.HTTPError as e:
            return int(e.code)
        except OSError:
            return 0

    def get(self, path: str, token: str | None = TOKEN) -> tuple[int, dict[str, Any]]:
        req = urllib.request.Request(self.url + path, headers={"Authorization": f"token {token}"} if token else {})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return int(r.status), json.loads(r.read())
        except urllib.error.HTTPError as e:
            return int(e.code), json.loads(e.read())

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def lease_holder(coord: client.CoordinationV1Api, namespace: str) -> str | None:
    try:
        return coord.read_namespaced_lease(LEASE, namespace).spec.holder_identity  # type: ignore[no-any-return]
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


def take_over(old: Scheduler, new: Scheduler, coord: client.CoordinationV1Api, namespace: str,
              timeout_s: float = 60.0) -> tuple[float, float]:
    """kill -9 ``old`` (the leader); seconds until ``new`` holds the Lease, and until it serves (``/healthz`` 200)."""
    t0 = time.monotonic()
    old.kill()
    leased = None
    while True:
        now = time.monotonic() - t0
        if leased is None and lease_holder(coord, namespace) == new.identity:
            leased = now
        if new.healthz() == 200:
            return (leased if leased is not None else now), now
        if new.proc.poll() is not None:
            raise AssertionError(f"the standby {new.name} exited ({new.proc.returncode}): "
                                 f"{new.log.read_text()[-3000:]}")
        if now > timeout_s:
            raise AssertionError(f"no takeover by {new.name} within {timeout_s:.0f} s: {new.log.read_text()[-3000:]}")
        time.sleep(0.02)


class PodLedger:
    """Every pod event in a namespace, from a watch: which pods were ever created, which deleted."""

    def __init__(self, api: client.CoreV1Api, namespace: str) -> None:
        self.api = api
        self.namespace = namespace
        self.added: collections.Counter[str] = collections.Counter()
        self.deleted: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PodLedger:
        self._version = self.api.list_namespaced_pod(self.namespace).metadata.resource_version
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.is_set():
            w = watch.Watch()
            for ev in w.stream(self.api.list_namespaced_pod, self.namespace, resource_version=self._version,
                               timeout_seconds=1, _request_timeout=5):
                pod = ev["object"]
                self._version = pod.metadata.resource_version
                if ev["type"] == "ADDED":
                    self.added[pod.metadata.name] += 1
                elif ev["type"] == "DELETED":
                    self.deleted.append(pod.metadata.name)
