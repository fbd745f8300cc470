"""`gpupool serve --backend kubernetes` as a user runs it, driven with the `gpupool` command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.kube.cluster import Kubelet, pod_env, wait

TOKEN = "kube-cli-admin-token"


def gpupool(url: str, *args: str) -> Any:
    env = {**os.environ, "GPUPOOL_URL": url, "GPUPOOL_TOKEN": TOKEN}
    cut = args.index("--") if "--" in args else len(args)  # --json before a job's command, not in it
    r = subprocess.run([sys.executable, "-m", "gpupool", *args[:cut], "--json", *args[cut:]], env=env,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def serve(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[str], str]:
    cfg = tmp_path / "fast.json"
    cfg.write_text(json.dumps({"poll_s": 0.05, "tick_s": 0.2, "min_runtime_s": 0, "resume_backoff_s": 0,
                               "pause_grace_s": 2, "run_jobs_as": "service"}))
    env = {**os.environ, "GPUPOOL_ADMIN_TOKEN": TOKEN}
    proc = subprocess.Popen([sys.executable, "-m", "gpupool", "serve", "--port", "0", "--state-dir",
                             str(tmp_path / "state"), "--config", str(cfg), *args],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert "listening on" in line, line + proc.stderr.read() if proc.poll() is not None else line
    return proc, line.split("listening on ")[1].split()[0]


def test_serve_on_a_cluster_submit_from_the_cli_and_see_the_pod(api: Any, namespace: str, gpu_nodes: Any,
                                                                 kubeconfig: Path, tmp_path: Path) -> None:
    nodes = gpu_nodes(3, gpus=8)
    proc, url = serve(tmp_path, "--backend", "kubernetes", "--kubeconfig", str(kubeconfig),
                      "--namespace", namespace, "--image", "registry.example/train:1")
    try:
        status = wait(lambda: (s := gpupool(url, "status")) and len(s["pool"]["nodes"]) == 3 and s,
                      what="3 nodes in gpupool status")
        assert status["simulated"] is False
        assert status["backend"]["backend"] == "kubernetes" and status["backend"]["ok"] is True
        text = subprocess.run([sys.executable, "-m", "gpupool", "status"], capture_output=True, text=True,
                              timeout=60, env={**os.environ, "GPUPOOL_URL": url, "GPUPOOL_TOKEN": TOKEN}).stdout
        assert f"namespace {namespace}: OK" in text.splitlines()[1], text
        assert sum(len(n["gpus"]) for n in status["pool"]["nodes"]) == 24
        gpupool(url, "projects", "set", "vision", "--guarantee", "8")
        job = gpupool(url, "submit", "--project", "vision", "--gpus", "4", "--", "python", "train.py", "--lr", "3e-4")
        with Kubelet(api, namespace) as kubelet:
            name = f"gpupool-{job['id']}-1"
            wait(lambda: name in kubelet.started, what="the job's pod bound and running")
            pod = api.read_namespaced_pod(name, namespace)
            assert pod.spec.node_name in nodes
            running = gpupool(url, "describe", job["id"])
            assert running["state"] == "running" and running["assignment"]["node"] == pod.spec.node_name
            env = pod_env(pod)
            assert env["NVIDIA_VISIBLE_DEVICES"] == ",".join(str(g["index"]) for g in running["assignment"]["gpus"])
            assert env["CUDA_VISIBLE_DEVICES"] == "0,1,2,3"
            assert pod.spec.containers[0].image == "registry.example/train:1"
            assert pod.spec.containers[0].command == ["python", "train.py", "--lr", "3e-4"]
            kubelet.finish(name, 0)
            done = wait(lambda: (j := gpupool(url, "describe", job["id"]))["state"] == "succeeded" and j,
                        what="the job succeeded")
        assert done["exit_code"] == 0
        logs = wait(lambda: (d := gpupool(url, "logs", job["id"])) and "attempt 1" in json.dumps(d) and d,
                    what="the attempt in gpupool logs")
        assert name in json.dumps(logs)
    finally:
        proc.terminate()
        proc.wait(20)
    assert proc.returncode == 0


def test_a_jobs_image_from_the_cli_is_its_pods_image_and_the_rest_get_the_default(
        api: Any, namespace: str, gpu_nodes: Any, kubeconfig: Path, tmp_path: Path) -> None:
    gpu_nodes(1, gpus=8)
    proc, url = serve(tmp_path, "--backend", "kubernetes", "--kubeconfig", str(kubeconfig),
                      "--namespace", namespace, "--image", "registry.example/train:1")
    try:
        wait(lambda: len(gpupool(url, "status")["pool"]["nodes"]) == 1, what="the node in gpupool status")
        gpupool(url, "projects", "set", "vision", "--guarantee", "8")
        own = gpupool(url, "submit", "--project", "vision", "--gpus", "1", "--image", "registry.example/x:2",
                      "--", "python", "train.py")
        default = gpupool(url, "submit", "--project", "vision", "--gpus", "1", "--", "python", "train.py")
        assert own["image"] == "registry.example/x:2" and "image" not in default
        with Kubelet(api, namespace) as kubelet:
            names = [f"gpupool-{job['id']}-1" for job in (own, default)]
            wait(lambda: all(n in kubelet.started for n in names), what="both jobs' pods running")
            images = [api.read_namespaced_pod(n, namespace).spec.containers[0].image for n in names]
            assert images == ["registry.example/x:2", "registry.example/train:1"]
            assert gpupool(url, "describe", own["id"])["image"] == "registry.example/x:2"
            for n in names:
                kubelet.finish(n, 0)
            for job in (own, default):
                wait(lambda j=job: gpupool(url, "describe", j["id"])["state"] == "succeeded", what="done")
    finally:
        proc.terminate()
        proc.wait(20)
    assert proc.returncode == 0


def test_serve_refuses_a_bad_kubeconfig_with_a_clear_message(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "gpupool", "serve", "--backend", "kubernetes", "--kubeconfig",
                        str(tmp_path / "missing"), "--state-dir", str(tmp_path / "s"), "--port", "0"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "cannot load the Kubernetes configuration" in r.stderr and "Traceback" not in r.stderr


def test_kubernetes_flags_need_the_kubernetes_backend(tmp_path: Path) -> None:
    start = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "gpupool", "serve", "--namespace", "ml", "--state-dir",
                        str(tmp_path / "s"), "--port", "0"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "go with --backend kubernetes" in r.stderr
    assert time.monotonic() - start < 30
