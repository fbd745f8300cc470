"""A stand-in kubelet that really runs pods: each bound pod's container command is a local process.

The API server in these tests is real; no kubelet is. For kernel pods a test
needs the kernel itself to run and listen, so this kubelet plays the part a
container runtime would, on this machine:

* the pod gets an address of its own on loopback (``127.77.x.y``: every
  127.0.0.0/8 address reaches this host), written as ``status.podIP``;
* the container's environment is built as a kubelet builds it: ``value``,
  ``fieldRef`` (``status.podIP``, ``metadata.name``, ``metadata.namespace``,
  ``metadata.annotations['KEY']`` and ``metadata.labels['KEY']``: "" when
  absent, read from the pod as bound) and ``secretKeyRef`` (the Secret read from the API server; until it exists
  the container waits with ``CreateContainerConfigError``), then ``$(VAR)`` in
  the command expanded from it;
* a Secret volume is written into a private folder of the pod (0700, each
  file with the volume's ``defaultMode``), and since a process cannot have the
  container's mount namespace, the mount path in the command is replaced by
  that folder;
* ``restartPolicy: Always``: a container that exits is shown ended (not
  ready) and started again (``restartCount`` + 1, the end in ``lastState``):
  at once the first time, then, while it keeps exiting within 10 s, after a
  doubling back-off shown as a kubelet shows it (waiting, reason
  ``CrashLoopBackOff``; shorter than a kubelet's); otherwise its exit is
  reported as the container's end and the pod's phase. Under
  ``terminationMessagePolicy: FallbackToLogsOnError`` a failed end's message
  is the log's tail, as a kubelet writes it;
* a deleted pod's process group gets SIGTERM, SIGKILL after the grace period
  (at most ``max_grace_s``), then the pod is removed.

Only pods matching ``label_selector`` (by default kernel pods) are run.
"""

from __future__ import annotations

import base64
import datetime as dt
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

