"""binder/postBuild: the demo configuration it writes works in a real Jupyter server.

Runs postBuild as Binder would, but with HOME in a temporary directory and
PYTHON set to this interpreter (where the project is already installed, so the
install step is skipped and the test stays fast). Then checks what a Binder
user would get: a Jupyter server started with that HOME runs the embedded
scheduler on simulated GPUs with the two demo projects and their quotas.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from traitlets.config.loader import PyFileConfigLoader

ROOT = Path(__file__).resolve().parents[1]
POSTBUILD = ROOT / "binder" / "postBuild"


def _env(home: Path) -> dict[str, str]:
    """Binder's view: a fresh HOME, no Jupyter or gpupool overrides, this interpreter."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JUPYTER_", "GPUPOOL_", "XDG_"))}
    env.update(
        HOME=str(home),
        PYTHON=sys.executable,
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    )
    return env


def _run_postbuild(home: Path) -> dict:
    proc = subprocess.run(
        ["bash", str(POSTBUILD)], cwd=ROOT, env=_env(home), capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, f"postBuild failed:\n{proc.stdout}\n{proc.stderr}"
    return json.loads(proc.stdout[proc.stdout.index("{") :])


@pytest.fixture(scope="module")
def binder_home(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    home = tmp_path_factory.mktemp("binder-home")
    return home, _run_postbuild(home)


def test_postbuild_seeds_two_projects_with_quotas(binder_home: tuple[Path, dict]) -> None:
    home, summary = binder_home
    assert summary["simulate"] == "4xA100-80GB"
    assert summary["projects"] == {
        "vision": {"build_quota": 1.5, "train_guarantee": 2},
        "nlp": {"build_quota": 1, "train_guarantee": 2},
    }
    assert Path(summary["state_dir"]).is_relative_to(home)
    assert (Path(summary["state_dir"]) / "state.db").exists()


def test_postbuild_config_loads(binder_home: tuple[Path, dict]) -> None:
    home, summary = binder_home
    config_file = Path(summary["config"])
    assert config_file.is_relative_to(home)
    config = PyFileConfigLoader(config_file.name, path=str(config_file.parent)).load_config()
    gp = config.GPUPool
    assert gp.simulate == "4xA100-80GB"
    assert gp.project == "vision"
    assert gp.state_dir == summary["state_dir"]
    assert gp.build_quota == 1.5 and gp.train_guarantee == 2.0


def test_postbuild_rerun_replaces_its_block_and_keeps_user_settings(binder_home: tuple[Path, dict]) -> None:
    home, summary = binder_home
    config_file = Path(summary["config"])
    config_file.write_text("c.ServerApp.iopub_data_rate_limit = 1e9\n" + config_file.read_text())
    _run_postbuild(home)
    text = config_file.read_text()
    assert text.startswith("c.ServerApp.iopub_data_rate_limit = 1e9\n")
    assert text.count("c.GPUPool.simulate") == 1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, token: str) -> dict:
    req = urllib.request.Request(url, headers={"Authorization": f"token {token}"})
    with urllib.request.urlopen(req, timeout=10) as reply:
        return json.loads(reply.read())


def test_jupyter_server_with_binder_home_serves_the_demo_pool(binder_home: tuple[Path, dict], tmp_path: Path) -> None:
    home, _ = binder_home
    port, token = _free_port(), "binder-test-token"
    root = tmp_path / "notebooks"
    root.mkdir()
    cmd = [
        sys.executable, "-m", "jupyter_server",
        f"--port={port}", "--ip=127.0.0.1", "--no-browser", "--allow-root",
        f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
        # Enabled by the installed server-config file; named here so the test is only about postBuild's config.
        '--ServerApp.jpserver_extensions={"jupyter_gpupool": True}',
    ]  # fmt: skip
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(cmd, cwd=root, env=_env(home), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        status = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                status = _get(f"http://127.0.0.1:{port}/gpupool/api/status", token)
                break
            except OSError:
                time.sleep(0.5)
        assert status is not None, (tmp_path / "server.log").read_text()[-3000:]
        assert status["simulated"] is True
        gpus = [g for node in status["pool"]["nodes"] for g in node["gpus"]]
        assert len(gpus) == 4 and {g["model"] for g in gpus} == {"A100-80GB"}
        projects = {p["name"]: p for p in status["projects"]}
        assert set(projects) == {"vision", "nlp"}
        assert projects["vision"]["build_quota"] == 1.5 and projects["vision"]["train_guarantee"] == 2
        assert projects["nlp"]["build_quota"] == 1 and projects["nlp"]["train_guarantee"] == 2
        assert status["project"] == "vision"
        specs = _get(f"http://127.0.0.1:{port}/api/kernelspecs", token)["kernelspecs"]
        assert any(s["spec"]["display_name"] == "Python 3 (¼ GPU)" for s in specs.values())
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def test_binder_environment_names_python_and_a_recent_node() -> None:
    text = (ROOT / "binder" / "environment.yml").read_text()
    deps = [line.strip()[2:].strip() for line in text.splitlines() if line.strip().startswith("- ")]
    assert any(d.startswith("python=3.") for d in deps)
    node = [d for d in deps if d.startswith("nodejs")]
    # @jupyter/builder (rspack) needs Node.js 20.19+ or 22.12+.
    assert node and int(node[0].split("=")[-1].split(".")[0]) >= 22
