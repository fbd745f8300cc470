"""A ¼ GPU kernel as a pod (issue 25) against a plain local kernel, in the same run, on the test cluster.

Goal: the kernel pod's first ``execute_reply`` <= 1.5 s later than the local
kernel's; its share back in the pool <= 2 s after shutdown.

    .venv/bin/python bench/kernel_pod_start.py [--rounds 8]

Starts its own Kubernetes control plane (scripts/kube, as tests/kube does), one
GPU node, a real ``gpupool serve --backend kubernetes`` process and a real
``jupyter server`` with the gpupool extension pointing at it (GPUPOOL_URL),
and the stand-in kubelet of tests/kube/process_kubelet.py, which runs each
bound kernel pod's command as a local process on a loopback address of its
own (no image pull: the pod's start by this kubelet is counted, a pull would
not be). Then, alternating the two kinds each round:

- **start -> first execute_reply**: from ``POST /api/kernels`` (the Launcher's
  call) to the reply of the first ``execute_request`` sent on the kernel's
  websocket (``/api/kernels/<id>/channels``, as JupyterLab sends it), the
  websocket opened as soon as the POST answers;
- **share back after shutdown** (the pod kernel): from ``DELETE
  /api/kernels/<id>`` to the scheduler showing the share ``cancelled``
  (``GET /jobs/<id>``, polled every 10 ms), and to the pod gone from the API
  server.

Prints one table (medians, and the worst of the rounds); ``--json`` prints the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kubernetes import client, config  # noqa: E402
from kubernetes.client.rest import ApiException  # noqa: E402

from gpupool.client import GpupoolClient  # noqa: E402
from tests.jupyter.server_process import TOKEN as SERVER_TOKEN  # noqa: E402
from tests.jupyter.server_process import api as jupyter  # noqa: E402
from tests.jupyter.server_process import start_server  # noqa: E402
from tests.kube.cluster import make_gpu_node  # noqa: E402
from tests.kube.kernel_channels import KernelChannels  # noqa: E402
from tests.kube.process_kubelet import ProcessKubelet  # noqa: E402

KUBE = Path(os.environ.get("GPUPOOL_KUBE_DIR", ROOT / "scripts" / "kube"))
ADMIN_TOKEN = "bench-kernel-pods"
QUARTER = "gpupool-python3-0.25"


def serve(work: Path, kubeconfig: Path, namespace: str) -> tuple[subprocess.Popen[str], str]:
    """``gpupool serve --backend kubernetes`` with the tests' fast settings; (process, URL)."""
    cfg = work / "serve.json"
    cfg.write_text(json.dumps({"poll_s": 0.05, "tick_s": 0.2, "min_runtime_s": 0, "run_jobs_as": "service"}))
    proc = subprocess.Popen([sys.executable, "-m", "gpupool", "serve", "--port", "0", "--state-dir",
                             str(work / "state"), "--config", str(cfg), "--backend", "kubernetes",
                             "--kubeconfig", str(kubeconfig), "--namespace", namespace],
                            env={**os.environ, "GPUPOOL_ADMIN_TOKEN": ADMIN_TOKEN}, stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "listening on" not in line:
        sys.exit(f"gpupool serve did not start: {line}")
    threading.Thread(target=lambda: proc.stdout.read() if proc.stdout else None, daemon=True).start()
    return proc, line.split("listening on ")[1].split()[0]


async def first_reply(port: int, name: str) -> tuple[str, float]:
    """(kernel id, seconds from POST /api/kernels to the first execute_reply)."""
    start = time.perf_counter()
    code, kernel = await asyncio.to_thread(jupyter, port, "/api/kernels", "POST", {"name": name})
    if code != 201:
        raise RuntimeError(f"kernel {name} did not start: {code} {kernel}")
    async with KernelChannels(port, SERVER_TOKEN, kernel["id"]) as k:
        out = await k.execute("1 + 1", timeout=120)
    if out.status != "ok":
        raise RuntimeError(f"the first cell of {name} failed: {out}")
    return str(kernel["id"]), time.perf_counter() - start


def pod_gone(api: client.CoreV1Api, namespace: str, name: str) -> bool:
    try:
        api.read_namespaced_pod(name, namespace)
    except ApiException as e:
        return e.status == 404
    return False


async def shutdown_pod_kernel(port: int, kernel_id: str, pool: GpupoolClient, api: client.CoreV1Api,
                              namespace: str) -> tuple[float, float]:
    """(seconds to the share cancelled, seconds to the pod gone) from DELETE /api/kernels/<id>."""
    share = next(j for j in pool.jobs() if j["kind"] == "build" and j["labels"].get("kernel_id") == kernel_id
                 and j["state"] == "running")
    pod = pool.job(share["id"])["kernel_pod"]["name"]
    start = time.perf_counter()
    code, _ = await asyncio.to_thread(jupyter, port, f"/api/kernels/{kernel_id}", "DELETE")
    assert code == 204
    freed = gone = 0.0
    while not (freed and gone):
        now = time.perf_counter() - start
        if not freed and pool.job(share["id"])["state"] == "cancelled":
            freed = now
        if not gone and pod_gone(api, namespace, pod):
            gone = now
        if now > 60:
            raise RuntimeError("the share or the pod did not go within 60 s")
        await asyncio.sleep(0.01)
    return freed, gone


async def rounds(n: int, port: int, pool: GpupoolClient, api: client.CoreV1Api, namespace: str) -> dict[str, Any]:
    local, pod, freed, gone = [], [], [], []
    await first_reply(port, "python3")  # warm: imports, bytecode, the first kernel's files
    for i in range(n):
        for kind in (("python3", QUARTER) if i % 2 == 0 else (QUARTER, "python3")):
            kid, took = await first_reply(port, kind)
            if kind == QUARTER:
                pod.append(took)
                f, g = await shutdown_pod_kernel(port, kid, pool, api, namespace)
                freed.append(f)
                gone.append(g)
            else:
                local.append(took)
                await asyncio.to_thread(jupyter, port, f"/api/kernels/{kid}", "DELETE")
    return {"local": local, "pod": pod, "freed": freed, "gone": gone}


def table(r: dict[str, Any], rounds_n: int) -> str:
    med = {k: statistics.median(v) for k, v in r.items()}
    worst = {k: max(v) for k, v in r.items()}
    extra = [p - q for p, q in zip(r["pod"], r["local"], strict=True)]
    lines = [f"kernel pods vs local kernels, {rounds_n} rounds, {platform.node()} "
             f"({os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
             "",
             "| measure | median s | worst s |",
             "|---|---|---|",
             f"| local plain kernel: start -> first execute_reply | {med['local']:.3f} | {worst['local']:.3f} |",
             f"| ¼ GPU kernel pod: start -> first execute_reply | {med['pod']:.3f} | {worst['pod']:.3f} |",
             f"| pod minus local (paired by round; goal <= 1.5) | **{statistics.median(extra):.3f}** | "
             f"{max(extra):.3f} |",
             f"| shutdown -> share cancelled (goal <= 2) | **{med['freed']:.3f}** | {worst['freed']:.3f} |",
             f"| shutdown -> pod gone from the API server | {med['gone']:.3f} | {worst['gone']:.3f} |"]
    return "\n".join(lines)


async def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if not (KUBE / "start").exists():
        sys.exit(f"no Kubernetes test kit at {KUBE}; set GPUPOOL_KUBE_DIR")
    work = Path(tempfile.mkdtemp(prefix="gpupool-bench-kpods-"))
    r = subprocess.run([str(KUBE / "start"), str(work / "kube")], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"could not start the API server ({KUBE}/start):\n{r.stderr[-2000:]}")
    proc = None
    server = None
    try:
        kubeconfig = work / "kube" / "kubeconfig"
        api = client.CoreV1Api(config.new_client_from_config(config_file=str(kubeconfig)))
        namespace = "bench-kernels"
        api.create_namespace({"metadata": {"name": namespace}})
        make_gpu_node(api, "gpu-0", 4)
        proc, url = serve(work, kubeconfig, namespace)
        admin = GpupoolClient(url, ADMIN_TOKEN)
        while not admin.status()["pool"]["nodes"]:
            time.sleep(0.1)
        admin.set_project("bench", build_quota=4)
        token = admin.create_token("alice")["token"]
        (work / "lab").mkdir()
        server = start_server(work / "lab", {"scheduler_url": url, "scheduler_token": token, "project": "bench",
                                             "kernel_fractions": [0.25], "kernel_start_timeout": 120.0})
        with ProcessKubelet(api, namespace):
            out = await rounds(args.rounds, server.port, GpupoolClient(url, token), api, namespace)
        print(json.dumps(out) if args.json else table(out, args.rounds))
    finally:
        if server is not None:
            server.stop()
        if proc is not None:
            proc.terminate()
            proc.wait(20)
        subprocess.run([str(KUBE / "stop"), str(work / "kube")], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    asyncio.run(main())
