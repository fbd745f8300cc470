"""A real Kubernetes control plane for the Kubernetes backend's tests, one per session.

``scripts/kube/start`` runs etcd, kube-apiserver and kube-controller-manager
(v1.37, built once by ``scripts/kube/setup`` and cached): controllers act, so
namespaces really delete, owners' pods are garbage-collected and a node
without a heartbeat is tainted (tests/kube/cluster.py beats for the nodes the
tests make). ``GPUPOOL_KUBE_DIR`` points at another kit with the same
``start DIR`` / ``stop DIR`` commands (e.g. an older API server). When the
cluster cannot be built or started the tests fail, loudly: CI runs the setup
first (scripts/test).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kube import scheduler_account as account

KUBE = Path(os.environ.get("GPUPOOL_KUBE_DIR", Path(__file__).resolve().parents[2] / "scripts" / "kube"))


@pytest.fixture(scope="session")
def kubeconfig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The kubeconfig of a fresh API server for this session (admin context)."""
    if not (KUBE / "start").exists():
        pytest.skip(f"no Kubernetes test kit at {KUBE} (the real API server these tests need); "
                    "set GPUPOOL_KUBE_DIR to its directory")
    d = tmp_path_factory.mktemp("kube")
    # The owner pid: a session killed before this teardown still leaves nothing running.
    r = subprocess.run([str(KUBE / "start"), str(d)], capture_output=True, text=True,
                       env={**os.environ, "GPUPOOL_KUBE_OWNER_PID": str(os.getpid())})
    if r.returncode != 0:
        pytest.fail(f"could not start the test API server ({KUBE}/start):\n{r.stderr[-3000:]}", pytrace=False)
    try:
        yield d / "kubeconfig"
    finally:
        subprocess.run([str(KUBE / "stop"), str(d)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def start_components(kubeconfig: Path, *names: str) -> None:
    """Start more of the session's cluster on demand: ``kube-scheduler``, ``kwok`` or ``jobset``.

    Each runs until the session ends (``stop`` ends them with the rest). KWOK
    plays only the nodes annotated ``kwok.x-k8s.io/node: fake``; kube-scheduler
    binds every pod of ``schedulerName: default-scheduler`` (the default), so
    start it only where no other test in the session leaves such pods unbound.
    """
    r = subprocess.run([str(KUBE / "start"), str(kubeconfig.parent), *names], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.fail(f"could not start {' '.join(names)} ({KUBE}/start):\n{r.stderr[-3000:]}", pytrace=False)


@pytest.fixture(scope="session")
def api(kubeconfig: Path) -> Any:
    from kubernetes import client, config

    return client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))


@pytest.fixture
def namespace(api: Any) -> str:
    """A fresh namespace per test."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    api.create_namespace({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    return name


@pytest.fixture
def gpu_nodes(api: Any, namespace: str) -> Iterator[Callable[..., list[str]]]:
    """Factory: ``gpu_nodes(3, gpus=8, **node_options)`` -> their names; all deleted after the test."""
    from tests.kube.cluster import make_gpu_node

    made: list[str] = []

    def make(count: int, gpus: int = 8, **options: Any) -> list[str]:
        names = [f"{namespace}-n{len(made) + i}" for i in range(count)]
        for n in names:
            make_gpu_node(api, n, gpus, **options)
            made.append(n)
        return names

    yield make
    for n in made:
        try:
            api.delete_node(n)
        except Exception:
            pass


def kube_config(state_dir: Path, kubeconfig: Path, namespace: str, **overrides: Any) -> Any:
    """A fast ServiceConfig for the Kubernetes backend."""
    from gpupool.service.config import ServiceConfig

    base: dict[str, Any] = dict(
        state_dir=state_dir, backend="kubernetes", kubeconfig=str(kubeconfig), namespace=namespace,
        image="busybox:1.36", tick_s=0.2, poll_s=0.05, pause_grace_s=2.0, reply_wait_s=3.0,
        history_interval_s=0.5, min_runtime_s=0.0, resume_backoff_s=0.0, admin_token="admin-secret",
        cycle_min_interval_s=0.0, run_jobs_as="service", on_shutdown="leave",
    )
    base.update(overrides)
    return ServiceConfig(**base)


@pytest.fixture
async def make_core(tmp_path: Path, kubeconfig: Path, namespace: str) -> AsyncIterator[Callable[..., Any]]:
    """``await make_core(**overrides)``: a started core on the test's namespace; stopped at the end."""
    from tests.service.helpers import cores_made

    async for make in cores_made(lambda **overrides: kube_config(tmp_path / "state", kubeconfig, namespace,
                                                                 **overrides)):
        yield make


CoreOnNodes = Callable[..., Awaitable[tuple[Any, list[str]]]]


@pytest.fixture
def core_on_nodes(gpu_nodes: Callable[..., list[str]], make_core: Callable[..., Any]) -> CoreOnNodes:
    """``core, nodes = await core_on_nodes(nodes=1, gpus=8, projects={name: quotas}, **overrides)``.

    What most tests here start from: ``nodes`` GPU nodes made, a core started
    (``make_core(**overrides)``), every node in its pool (the watch has seen
    them: a job submitted earlier would wait for a cycle), then the projects set
    as an admin sets them.
    """
    from gpupool.service.actor import Actor
    from tests.service.helpers import wait_for

    async def start(nodes: int = 1, gpus: int = 8, projects: dict[str, dict[str, Any]] | None = None,
                    **overrides: Any) -> tuple[Any, list[str]]:
        names = gpu_nodes(nodes, gpus=gpus)
        core = await make_core(**overrides)
        await wait_for(lambda: len(core.pool()["nodes"]) == nodes, what=f"{nodes} node(s) in the pool")
        for name, quotas in (projects or {}).items():
            core.set_project(Actor("admin", True), name, quotas)
        return core, names

    return start


@pytest.fixture
def scheduler_account(api: Any, kubeconfig: Path, tmp_path: Path) -> Iterator[account.SchedulerAccount]:
    """deploy/kubernetes/rbac.yaml's ServiceAccount, its rights in effect, in namespace ``gpupool`` emptied first;
    after the test, the namespace emptied again and rbac.yaml's objects deleted (tests/kube/scheduler_account.py)."""
    with account.scheduler_account(api, kubeconfig, tmp_path) as sa:
        yield sa


@pytest.fixture
async def make_account_core(tmp_path: Path, scheduler_account: account.SchedulerAccount
                            ) -> AsyncIterator[Callable[..., Any]]:
    """``await make_account_core(**overrides)``: a started core in namespace ``gpupool`` that reaches the API
    server as the scheduler's ServiceAccount (only rbac.yaml's rights); stopped before the namespace is emptied."""
    from tests.service.helpers import cores_made

    async for make in cores_made(lambda **overrides: kube_config(
            tmp_path / "state", scheduler_account.kubeconfig, account.NAMESPACE, **overrides)):
        yield make
