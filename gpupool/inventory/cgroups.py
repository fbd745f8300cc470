"""Which Kubernetes pod a process belongs to, read from its cgroup (``/proc/<pid>/cgroup``).

The kubelet puts every container of a pod under one cgroup named after the
pod's UID, inside the ``kubepods`` hierarchy; NVML and the simulation hook
give the node agent pids, and this turns a pid into the pod UID the
scheduler knows. The forms it reads (each kubelet cgroup driver, cgroup v1
and v2, every QoS class)::

    0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod6b1c_..._9e.slice/cri-containerd-<id>.scope
    0::/kubepods.slice/kubepods-pod6b1c..._9e.slice/crio-<id>.scope                    (guaranteed, systemd)
    12:memory:/kubepods/besteffort/pod6b1c...-9e/<container id>                       (cgroupfs, v1)
    0::/../../kubepods-besteffort-pod6b1c..._9e.slice/cri-containerd-<id>.scope       (seen from a cgroup namespace)

The systemd driver writes the UID with ``_`` for ``-`` (a ``-`` nests a
slice); cgroupfs keeps the dashes. A static pod's UID is 32 hex digits
without dashes. Anything else (a host process, a Docker container outside
Kubernetes) has no pod: ``None``. Pure text parsing, so every form is tested
without a cluster; the proc root is a parameter for the same reason.
"""

from __future__ import annotations

import os
import re

_UUID = r"[0-9a-fA-F]{8}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{4}[-_][0-9a-fA-F]{12}"
_POD_SEGMENT = re.compile(rf"^(?:.*-)?pod({_UUID}|[0-9a-fA-F]{{32}})(?:\.slice)?$")


def pod_uid_of_cgroup(text: str) -> str | None:
    """The pod UID in a ``/proc/<pid>/cgroup`` text (lowercase, with dashes), or None when it is in no pod.

    Each line is ``hierarchy:controllers:path``; the path must pass through a
    ``kubepods`` cgroup (so a cgroup that happens to be named ``pod...``
    elsewhere is not taken for one), and the segment naming the pod is the
    one after it. All lines of one process name the same pod; the first that
    names one answers.
    """
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        segments = [s for s in parts[2].split("/") if s]
        if not any("kubepods" in s for s in segments):
            continue
        for seg in segments:
            m = _POD_SEGMENT.match(seg)
            if m is not None:
                return m.group(1).replace("_", "-").lower()
    return None


def pod_uid_of_pid(pid: int, proc_root: str = "/proc") -> str | None:
    """The UID of the pod running process ``pid`` (None: not in a pod, or the process is gone).

    ``proc_root``: where the host's processes are seen: ``/proc`` in a pod
    with ``hostPID: true``, or the host's ``/proc`` mounted elsewhere (and a
    folder of made-up ``<pid>/cgroup`` files in tests).
    """
    try:
        with open(os.path.join(proc_root, str(int(pid)), "cgroup")) as f:
            return pod_uid_of_cgroup(f.read(65536))
    except (OSError, ValueError):
        return None
