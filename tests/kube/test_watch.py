"""The list+watch thread on the real API server: an expired watch (410) re-lists; a stop that lands after the end loses."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from gpupool.app.backend import build_core
from gpupool.backends.kubernetes.health import Health
from gpupool.backends.kubernetes.watcher import ListWatch
from gpupool.service.actor import Actor
from tests.kube.cluster import Kubelet, wait
from tests.kube.conftest import KUBE, kube_config
from tests.service.helpers import wait_for

ADMIN = Actor("admin", True)


@pytest.fixture(scope="module")
def compacting_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """An API server of its own that compacts etcd every second and has no watch cache: old watches expire."""
    if not (KUBE / "start").exists():
        pytest.skip(f"no Kubernetes test kit at {KUBE}")
    d = tmp_path_factory.mktemp("kube-compacting")
    env = {**os.environ, "GPUPOOL_KUBE_APISERVER_ARGS": "--etcd-compaction-interval=1s --watch-cache=false"}
    r = subprocess.run([str(KUBE / "start"), str(d)], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        pytest.fail(f"could not start the test API server:\n{r.stderr[-3000:]}", pytrace=False)
    try:
        yield client.CoreV1Api(config.new_client_from_config(config_file=str(d / "kubeconfig")))
    finally:
        subprocess.run([str(KUBE / "stop"), str(d)], capture_output=True)


def test_an_expired_watch_re_lists(compacting_api: Any) -> None:
    api, namespace = compacting_api, "default"
    api.create_namespaced_config_map(namespace, {"metadata": {"name": "c"}, "data": {"n": "0"}})
    stale = api.list_namespaced_config_map(namespace).metadata.resource_version
    for i in range(5):
        api.patch_namespaced_config_map("c", namespace, {"data": {"n": str(i)}})
    time.sleep(3.5)  # two compactions later, `stale` is gone from etcd: a watch from it gets 410
    lists: list[int] = []
    events: list[str] = []
    calls = {"n": 0}

    def list_fn(**kw: Any) -> Any:
        out = api.list_namespaced_config_map(**kw)
        if not kw.get("watch") and calls["n"] == 0:  # as if this list were from long ago
            listed = json.loads(out.read())
            out.release_conn()
            listed["metadata"]["resourceVersion"] = stale
            out = _Body(json.dumps(listed).encode())
        if not kw.get("watch"):
            calls["n"] += 1
        return out

    lw = ListWatch("configmaps", list_fn, lambda items: lists.append(len(items)),
                   lambda kind, obj: events.append(obj["data"]["n"]), Health(),
                   namespace=namespace, watch_timeout_s=5)
    lw.start()
    try:
        try:
            wait(lambda: lw.relists >= 1 and len(lists) >= 2, what="a re-list after 410")
        except AssertionError:
            raise AssertionError(f"no re-list: relists={lw.relists} lists={lists} calls={calls}") from None
        api.patch_namespaced_config_map("c", namespace, {"data": {"n": "after"}})
        wait(lambda: "after" in events, what="the watch going on after the re-list")
    finally:
        lw.stop()


class _Body:
    """A list reply whose body the test rewrote (read as the watcher reads a raw reply)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    def read(self) -> bytes:
        return self.data

    def release_conn(self) -> None:
        pass


def test_the_watch_hands_on_each_object_whole_as_json_and_stops_at_once(api: Any, namespace: str) -> None:
    """Events far larger than one read (100 KiB objects, back to back) arrive whole, one each, in order;
    stop() ends a watch in flight without waiting for its timeout."""
    seen: list[tuple[str, str, int]] = []
    listed: list[list[Any]] = []
    lw = ListWatch("configmaps", api.list_namespaced_config_map, listed.append,
                   lambda kind, obj: seen.append((kind, obj["metadata"]["name"], len(obj["data"]["blob"]))),
                   Health(), namespace=namespace, watch_timeout_s=300, label_selector="test=big")
    lw.start()
    try:
        assert lw.synced.wait(30) and listed == [[]]
        for i in range(12):
            api.create_namespaced_config_map(namespace, {"metadata": {"name": f"big-{i}", "labels": {"test": "big"}},
                                                         "data": {"blob": str(i % 10) * 100_000}})
        api.delete_namespaced_config_map("big-3", namespace)
        wait(lambda: len(seen) == 13, what="13 events")
        assert seen == [("ADDED", f"big-{i}", 100_000) for i in range(12)] + [("DELETED", "big-3", 100_000)]
    finally:
        lw.stop(wait_s=10)
    assert not lw._thread.is_alive(), "stop() left the watch thread running"


async def test_a_pause_that_lands_after_the_pod_ended_does_not_win(api: Any, namespace: str, gpu_nodes: Any,
                                                                   kubeconfig: Path, tmp_path: Path) -> None:
    gpu_nodes(1, gpus=8)
    core = build_core(kube_config(tmp_path / "state", kubeconfig, namespace, poll_s=5.0))  # a slow monitor
    await core.start()
    try:
        core.set_project(ADMIN, "vision", {"train_guarantee": 8})
        j, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 1, "command": ["python", "train.py"]})
        name = f"gpupool-{j['id']}-1"
        with Kubelet(api, namespace) as kubelet:
            await wait_for(lambda: name in kubelet.started, what="the pod running")
            kubelet.finish(name, 0)
            await wait_for(lambda: api.read_namespaced_pod(name, namespace).status.phase == "Succeeded",
                           what="the pod ended on its own")
            await core.pause(ADMIN, j["id"])  # before the monitor looked
            # The reply waits reply_wait_s for the job to settle; on a loaded machine the pod's end may reach
            # the scheduler later than that: what matters is what the job settles as.
            await wait_for(lambda: core.get_job(ADMIN, j["id"])["state"] != "running", what="the job settled")
            paused = core.get_job(ADMIN, j["id"])
            assert paused["state"] == "succeeded" and paused["exit_code"] == 0, paused
            assert name not in kubelet.stopped
    finally:
        await core.stop()
