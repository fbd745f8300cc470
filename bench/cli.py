"""Benchmark the `gpupool` command line: how fast scripts can submit through it.

A script that submits a sweep calls ``gpupool submit`` once per job, so the
CLI's own start (interpreter, imports, argument parsing) is paid per job; with
several calls at once on a small machine that CPU cost is the limit. Measured
here, against `gpupool serve` in its own process on simulated GPUs that are
all busy (so every measured job queues and no process is spawned):

1. the interpreter alone (``python -c pass``): the floor any Python CLI pays;
2. ``gpupool submit`` one after another: latency per call, and CPU per call (with
   the rate the machine's CPUs would allow at that cost, the service aside), beside
   what ``python -c 'import json, socket'`` costs, the floor of any Python client;
3. ``gpupool submit`` with no URL or token, found through the runtime file;
4. ``gpupool submit`` from 8 parallel callers: jobs/s, driven from this Python
   process (threads), and from a shell (``xargs -P 8``), as a sweep script calls it;
5. the HTTP API itself (the async client, 8 requests in flight): jobs/s;
6. Slurm's ``sbatch --hold --wrap true``, the same two ways, when ``sbatch`` is on PATH.

``--cli-root DIR`` runs the CLI from another checkout (e.g. an older commit
unpacked with ``git archive``) against the same service, for before/after.
The CLI's bytecode is compiled first, as any first run without
``PYTHONDONTWRITEBYTECODE`` leaves it (``--no-compile`` measures without). Prints one table.

    .venv/bin/python -m bench.cli [--sequential 100] [--jobs 400] [--parallel 8] [--cli-root DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import compileall
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._serve import ServeProcess  # noqa: E402
from gpupool.client import AsyncGpupoolClient, GpupoolClient  # noqa: E402

TOKEN = "bench-admin"
GPUS = 4
SETTINGS = {"tick_s": 1.0, "on_shutdown": "stop", "watchdog": "off", "min_runtime_s": 3600.0, "run_jobs_as": "service"}


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def timed_runs(argvs: list[list[str]], env: dict[str, str], parallel: int) -> tuple[list[float], float, float]:
    """Run each command (``parallel`` at a time); returns (latencies, wall seconds, CPU seconds of the children)."""
    latencies: list[float] = []

    def one(argv: list[str]) -> None:
        t0 = time.perf_counter()
        result = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        latencies.append(time.perf_counter() - t0)
        if result.returncode != 0:
            raise SystemExit(f"{' '.join(argv[:3])} ... failed ({result.returncode}): {result.stderr.strip()}")

    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    if parallel == 1:
        for argv in argvs:
            one(argv)
    else:
        with ThreadPoolExecutor(parallel) as pool:
            list(pool.map(one, argvs))
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return latencies, wall, cpu


def shell_rate(argv: list[str], env: dict[str, str], jobs: int, parallel: int) -> tuple[str, str]:
    """The same calls from a shell, as a sweep script makes them (``xargs -P``): no Python driver on the CPUs."""
    label = f"gpupool submit, {parallel} parallel callers from a shell (xargs -P {parallel}): jobs/s"
    if shutil.which("xargs") is None:
        return label, "xargs not installed here"
    t0 = time.perf_counter()
    result = subprocess.run(["sh", "-c", f'seq {jobs} | xargs -P {parallel} -I{{}} "$@" >/dev/null', "sh", *argv],
                            env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if result.returncode != 0:
        return label, f"fails: {result.stderr.strip()[-60:]}"
    return label, f"{jobs / wall:.0f}/s"


def cancel_queued(client: GpupoolClient) -> None:
    while True:
        queued = client.jobs(state="queued", limit=1000)
        if not queued:
            return
        for job in queued:
            client.cancel(job["id"])


async def api_rate(url: str, jobs: int, parallel: int) -> float:
    client = AsyncGpupoolClient(url, TOKEN, timeout=120)
    spec = {"project": "bench", "gpus": 1, "command": ["true"]}
    per_worker = jobs // parallel

    async def worker() -> None:
        for _ in range(per_worker):
            await client.submit(spec)

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(parallel)))
    return per_worker * parallel / (time.perf_counter() - t0)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequential", type=int, default=100, help="calls one after another")
    parser.add_argument("--jobs", type=int, default=400, help="calls for the parallel rate")
    parser.add_argument("--parallel", type=int, default=8, help="parallel callers")
    parser.add_argument("--cli-root", type=Path, default=ROOT, help="checkout whose CLI is measured")
    parser.add_argument("--no-compile", action="store_true",
                        help="leave the CLI's bytecode as found (with PYTHONDONTWRITEBYTECODE=1 and no __pycache__, "
                             "every call compiles the modules it imports)")
    args = parser.parse_args()

    cli_root = args.cli_root.resolve()
    if not args.no_compile:
        compileall.compile_dir(str(cli_root / "scheduler"), quiet=1)
    cached = "compiled first" if not args.no_compile else (
        "as found" + (", not written (PYTHONDONTWRITEBYTECODE)" if os.environ.get("PYTHONDONTWRITEBYTECODE") else ""))
    script = Path(sys.executable).parent / "gpupool"
    gpupool = [str(script)] if script.is_file() else [sys.executable, "-m", "gpupool"]
    tmp = Path(tempfile.mkdtemp(prefix="gpupool-bench-cli-"))
    runtime = tmp / "runtime"
    service = ServeProcess(tmp / "state", f"{GPUS}xA100-80GB", SETTINGS, TOKEN,
                           env={"GPUPOOL_RUNTIME_DIR": str(runtime)})
    service.start()
    rows: list[tuple[str, str]] = []
    try:
        admin = GpupoolClient(service.url, TOKEN)
        admin.set_project("bench", train_guarantee=GPUS)
        for _ in range(GPUS):  # every GPU busy: the measured jobs queue, none is spawned
            admin.submit({"project": "bench", "gpus": 1, "command": ["sleep", "3600"]})
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_")}
        env.update(PYTHONPATH=str(cli_root), HOME=str(tmp), XDG_CONFIG_HOME=str(tmp / "config"),
                   GPUPOOL_RUNTIME_DIR=str(runtime))
        flagged = dict(env, GPUPOOL_URL=service.url, GPUPOOL_TOKEN=TOKEN)
        submit = [*gpupool, "submit", "--project", "bench", "--gpus", "1", "--", "true"]

        floor, _, floor_cpu = timed_runs([[sys.executable, "-c", "pass"]] * args.sequential, env, 1)
        rows.append(("python -c pass (interpreter floor), p50 / CPU per call",
                     f"{ms(pct(floor, 0.5))} / {ms(floor_cpu / args.sequential)}"))
        # What any Python client that speaks JSON over a socket pays before its own code runs.
        _, _, json_cpu = timed_runs([[sys.executable, "-c", "import json, socket"]] * args.sequential, env, 1)
        cpus = os.cpu_count() or 1
        rows.append((f"python -c 'import json, socket': CPU per call / most calls/s on {cpus} CPUs",
                     f"{ms(json_cpu / args.sequential)} / {cpus * args.sequential / json_cpu:.0f}/s"))
        timed_runs([submit] * 5, flagged, 1)  # warm the page cache
        seq, seq_wall, seq_cpu = timed_runs([submit] * args.sequential, flagged, 1)
        rows.append((f"gpupool submit, one after another ({args.sequential}), p50 / p90",
                     f"{ms(pct(seq, 0.5))} / {ms(pct(seq, 0.9))}"))
        rows.append((f"gpupool submit, CPU per call (the CLI process) / most calls/s on {cpus} CPUs",
                     f"{ms(seq_cpu / args.sequential)} / {cpus * args.sequential / seq_cpu:.0f}/s"))
        rows.append(("gpupool submit, one after another: jobs/s", f"{args.sequential / seq_wall:.0f}/s"))
        cancel_queued(admin)
        try:
            found, _, _ = timed_runs([submit] * 20, env, 1)
            rows.append(("gpupool submit with no flags (runtime file), p50", ms(pct(found, 0.5))))
        except SystemExit as e:
            rows.append(("gpupool submit with no flags (runtime file), p50", f"fails: {str(e)[-60:]}"))
        cancel_queued(admin)
        par, par_wall, _ = timed_runs([submit] * args.jobs, flagged, args.parallel)
        rows.append((f"gpupool submit, {args.parallel} parallel callers ({args.jobs}): jobs/s / p50 latency",
                     f"{args.jobs / par_wall:.0f}/s / {ms(pct(par, 0.5))}"))
        cancel_queued(admin)
        rows.append(shell_rate(submit, flagged, args.jobs, args.parallel))
        cancel_queued(admin)
        rate = asyncio.run(api_rate(service.url, args.jobs, args.parallel))
        rows.append((f"HTTP API (async client, {args.parallel} in flight): jobs/s", f"{rate:.0f}/s"))
        cancel_queued(admin)
        sbatch = shutil.which("sbatch")
        if sbatch:
            command = [sbatch, "--hold", "--quiet", "--wrap", "true"]
            sq, sq_wall, _ = timed_runs([command] * args.sequential, env, 1)
            rows.append(("sbatch --hold, one after another, p50", ms(pct(sq, 0.5))))
            _, sp_wall, _ = timed_runs([command] * args.jobs, env, args.parallel)
            rows.append((f"sbatch --hold, {args.parallel} parallel callers: jobs/s", f"{args.jobs / sp_wall:.0f}/s"))
            subprocess.run(["scancel", "--user", os.environ.get("USER", ""), "--state", "PENDING"], check=False)
        else:
            rows.append(("sbatch", "not installed here"))
    finally:
        service.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    load = os.getloadavg()
    print(f"gpupool CLI, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.processor() or platform.machine()}"
          f" {os.cpu_count()} CPUs, Python {platform.python_version()}, load average {load[0]:.1f} before the end;"
          f" CLI from {cli_root}{'' if cli_root == ROOT else ' (other checkout)'}, its bytecode {cached}")
    width = max(len(r[0]) for r in rows)
    print(f"| {'measure'.ljust(width)} | result |")
    print(f"|{'-' * (width + 2)}|--------|")
    for name, value in rows:
        print(f"| {name.ljust(width)} | {value} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
