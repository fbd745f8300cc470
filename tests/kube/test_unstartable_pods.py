"""A job whose pod cannot start (its image cannot be pulled) fails with the kubelet's reason and frees its GPUs,
instead of showing "running" while holding them for ever."""

from __future__ import annotations

from typing import Any

from gpupool.backends.kubernetes.pods import start_problem
from gpupool.service.actor import Actor
from tests.kube.cluster import Kubelet
from tests.service.helpers import wait_for

ADMIN = Actor("admin", True)
TYPO = "registry.example/trian:1"  # the user meant train
INVALID = "registry.example/Train:1"  # upper case: no valid reference


def settled(core: Any, job_id: str) -> Any:
    return (j := core.get_job(ADMIN, job_id))["state"] not in ("queued", "running") and j


def test_a_container_status_is_read_into_why_it_cannot_start() -> None:
    def pod(waiting: dict[str, str] | None, name: str = "job") -> dict[str, Any]:
        state = {"waiting": waiting} if waiting is not None else {"running": {}}
        return {"status": {"containerStatuses": [{"name": name, "state": state}]}}

    assert start_problem(pod({"reason": "ImagePullBackOff", "message": 'Back-off pulling image "x"'})) == (
        'ImagePullBackOff: Back-off pulling image "x"', False)
    assert start_problem(pod({"reason": "InvalidImageName"})) == ("InvalidImageName", True)
    assert start_problem(pod({"reason": "ContainerCreating"})) is None  # an ordinary wait
    assert start_problem(pod(None)) is None and start_problem({"status": {}}) is None
    assert start_problem(pod({"reason": "ErrImagePull"}, name="sidecar")) is None  # not the job's container


async def test_an_image_that_cannot_be_pulled_fails_the_job_and_frees_its_gpus(api: Any, namespace: str,
                                                                               gpu_nodes: Any, make_core: Any) -> None:
    gpu_nodes(1, gpus=8)
    core = await make_core(kube_start_timeout_s=2.0)
    await wait_for(lambda: core.pool()["nodes"], what="the node in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 8})
    with Kubelet(api, namespace, unpullable={TYPO: "ImagePullBackOff"}):
        bad, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 8, "image": TYPO, "command": ["train"]})
        good, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 8, "command": ["python", "train.py"]})
        await wait_for(lambda: core.get_job(ADMIN, bad["id"])["state"] == "running", what="the bad job's pod bound")
        assert core.get_job(ADMIN, good["id"])["state"] == "queued"  # all 8 GPUs are the bad job's
        failed = await wait_for(lambda: settled(core, bad["id"]), timeout=30, what="the bad job settled")
        assert failed["state"] == "failed", failed
        assert failed["reason"].startswith(f"its pod gpupool-{bad['id'].lower()}-1 could not start: "
                                           f'ImagePullBackOff: Back-off pulling image "{TYPO}" (still failing after ')
        assert failed["attempts"] == 1  # not requeued: the next try would meet the same image
        await wait_for(lambda: core.get_job(ADMIN, good["id"])["state"] == "running", what="its GPUs given on")
        await wait_for(lambda: f"gpupool-{bad['id'].lower()}-1" not in {
            p.metadata.name for p in api.list_namespaced_pod(namespace).items}, what="the stuck pod deleted")


async def test_an_invalid_image_name_fails_the_job_at_once_a_gang_whole(api: Any, namespace: str, gpu_nodes: Any,
                                                                        make_core: Any) -> None:
    gpu_nodes(2, gpus=8)
    core = await make_core()  # the default: 300 s for a pull that may come right; none for an invalid name
    await wait_for(lambda: len(core.pool()["nodes"]) == 2, what="both nodes in the pool")
    core.set_project(ADMIN, "vision", {"train_guarantee": 16})
    with Kubelet(api, namespace, unpullable={INVALID: "InvalidImageName"}):
        one, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 1, "image": INVALID, "command": ["train"]})
        failed = await wait_for(lambda: settled(core, one["id"]), timeout=30, what="the job settled")
        assert failed["state"] == "failed" and failed["reason"].endswith("could not start: InvalidImageName: Failed "
                                                                         f'to apply default image tag "{INVALID}": '
                                                                         "invalid reference format"), failed
        gang, _ = await core.submit(ADMIN, {"project": "vision", "gpus": 8, "replicas": 2, "image": INVALID,
                                            "command": ["torchrun", "train.py"]})
        failed = await wait_for(lambda: settled(core, gang["id"]), timeout=30, what="the gang settled")
        assert failed["state"] == "failed", failed
        assert failed["reason"].startswith("replica ") and "could not start: InvalidImageName" in failed["reason"]
        await wait_for(lambda: not [p for p in api.list_namespaced_pod(namespace).items
                                    if p.metadata.labels.get("gpupool.io/job") == gang["id"]],
                       what="every replica's pod deleted")
        assert not [a for n in core.pool()["nodes"] for g in n["gpus"] for a in g["allocations"]]
