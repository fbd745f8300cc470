"""A JupyterLab whose GPU kernels are pods on a (test) cluster, for tests/kernel_pods.spec.ts (issue 25).

It starts what the pytest suite's tests/kube/test_kernel_pods.py starts: a real
Kubernetes control plane (scripts/kube), one GPU node, ``gpupool serve --backend
kubernetes`` on it, the stand-in kubelet that runs kernel pods as local
processes on loopback addresses of their own (tests/kube/process_kubelet.py),
and a real JupyterLab with the gpupool extension whose scheduler is that
service (as a Hub's user server on Kubernetes is). When Lab answers it prints
one JSON line, ``{"url": ..., "token": ..., "dir": ...}``, and runs until its
standard input closes or it gets SIGTERM/SIGINT; then it stops everything and
removes its temporary directory.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from kubernetes import client, config  # noqa: E402
from server_lifetime import Lifetime, quiet_lab_notifications  # noqa: E402

from gpupool.client import GpupoolClient  # noqa: E402
from tests.jupyter.server_process import free_port  # noqa: E402
from tests.kube.cluster import make_gpu_node  # noqa: E402
from tests.kube.process_kubelet import ProcessKubelet  # noqa: E402

KUBE = Path(os.environ.get("GPUPOOL_KUBE_DIR", ROOT / "scripts" / "kube"))
ADMIN_TOKEN = "ui-kernel-pods-admin"
LAB_TOKEN = "ui-kernel-pods-lab"
NAMESPACE = "ui-kernels"


def serve(tmp: Path, kubeconfig: Path) -> tuple[subprocess.Popen[str], str]:
    cfg = tmp / "serve.json"
    cfg.write_text(json.dumps({"poll_s": 0.05, "tick_s": 0.2, "min_runtime_s": 0, "run_jobs_as": "service"}))
    proc = subprocess.Popen([sys.executable, "-m", "gpupool", "serve", "--port", "0", "--state-dir",
                             str(tmp / "state"), "--config", str(cfg), "--backend", "kubernetes", "--kubeconfig",
                             str(kubeconfig), "--namespace", NAMESPACE],
                            env={**os.environ, "GPUPOOL_ADMIN_TOKEN": ADMIN_TOKEN}, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "listening on" not in line:
        raise RuntimeError(f"gpupool serve did not start: {line}")
    threading.Thread(target=lambda: proc.stdout.read() if proc.stdout else None, daemon=True).start()
    return proc, line.split("listening on ")[1].split()[0]


def lab(tmp: Path, url: str, token: str) -> tuple[subprocess.Popen[bytes], str]:
    """JupyterLab with the gpupool extension, its scheduler the cluster's; every file under ``tmp``."""
    port = free_port()
    root, cfg = tmp / "root", tmp / "config"
    root.mkdir()
    cfg.mkdir()
    quiet_lab_notifications(tmp / "lab-settings")
    (cfg / "jupyter_server_config.json").write_text(json.dumps({
        "ServerApp": {"ip": "127.0.0.1", "port": port, "port_retries": 0, "open_browser": False,
                      "root_dir": str(root), "allow_root": True,
                      "jpserver_extensions": {"jupyter_gpupool": True, "jupyterlab": True}},
        "IdentityProvider": {"token": LAB_TOKEN},
        "LabApp": {"user_settings_dir": str(tmp / "lab-settings")},
        "GPUPool": {"scheduler_url": url, "scheduler_token": token, "project": "vision",
                    "kernel_fractions": [0.25], "kernel_start_timeout": 120.0}}))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUPOOL_URL", "GPUPOOL_TOKEN", "JUPYTERHUB_"))}
    env.update({"JUPYTER_CONFIG_DIR": str(cfg), "JUPYTER_DATA_DIR": str(tmp / "data"),
                "JUPYTER_RUNTIME_DIR": str(tmp / "runtime"), "JUPYTER_PLATFORM_DIRS": "1"})
    log = (tmp / "lab.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "jupyterlab"], cwd=root, env=env, stdout=log,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    lab_url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"jupyter lab exited:\n{(tmp / 'lab.log').read_text()[-4000:]}")
        try:
            with urllib.request.urlopen(f"{lab_url}/api/status?token={LAB_TOKEN}", timeout=5):
                return proc, lab_url
        except OSError:
            time.sleep(0.3)
    raise RuntimeError("jupyter lab did not answer in 120 s")


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="gpupool-ui-kpods-"))
    procs: list[subprocess.Popen[bytes] | subprocess.Popen[str]] = []
    kube_up = False
    try:
        with Lifetime("kernel_pods_server") as life:
            r = subprocess.run([str(KUBE / "start"), str(tmp / "kube")], capture_output=True, text=True)
            if r.returncode != 0:
                life.say(f"the API server did not start:\n{r.stderr[-3000:]}")
                return 1
            kube_up = True
            kubeconfig = tmp / "kube" / "kubeconfig"
            api = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
            api.create_namespace({"metadata": {"name": NAMESPACE}})
            make_gpu_node(api, "gpu-node-1", 4)
            pool, url = serve(tmp, kubeconfig)
            procs.append(pool)
            admin = GpupoolClient(url, ADMIN_TOKEN)
            while not admin.status()["pool"]["nodes"]:
                time.sleep(0.1)
            admin.set_project("vision", build_quota=1)
            token = admin.create_token("alice")["token"]
            with ProcessKubelet(api, NAMESPACE):
                server, lab_url = lab(tmp, url, token)
                procs.append(server)
                life.announce({"url": lab_url, "token": LAB_TOKEN, "dir": str(tmp)})
                return life.serve(server, "jupyter lab", lambda: (tmp / "lab.log").read_text()[-4000:])
    except Exception as exc:  # noqa: BLE001 (said on stderr, for the test's failure)
        print(f"kernel_pods_server: {exc}", file=sys.stderr, flush=True)
        return 1
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(20)
                except subprocess.TimeoutExpired:
                    p.kill()
        if kube_up:
            subprocess.run([str(KUBE / "stop"), str(tmp / "kube")], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