KERNEL_PODS = "gpupool.io/component=kernel"
_VAR = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def now_text() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' ``$(VAR)`` expansion of a command argument: defined variables replaced, ``$$`` is ``$``,
    anything else left as written."""
    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _VAR.sub(one, text)


@dataclass
class RunningPod:
    """One pod this kubelet runs: its address, folder, process and what it reported."""

    name: str
    uid: str
    ip: str
    folder: Path
    process: subprocess.Popen[bytes] | None = None
    restarts: int = 0
    started_at: str = ""
    started_mono: float = 0.0
    crashes: int = 0  # quick exits in a row
    backoff_until: float = 0.0
    last_end: dict[str, Any] | None = None  # its container's last end (lastState), between exit and restart
    log_from: int = 0  # where this run's output starts in the log (a termination message is this run's)
    ended: bool = False
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.folder / "container.log"


class ProcessKubelet:
    """Runs the bound pods of one namespace (matching ``label_selector``) as local processes, in a thread."""

    def __init__(self, api: client.CoreV1Api, namespace: str, label_selector: str = KERNEL_PODS,
                 max_grace_s: float = 5.0, path: str | None = None) -> None:
        """``path``: the containers' PATH, as their image would set it (default: this Python's folder first,
        so ``python`` in a kernelspec is the test's own, with ipykernel)."""
        self.path = path or os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "/usr/bin")])
        self.api = api
        self.ns = namespace
        self.selector = label_selector
        self.max_grace_s = max_grace_s
        self.root = Path(tempfile.mkdtemp(prefix="process-kubelet-"))
        self.root.chmod(0o700)
        self.pods: dict[str, RunningPod] = {}  # by pod name (a recreated pod of the same name: new uid)
        self.started: list[str] = []  # pods whose container it started the first time, in order
        self.deleted: list[str] = []  # pods it stopped and removed because they were deleted
        self._next_ip = 0
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="process-kubelet")
        self._lock = threading.Lock()

    def __enter__(self) -> ProcessKubelet:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if exc and exc[0] is not None:  # what the pods printed: the test's failure report shows it
            for name in self.pods:
                print(f"--- pod {name} (process kubelet) ---\n{self.output(name)[-4000:]}")
        self._halt.set()
        self._thread.join(10)
        for p in list(self.pods.values()):
            self._kill(p, 0)
        shutil.rmtree(self.root, ignore_errors=True)

    def output(self, pod: str) -> str:
        """What the pod's container printed so far (all its runs)."""
        p = self.pods.get(pod)
        return p.log.read_text(errors="replace") if p is not None and p.log.exists() else ""

    def pid(self, pod: str) -> int | None:
        p = self.pods.get(pod)
        return p.process.pid if p is not None and p.process is not None and p.process.poll() is None else None

    # ------------------------------------------------------------ the loop
    def _run(self) -> None:
        while not self._halt.is_set():
            try:
                for pod in self.api.list_namespaced_pod(self.ns, label_selector=self.selector).items:
                    self._step(pod)
            except ApiException:
                pass
            self._halt.wait(0.05)

    def _step(self, pod: Any) -> None:
        name = pod.metadata.name
        if not pod.spec.node_name:
            return  # not bound: nothing runs it
        mine = self.pods.get(name)
        if mine is not None and mine.uid != pod.metadata.uid:
            self._kill(mine, 0)  # an earlier pod of the same name
            mine = None
        if pod.metadata.deletion_timestamp is not None:
            if mine is not None and not mine.ended:
                grace = min(float(pod.metadata.deletion_grace_period_seconds or 0), self.max_grace_s)
                self._kill(mine, grace)
                mine.ended = True
                self.deleted.append(name)
            try:
                self.api.delete_namespaced_pod(name, self.ns, grace_period_seconds=0)
            except ApiException as e:
                if e.status != 404:
                    raise
            return
        if mine is None:
            mine = self._admit(pod)
        if mine.ended:
            return
        if mine.process is None:
            self._start(pod, mine)
            return
        code = mine.process.poll()
        if code is None:
            return
        if pod.spec.restart_policy == "Always":
            if mine.backoff_until == 0.0:  # as a kubelet backs off a crashing container (CrashLoopBackOff)
                quick = time.monotonic() - mine.started_mono < 10
                mine.crashes = mine.crashes + 1 if quick else 0
                wait_s = min(0.2 * 2 ** (mine.crashes - 1), 5.0) if mine.crashes > 1 else 0.0
                mine.backoff_until = time.monotonic() + wait_s
                mine.last_end = self._end(pod, mine, code)
                if wait_s:  # a kubelet waits before the restart, saying why, the end in lastState
                    self._report(pod, mine, {"waiting": {
                        "reason": "CrashLoopBackOff",
                        "message": f"back-off {wait_s:g}s restarting failed container={pod.spec.containers[0].name} "
                                   f"pod={pod.metadata.name}"}}, phase="Running", ready=False, last=mine.last_end)
                else:  # the end is seen at once, the restart follows
                    self._report(pod, mine, mine.last_end, phase="Running", ready=False)
            if time.monotonic() < mine.backoff_until:
                return
            mine.backoff_until = 0.0
            mine.restarts += 1
            self._start(pod, mine, mine.last_end)
        else:
            mine.ended = True
            self._report(pod, mine, self._end(pod, mine, code), phase="Succeeded" if code == 0 else "Failed",
                         ready=False)

    @staticmethod
    def _end(pod: Any, p: RunningPod, code: int) -> dict[str, Any]:
        """The container's ``terminated`` state; with ``terminationMessagePolicy: FallbackToLogsOnError`` and a
        failure, its message is the log's tail (a kubelet's last 80 lines, at most 2,048 bytes)."""
        end: dict[str, Any] = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                               "startedAt": p.started_at, "finishedAt": now_text()}
        if code != 0 and pod.spec.containers[0].termination_message_policy == "FallbackToLogsOnError":
            tail = p.log.read_bytes()[p.log_from:][-2048:] if p.log.exists() else b""
            lines = tail.decode(errors="replace").splitlines()[-80:]
            if lines:
                end["message"] = "\n".join(lines)
        return {"terminated": end}

    def _admit(self, pod: Any) -> RunningPod:
        n = self._next_ip
        self._next_ip += 1
        folder = self.root / pod.metadata.name / pod.metadata.uid
        for private in (folder.parent, folder, folder / "home", folder / "volumes"):
            private.mkdir(mode=0o700, exist_ok=True)
        p = RunningPod(pod.metadata.name, pod.metadata.uid, f"127.77.{n // 250}.{n % 250 + 1}", folder)
        self.pods[p.name] = p
        return p

    # ------------------------------------------------------------ a container's start
    def _secret(self, name: str) -> dict[str, str] | None:
        try:
            s = self.api.read_namespaced_secret(name, self.ns)
        except ApiException as e:
            if e.status == 404:
                return None
            raise
        return {k: base64.b64decode(v).decode() for k, v in (s.data or {}).items()}

    def _env(self, pod: Any, p: RunningPod) -> tuple[dict[str, str] | None, str]:
        """The container's variables, or (None, why) while a Secret it reads is missing."""
        env: dict[str, str] = {}
        fields = {"status.podIP": p.ip, "metadata.name": p.name, "metadata.namespace": self.ns}
        for what, values in (("annotations", pod.metadata.annotations), ("labels", pod.metadata.labels)):
            fields.update({f"metadata.{what}['{k}']": v for k, v in (values or {}).items()})
        for e in pod.spec.containers[0].env or []:
            if e.value_from is None:
                env[e.name] = expand(e.value or "", env)
            elif e.value_from.field_ref is not None:
                env[e.name] = fields.get(e.value_from.field_ref.field_path, "")
            elif e.value_from.secret_key_ref is not None:
                ref = e.value_from.secret_key_ref
                data = self._secret(ref.name)
                if data is None or ref.key not in data:
                    return None, f'secret "{ref.name}" not found'
                env[e.name] = data[ref.key]
        return env, ""

    def _mounts(self, pod: Any, p: RunningPod) -> tuple[dict[str, str] | None, str]:
        """Mount path -> the pod's folder holding that Secret volume's files (None, why: a Secret missing)."""
        volumes = {v.name: v for v in pod.spec.volumes or []}
        out: dict[str, str] = {}
        for m in pod.spec.containers[0].volume_mounts or []:
            v = volumes.get(m.name)
            if v is None or v.secret is None:
                continue
            data = self._secret(v.secret.secret_name)
            if data is None:
                return None, f'secret "{v.secret.secret_name}" not found'
            target = p.folder / "volumes" / m.name
            if not target.exists():
                target.mkdir(mode=0o700)
                items = v.secret.items or [client.V1KeyToPath(key=k, path=k) for k in data]
                for item in items:
                    f = target / item.path
                    f.write_text(data[item.key])
                    f.chmod(item.mode if item.mode is not None else (v.secret.default_mode or 0o644))
            out[m.mount_path.rstrip("/")] = str(target)
        return out, ""

    def _start(self, pod: Any, p: RunningPod, last: dict[str, Any] | None = None) -> None:
        env, why = self._env(pod, p)
        mounts, why2 = self._mounts(pod, p)
        if env is None or mounts is None:
            self._report(pod, p, {"waiting": {"reason": "CreateContainerConfigError", "message": why or why2}},
                         phase="Pending", ready=False)
            return
        c = pod.spec.containers[0]
        argv = [expand(a, env) for a in [*(c.command or []), *(c.args or [])]]
        for path, local in mounts.items():
            argv = [a.replace(path + "/", local + "/") for a in argv]
        workdir = c.working_dir if c.working_dir and os.path.isdir(c.working_dir) else str(p.folder / "home")
        proc_env = {"PATH": self.path, "HOME": str(p.folder / "home"),
                    "LANG": "C.UTF-8", **env}
        with p.log.open("ab") as out:
            p.log_from = out.tell()
            p.process = subprocess.Popen(argv, cwd=workdir, env=proc_env, stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, start_new_session=True)
        p.started_at, p.started_mono = now_text(), time.monotonic()
        if p.restarts == 0 and p.name not in self.started:
            self.started.append(p.name)
        self._report(pod, p, {"running": {"startedAt": p.started_at}}, phase="Running", ready=True, last=last)

    def _report(self, pod: Any, p: RunningPod, state: dict[str, Any], phase: str, ready: bool,
                last: dict[str, Any] | None = None) -> None:
        cs: dict[str, Any] = {"name": pod.spec.containers[0].name, "ready": ready, "restartCount": p.restarts,
                              "image": pod.spec.containers[0].image, "imageID": "", "state": state}
        if last is not None:
            cs["lastState"] = last
        status: dict[str, Any] = {"phase": phase, "podIP": p.ip, "podIPs": [{"ip": p.ip}],
                                  "containerStatuses": [cs]}
        if pod.status is None or pod.status.start_time is None:
            status["startTime"] = now_text()
        try:
            self.api.patch_namespaced_pod_status(p.name, self.ns, {"status": status})
        except ApiException as e:
            if e.status != 404:
                raise

    # ------------------------------------------------------------ a container's end
    @staticmethod
    def _kill(p: RunningPod, grace_s: float) -> None:
        proc = p.process
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM if grace_s > 0 else signal.SIGKILL)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace_s
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        proc.wait(5)
