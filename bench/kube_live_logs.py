"""Live pod logs (gpupool/backends/kubernetes/logs.py) on a real API server: latency, background load, final copies.

Starts its own kube-apiserver + etcd (scripts/kube, as tests/kube/conftest.py
does) and the tests' stand-in kubelet log endpoint (tests/kube/cluster.py), which
the API server proxies ``pods/log`` to. Three measurements:

- **latency**: one running pod whose log is being read (polled every second):
  a line printed -> the line in the job's log file, p50/p99 over ``--samples``.
- **background**: ``--pods`` bound pods nobody reads, for ``--seconds``: the
  poller's log requests per second (the budget is 20/s) and its thread's CPU.
- **final copy**: one pod that printed ``--lines`` lines, copied at its end
  from nothing: wall time, requests, bytes asked for, and a check that the file
  holds each line once. Twice: all lines within one second (the worst case:
  every chunk re-reads the second so far) and spread over 10 seconds.

    .venv/bin/python bench/kube_live_logs.py [--pods 1000] [--seconds 20] [--samples 40] [--lines 100000]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kubernetes import client, config  # noqa: E402

from gpupool.backends.kubernetes.logs import LiveLogs  # noqa: E402
from tests.kube.cluster import LogServer, make_gpu_node  # noqa: E402

KUBE = Path(os.environ.get("GPUPOOL_KUBE_DIR", ROOT / "scripts" / "kube"))
NS = "bench"


def thread_cpu_s(native_id: int) -> float:
    """User + system CPU seconds of one thread of this process (Linux /proc)."""
    fields = Path(f"/proc/self/task/{native_id}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def make_pods(api: client.CoreV1Api, names: list[str], node: str) -> None:
    def one(name: str) -> None:
        api.create_namespaced_pod(NS, {"metadata": {"name": name}, "spec": {
            "schedulerName": "gpupool", "containers": [{"name": "job", "image": "busybox"}]}})
        api.create_namespaced_pod_binding(name, NS, {"metadata": {"name": name},
                                                     "target": {"kind": "Node", "name": node}},
                                          _preload_content=False)

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        list(pool.map(one, names))


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(p / 100 * (len(xs) - 1))))]


def latency(api: client.CoreV1Api, logs_server: LogServer, tmp: Path, samples: int) -> list[float]:
    path = tmp / "L" / "job.log"
    live = LiveLogs(api, NS, lambda job: tmp / job / "job.log", lambda: [("L", 1, "p-latency")])
    live.start()
    out = []
    try:
        for i in range(samples):
            live.viewed("L")
            line = f"sample {i}"
            t0 = time.monotonic()
            logs_server.print(NS, "p-latency", line)
            while not (path.exists() and f"{line}\n" in path.read_text()):
                time.sleep(0.005)
            out.append(time.monotonic() - t0)
            time.sleep(0.1)
    finally:
        live.stop()
    return out


def background(api: client.CoreV1Api, tmp: Path, names: list[str], seconds: float) -> tuple[float, float]:
    live = LiveLogs(api, NS, lambda job: tmp / job / "job.log", lambda: [(f"B{i}", 1, n) for i, n in
                                                                         enumerate(names)])
    live.start()
    try:
        time.sleep(2.0)  # past the spread-out first polls' start
        tid = live._thread.native_id
        assert tid is not None
        r0, c0, t0 = live.requests, thread_cpu_s(tid), time.monotonic()
        time.sleep(seconds)
        r1, c1, t1 = live.requests, thread_cpu_s(tid), time.monotonic()
    finally:
        live.stop()
    return (r1 - r0) / (t1 - t0), (c1 - c0) / (t1 - t0)


def final_copy(api: client.CoreV1Api, logs_server: LogServer, tmp: Path, pod: str, lines: int,
               spread_s: float) -> dict[str, Any]:
    with logs_server._lock:  # the stand-in's buffer, written directly: the stamps decide the seconds
        now = time.time_ns()
        logs_server._lines[(NS, pod)] = [
            (now - int(spread_s * 1e9) + int(i * spread_s * 1e9 / lines), f"line {i:07d} " + "x" * 40)
            for i in range(lines)]
    live = LiveLogs(api, NS, lambda job: tmp / job / "job.log", lambda: [])
    asked = []
    fetch = live._fetch

    def counting(pos: Any) -> bytes:
        data = fetch(pos)
        asked.append(len(data))
        return data

    live._fetch = counting  # type: ignore[method-assign]
    t0 = time.monotonic()
    live.finish(pod, 1, pod)
    wall = time.monotonic() - t0
    got = (tmp / pod / "job.log").read_text().splitlines()[1:]
    ok = got == [f"line {i:07d} " + "x" * 40 for i in range(lines)]
    return {"wall": wall, "requests": len(asked), "mib": sum(asked) / 2**20, "each_once": ok}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pods", type=int, default=1000)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--lines", type=int, default=100_000)
    args = ap.parse_args()
    d = Path(tempfile.mkdtemp(prefix="bench-live-logs-"))
    subprocess.run([str(KUBE / "start"), str(d / "kube")], check=True, stdout=subprocess.DEVNULL)
    logs_server = LogServer()
    try:
        api = client.CoreV1Api(config.new_client_from_config(config_file=str(d / "kube" / "kubeconfig")))
        api.create_namespace({"metadata": {"name": NS}})
        make_gpu_node(api, "n0", 8)
        api.patch_node_status("n0", {"status": {
            "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": logs_server.port}}}})
        names = [f"p-{i}" for i in range(args.pods)]
        t0 = time.monotonic()
        make_pods(api, ["p-latency", "p-final-1s", "p-final-10s", *names], "n0")
        print(f"# {args.pods + 3} pods created and bound in {time.monotonic() - t0:.1f} s", file=sys.stderr)
        lat = latency(api, logs_server, d, args.samples)
        rate, cpu = background(api, d, names, args.seconds)
        one = final_copy(api, logs_server, d, "p-final-1s", args.lines, 0.5)
        ten = final_copy(api, logs_server, d, "p-final-10s", args.lines, 10.0)
    finally:
        logs_server.close()
        subprocess.run([str(KUBE / "stop"), str(d / "kube")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.rmtree(d, ignore_errors=True)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    print("| what | result |")
    print("|---|---|")
    print(f"| print -> job log, a pod being read ({args.samples} lines) | p50 {statistics.median(lat) * 1000:.0f} ms, "
          f"p99 {pct(lat, 99) * 1000:.0f} ms |")
    print(f"| {args.pods} running pods nobody reads, {args.seconds:.0f} s | {rate:.1f} log requests/s, "
          f"poller thread {cpu * 100:.1f}% of a core |")
    for label, r in ((f"{args.lines} lines in one second", one), (f"{args.lines} lines over 10 s", ten)):
        print(f"| final copy, {label} | {r['wall']:.2f} s, {r['requests']} requests, {r['mib']:.1f} MiB asked, "
              f"each line once: {r['each_once']} |")


if __name__ == "__main__":
    main()
