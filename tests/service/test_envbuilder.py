"""The GPU environment builder and the torch memory-cap hook (with a fake torch, no GPU needed)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from gpupool import envbuilder
from gpupool.envbuilder import TORCH_HOOK_DIR, gpu_environment

GIB = 1024**3


def test_fractional_share_variables():
    env = gpu_environment("j-000007", "vision", [("GPU-a", 250, 20 * GIB)], attempt=2, resume=True,
                          simulated=True, mps=False, pythonpath="/opt/lib")
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-a"
    assert env["GPUPOOL_JOB_ID"] == "j-000007" and env["GPUPOOL_PROJECT"] == "vision"
    assert env["GPUPOOL_ATTEMPT"] == "2" and env["GPUPOOL_RESUME"] == "1"
    assert env["GPUPOOL_GPU_FRACTION"] == "0.25"
    assert env["GPUPOOL_GPU_MEMORY_LIMIT"] == str(20 * GIB)
    assert env["GPUPOOL_SIMULATED"] == "1"
    assert env["XLA_PYTHON_CLIENT_MEM_FRACTION"] == "0.25" and env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"
    assert env["TF_FORCE_GPU_ALLOW_GROWTH"] == "true" and "TF_GPU_ALLOCATOR" in env
    assert env["PYTHONPATH"].split(os.pathsep) == [TORCH_HOOK_DIR, "/opt/lib"]
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in env


def test_whole_gpus_and_cpu_only():
    env = gpu_environment("j-1", "p", [("GPU-a", 1000, 80 * GIB), ("GPU-b", 1000, 80 * GIB)], 1, False, False, mps=False)
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-a,GPU-b"
    assert env["GPUPOOL_GPU_FRACTION"] == "1" and env["GPUPOOL_RESUME"] == "0" and env["GPUPOOL_SIMULATED"] == "0"
    cpu = gpu_environment("j-2", "p", [], 1, False, True, mps=False)
    assert cpu["CUDA_VISIBLE_DEVICES"] == "" and cpu["GPUPOOL_GPU_FRACTION"] == "0"
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION" not in cpu and "PYTHONPATH" not in cpu


def test_mps_limits_when_daemon_runs():
    env = gpu_environment("j-1", "p", [("GPU-a", 500, 40 * GIB)], 1, False, False, mps=True)
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=40960M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"


def test_mps_detection_by_pipe_dir(tmp_path):
    assert envbuilder.mps_running({"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)}) in (False, True)
    (tmp_path / "control").touch()
    assert envbuilder.mps_running({"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path)}) is True


def _fake_torch(root: Path, available: bool = True) -> None:
    pkg = root / "torch"
    (pkg / "cuda").mkdir(parents=True)
    (pkg / "__init__.py").write_text("from torch import cuda\n")
    (pkg / "cuda" / "__init__.py").write_text(textwrap.dedent(f"""
        import os
        _queued = []
        def is_available(): return {available}
        def is_initialized(): return False
        def device_count(): return 2
        def _lazy_call(fn): _queued.append(fn)
        def _lazy_init():
            for fn in _queued: fn()
        def set_per_process_memory_fraction(f, device):
            with open(os.environ["FAKE_TORCH_LOG"], "a") as out:
                out.write(f"{{f}} {{device}}\\n")
    """))


def _run(tmp_path: Path, fraction: int, code: str, extra_path: str = "") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.update(gpu_environment("j-1", "p", [("GPU-a", fraction, 10 * GIB)], 1, False, True, mps=False,
                               pythonpath=os.pathsep.join(p for p in (str(tmp_path), extra_path) if p)))
    env["FAKE_TORCH_LOG"] = str(tmp_path / "calls.txt")
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)


def test_torch_hook_caps_each_visible_device(tmp_path):
    _fake_torch(tmp_path)
    out = _run(tmp_path, 250, "import torch; import torch.cuda as c; c._lazy_init(); print('ok')")
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "calls.txt").read_text().split("\n")[:2] == ["0.25 0", "0.25 1"]


def test_torch_hook_is_lazy_and_skips_whole_gpus(tmp_path):
    _fake_torch(tmp_path)
    out = _run(tmp_path, 250, "import torch; print('ok')")  # CUDA never initialised: nothing called yet
    assert out.returncode == 0 and not (tmp_path / "calls.txt").exists()
    out = _run(tmp_path, 1000, "import torch, torch.cuda as c; c._lazy_init()")
    assert out.returncode == 0 and not (tmp_path / "calls.txt").exists()


def test_hook_chains_to_other_sitecustomize(tmp_path):
    other = tmp_path / "site"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import builtins; builtins.SITE_RAN = True\n")
    out = _run(tmp_path, 500, "import builtins; print(getattr(builtins, 'SITE_RAN', False))", extra_path=str(other))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "True"


def test_kernel_env_keeps_the_kernels_pythonpath_behind_the_local_hook():
    from jupyter_gpupool.kernel_share import with_kernel_pythonpath

    # As a remote scheduler sends it: its own hook path and its own PYTHONPATH.
    remote = {"CUDA_VISIBLE_DEVICES": "GPU-1", "PYTHONPATH": "/srv/gpupool/_torch_hook:/srv/service-only"}
    env = with_kernel_pythonpath(remote, os.pathsep.join(["/home/alice/lib", TORCH_HOOK_DIR, ""]))
    assert env["PYTHONPATH"].split(os.pathsep) == [TORCH_HOOK_DIR, "/home/alice/lib"]
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-1" and remote["PYTHONPATH"].startswith("/srv")  # input untouched
    assert with_kernel_pythonpath(remote, "")["PYTHONPATH"] == TORCH_HOOK_DIR
    cpu_only = {"CUDA_VISIBLE_DEVICES": ""}
    assert with_kernel_pythonpath(cpu_only, "/home/alice/lib") == cpu_only  # the kernel's own stays as it is
