"""A GPU process's pod, read from its cgroup: every form a kubelet writes (systemd and cgroupfs drivers,
cgroup v1 and v2, the three QoS classes), and processes that are in no pod."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpupool.inventory.cgroups import pod_uid_of_cgroup, pod_uid_of_pid

UID = "6b1c2f3e-4d5a-4b6c-8d7e-9f0a1b2c3d4e"
SYSTEMD = UID.replace("-", "_")
CID = "0f3a9c1e" * 8

V1_SYSTEMD_BURSTABLE = "\n".join([
    f"12:memory:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD}.slice/"
    f"cri-containerd-{CID}.scope",
    f"11:devices:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD}.slice/"
    f"cri-containerd-{CID}.scope",
    "1:name=systemd:/kubepods.slice/kubepods-burstable.slice/"
    f"kubepods-burstable-pod{SYSTEMD}.slice/cri-containerd-{CID}.scope",
    "0::/",
])


@pytest.mark.parametrize("text", [
    # cgroup v2, systemd driver, each QoS class (guaranteed pods sit right under kubepods.slice)
    f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{SYSTEMD}.slice/cri-containerd-{CID}.scope",
    f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{SYSTEMD}.slice/crio-{CID}.scope",
    f"0::/kubepods.slice/kubepods-pod{SYSTEMD}.slice/cri-containerd-{CID}.scope",
    # cgroup v2, cgroupfs driver
    f"0::/kubepods/burstable/pod{UID}/{CID}",
    f"0::/kubepods/besteffort/pod{UID}/{CID}",
    f"0::/kubepods/pod{UID}/{CID}",
    # cgroup v1, both drivers (every controller line names the pod)
    V1_SYSTEMD_BURSTABLE,
    f"12:pids:/kubepods/besteffort/pod{UID}/{CID}\n11:memory:/kubepods/besteffort/pod{UID}/{CID}\n",
    f"4:cpu,cpuacct:/kubepods/pod{UID}/{CID}",
    # a container's cgroup namespace shows the path relative to its own root
    f"0::/../../kubepods-besteffort-pod{SYSTEMD}.slice/cri-containerd-{CID}.scope",
    # a kubelet with --cgroup-root (kind, some distributions)
    f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/"
    f"kubelet-kubepods-burstable-pod{SYSTEMD}.slice/cri-containerd-{CID}.scope",
    # the pod's own cgroup (a process of the pause container's level), upper-case hex
    f"0::/kubepods/burstable/pod{UID.upper()}",
])
def test_the_pod_uid_is_read_from_every_kubelet_form(text: str) -> None:
    assert pod_uid_of_cgroup(text) == UID


def test_a_static_pod_uid_is_32_hex_digits() -> None:
    static = "3f1e2d4c5b6a79880a1b2c3d4e5f6071"
    assert pod_uid_of_cgroup(f"0::/kubepods/burstable/pod{static}/{CID}") == static


@pytest.mark.parametrize("text", [
    "0::/user.slice/user-1000.slice/session-3.scope",          # a login session
    "0::/system.slice/containerd.service",                       # the runtime itself
    f"0::/system.slice/docker-{CID}.scope",                      # a container outside Kubernetes
    f"0::/user.slice/pod{UID}.slice",                            # named like a pod, outside kubepods
    "0::/kubepods.slice/kubepods-burstable.slice",               # a QoS slice: no pod in it
    "0::/kubepods/burstable/podnot-a-uid/x",
    "",
    "garbage without colons",
])
def test_processes_in_no_pod_have_none(text: str) -> None:
    assert pod_uid_of_cgroup(text) is None


def test_the_proc_root_is_where_processes_are_read(tmp_path: Path) -> None:
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(f"0::/kubepods/pod{UID}/{CID}\n")
    assert pod_uid_of_pid(4242, str(tmp_path)) == UID
    assert pod_uid_of_pid(4243, str(tmp_path)) is None  # gone (or never there): no pod, no error
