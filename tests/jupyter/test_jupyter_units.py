"""Pure pieces of the extension: kernelspecs, promote requests, paths, labels."""

from __future__ import annotations

import json
from typing import Any

import pytest
from jupyter_client.kernelspec import KernelSpecManager

from gpupool.wire.errors import Forbidden, InvalidRequest, NotFound
from jupyter_gpupool.kernel_share import fraction_label, share_request
from jupyter_gpupool.kernelspecs import base_kernel, register_kernel_dir, write_kernelspecs
from jupyter_gpupool.paths import resolve_notebook
from jupyter_gpupool.promote import PromoteRequest, papermill_args, run_paths
from jupyter_gpupool.runner import main as runner_main


def test_kernelspecs_follow_the_configured_fractions(tmp_path: Any) -> None:
    ksm = KernelSpecManager()
    names = write_kernelspecs(tmp_path, [0.25, 0.75, 2], ksm)
    assert names == ["gpupool-python3-0.25", "gpupool-python3-0.75", "gpupool-python3-2"]
    spec = json.loads((tmp_path / "gpupool-python3-2" / "kernel.json").read_text())
    assert spec["display_name"] == "Python 3 (2 GPUs)"
    assert spec["metadata"]["kernel_provisioner"]["config"] == {"gpu_fraction": 2.0}
    assert spec["argv"] == ksm.get_kernel_spec("python3").argv
    # a fraction removed from the config leaves the launcher
    assert write_kernelspecs(tmp_path, [0.5], ksm) == ["gpupool-python3-0.5"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gpupool-python3-0.5"]
    register_kernel_dir(ksm, tmp_path)
    register_kernel_dir(ksm, tmp_path)
    assert ksm.kernel_dirs.count(str(tmp_path)) == 1
    assert ksm.get_kernel_spec("gpupool-python3-0.5").display_name == "Python 3 (½ GPU)"
    with pytest.raises(ValueError, match="whole number"):
        write_kernelspecs(tmp_path, [1.5], ksm)


def test_share_words_and_requests() -> None:
    assert [fraction_label(f) for f in (0.25, 0.5, 0.75, 1, 3, 0.3)] == ["¼ GPU", "½ GPU", "¾ GPU", "1 GPU",
                                                                          "3 GPUs", "0.3 GPU"]
    assert share_request(0.25) == {"gpu_fraction": 0.25} and share_request(1) == {"gpus": 1}
    with pytest.raises(ValueError):
        share_request(0)
    assert base_kernel("gpupool-python3-0.25") == "python3" and base_kernel("ir") == "ir"
    assert base_kernel("gpupool-x", {"gpupool": {"base": "python3"}}) == "python3"


def test_promote_request_normalises_amounts() -> None:
    assert PromoteRequest.from_body({"path": "a.ipynb"}).gpus == 1
    half = PromoteRequest.from_body({"path": "a.ipynb", "gpus": 0.5})
    assert (half.gpus, half.gpu_fraction) == (None, 0.5)
    whole = PromoteRequest.from_body({"path": "a.ipynb", "gpu_fraction": 1})
    assert (whole.gpus, whole.gpu_fraction) == (1, None)
    for bad in ({"path": "a.ipynb", "gpus": 1.5}, {"path": "a.ipynb", "gpu_fraction": 2},
                {"path": "a.ipynb", "gpus": True}, {"path": "a.ipynb", "extra": 1}, []):
        with pytest.raises(InvalidRequest):
            PromoteRequest.from_body(bad)
    args = papermill_args({"lr": 0.5, "tag": "42"}, "python3", "/w")
    assert args[:2] == ["input.ipynb", "output.ipynb"]
    assert json.loads(args[args.index("-y") + 1]) == {"lr": 0.5, "tag": "42"}
    assert run_paths({"id": "j-1", "labels": {}}) == {}
    assert run_paths({"id": "j-1", "labels": {"promoted": "1", "runs_dir": "a/b.runs"}}) == {
        "run_dir": "a/b.runs/j-1", "output_notebook": "a/b.runs/j-1/output.ipynb"}


def test_resolve_notebook_stays_in_root(tmp_path: Any) -> None:
    root = tmp_path / "root"
    (root / "d").mkdir(parents=True)
    (root / "d" / "n.ipynb").write_text("{}")
    assert resolve_notebook(str(root), "d/n.ipynb") == str((root / "d" / "n.ipynb").resolve())
    assert resolve_notebook(str(root), str(root / "d" / "n.ipynb")).endswith("n.ipynb")
    with pytest.raises(Forbidden):
        resolve_notebook(str(root), "../x.ipynb")
    with pytest.raises(Forbidden):
        resolve_notebook(str(root), "/etc/passwd")
    with pytest.raises(NotFound):
        resolve_notebook(str(root), "d/missing.ipynb")
    with pytest.raises(InvalidRequest):
        resolve_notebook(str(root), "")


def test_runner_refuses_to_run_outside_a_job(monkeypatch: Any, capsys: Any) -> None:
    monkeypatch.delenv("GPUPOOL_JOB_ID", raising=False)
    assert runner_main(["--staging", "x.ipynb", "--", "input.ipynb", "output.ipynb"]) == 2
    assert "GPUPOOL_JOB_ID" in capsys.readouterr().err


async def test_embedded_connection_keeps_one_user_token(tmp_path: Any) -> None:
    from jupyter_gpupool.connection import PoolConnection, PoolSettings

    settings = PoolSettings(state_dir=str(tmp_path / "state"), simulate="1xA100-80GB")
    tokens = []
    for _ in range(2):
        conn = PoolConnection(settings)
        client = await conn.client()
        assert (await client.whoami())["user"] == conn.user and conn.admin
        tokens.append(conn.token)
        await conn.close()
    assert tokens[0] == tokens[1]
    assert (tmp_path / "state" / "jupyter_user_token").stat().st_mode & 0o777 == 0o600
    with pytest.raises(Exception, match="stopped"):
        await conn.client()


async def test_configured_projects_are_created_with_their_quotas(tmp_path: Any) -> None:
    """c.GPUPool.projects seeds the embedded scheduler with the admin's projects beside the user's."""
    from jupyter_gpupool.app import GPUPool

    app = GPUPool()
    app.state_dir = str(tmp_path / "state")
    app.simulate = "4xA100-80GB"
    app.project = "vision"
    app.projects = {"vision": {"build_quota": 1.5, "train_guarantee": 2}, "nlp": {"build_quota": 1, "train_guarantee": 2}}
    from jupyter_gpupool.connection import PoolConnection

    conn = PoolConnection(app.pool_settings())
    try:
        client = await conn.client()
        projects = {p["name"]: p for p in await client.projects()}
        assert set(projects) == {"vision", "nlp"}
        assert projects["vision"]["build_quota"] == 1.5 and projects["vision"]["train_guarantee"] == 2
        assert projects["nlp"]["build_quota"] == 1
    finally:
        await conn.close()


async def test_default_training_guarantee_is_every_simulated_gpu(tmp_path: Any) -> None:
    """No train_guarantee: the user's project is guaranteed the whole simulated pool, counted as the scheduler does."""
    from jupyter_gpupool.connection import PoolConnection, PoolSettings

    conn = PoolConnection(PoolSettings(state_dir=str(tmp_path / "state"), simulate="2*A100-80GB, T4"))
    try:
        client = await conn.client()
        gpus = sum(len(node["gpus"]) for node in (await client.pool())["nodes"])
        mine = next(p for p in await client.projects() if p["name"] == conn.project)
        assert gpus == 3 and mine["train_guarantee"] == 3
    finally:
        await conn.close()


def test_renewal_follows_the_granted_lease() -> None:
    import time as _time

    from jupyter_gpupool import leases

    assert leases.lease_length({"lease_expires_at": None}) is None
    assert 9 < leases.lease_length({"lease_expires_at": _time.time() + 10}) <= 10
    leases.hold(leases.Share("k1", "j-1", lease_s=30.0))
    leases.hold(leases.Share("k2", "j-2", lease_s=12.0))
    try:
        assert leases.shortest_lease() == 12.0
    finally:
        leases.release("k1")
        leases.release("k2")
    assert leases.shortest_lease() is None


def test_install_enables_a_valid_server_extension() -> None:
    """What `jupyter server extension list` checks, on the config file the wheel installs."""
    from pathlib import Path

    from jupyter_server.extension.manager import ExtensionPackage

    config = Path(__file__).resolve().parents[2] / "jupyter-config" / "jupyter_server_config.d" / "jupyter_gpupool.json"
    assert json.loads(config.read_text()) == {"ServerApp": {"jpserver_extensions": {"jupyter_gpupool": True}}}
    package = ExtensionPackage(name="jupyter_gpupool", enabled=True)
    assert package.validate() and list(package.extension_points) == ["jupyter_gpupool"]
    assert package.extension_points["jupyter_gpupool"].app.name == "jupyter_gpupool"


async def test_provisioner_falls_back_to_the_environment(tmp_path: Any, monkeypatch: Any) -> None:
    """Outside the extension (e.g. jupyter_client alone) the provisioner uses GPUPOOL_URL / GPUPOOL_TOKEN."""
    from gpupool.app.embedded import EmbeddedScheduler
    from gpupool.client import AsyncGpupoolClient
    from jupyter_gpupool import connection as connection_mod
    from jupyter_gpupool.provisioner import GPUPoolProvisioner, GpuShareUnavailable

    connection_mod.set_current(None)
    monkeypatch.delenv("GPUPOOL_URL", raising=False)
    with pytest.raises(GpuShareUnavailable, match="GPUPOOL_URL"):
        GPUPoolProvisioner(kernel_id="k")._connection()
    sched = EmbeddedScheduler(tmp_path / "s", simulate="1xA100-80GB", projects={"team": {"build_quota": 1}})
    await sched.start()
    try:
        token = (await AsyncGpupoolClient(sched.url, sched.admin_token).create_token("dora"))["token"]
        monkeypatch.setenv("GPUPOOL_URL", sched.url)
        monkeypatch.setenv("GPUPOOL_TOKEN", token)
        conn = GPUPoolProvisioner(kernel_id="k")._connection()
        assert not conn.is_embedded and conn.url == sched.url
        assert (await (await conn.client()).whoami())["user"] == "dora" and conn.user == "dora"
    finally:
        await sched.stop()


def test_gpu_free_default_respects_a_chosen_default() -> None:
    from jupyter_client.provisioning import KernelProvisionerFactory

    from jupyter_gpupool.provisioner import GPU_FREE_PROVISIONER, make_plain_kernels_gpu_free

    factory = KernelProvisionerFactory()
    factory.default_provisioner_name = "local-provisioner"
    assert make_plain_kernels_gpu_free(factory) == "local-provisioner"
    assert factory.default_provisioner_name == GPU_FREE_PROVISIONER
    assert factory._check_availability(GPU_FREE_PROVISIONER)
    factory.default_provisioner_name = "site-provisioner"
    assert make_plain_kernels_gpu_free(factory) == "site-provisioner"
    assert factory.default_provisioner_name == "site-provisioner"


def test_magic_promote_refused_by_the_scheduler_leaves_nothing_behind(tmp_path: Any, monkeypatch: Any) -> None:
    import nbformat

    from jupyter_gpupool.magics import promote_notebook

    class Refusing:
        def submit(self, spec: dict[str, Any]) -> Any:
            raise InvalidRequest("no such project")

    nbformat.write(nbformat.v4.new_notebook(), str(tmp_path / "exp.ipynb"))
    monkeypatch.setenv("GPUPOOL_SERVER_ROOT", str(tmp_path))
    with pytest.raises(InvalidRequest):
        promote_notebook(Refusing(), str(tmp_path / "exp.ipynb"), PromoteRequest(path="exp.ipynb"))
    assert list((tmp_path / "exp.runs").iterdir()) == []
