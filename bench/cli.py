"""Benchmark the `gpupool` command line as users run it: the installed script, as real processes.

What a user waits for: ``gpupool status`` and ``gpupool submit`` each start a
Python process, import the CLI, make one HTTP request and print; a sweep of
many jobs goes through ``gpupool submit --from FILE`` in one process over one
connection. Measured against ``gpupool serve`` of this checkout in its own
process, on simulated GPUs that are all busy (so every measured job queues and
no process is spawned):

1. ``python -c pass``: the interpreter's own start, the floor of any Python CLI;
2. ``gpupool status`` and ``gpupool submit``, one after another: median and p90 wall time;
3. ``gpupool submit --from`` with 1,000 jobs: wall time, and where it goes: CPU of the
   CLI process and CPU of the service process over the same run;
4. the same 1,000 jobs sent by :class:`gpupool.client.GpupoolClient` from this process
   (one kept connection, no CLI): what the service alone allows, the floor of row 3.

The script measured is ``.venv/bin/gpupool`` (the console script next to this
Python), which must call ``gpupool.cli.main:main``: after a change of entry point,
``.venv/bin/pip install -q -e .`` regenerates it. ``--cli-root DIR`` measures
another checkout's CLI (e.g. an older commit unpacked with ``git archive``)
against the same service, for before/after: its code first on ``PYTHONPATH``,
called through its own entry point (its ``[project.scripts]``) as its console
script did. ``--setting KEY=VALUE`` changes a service setting (a JSON value) from
the defaults below, to see what the service side costs (e.g. ``cycle_min_interval_s=0.25``:
fewer policy cycles during a burst of submits). Prints one table.

    .venv/bin/python -m bench.cli [--runs 21] [--jobs 1000] [--rounds 3] [--cli-root DIR] [--setting K=V ...]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench._serve import ServeProcess  # noqa: E402
from gpupool.client import GpupoolClient  # noqa: E402

TOKEN = "bench-admin"
GPUS = 4
SETTINGS = {"tick_s": 1.0, "on_shutdown": "stop", "watchdog": "off", "min_runtime_s": 3600.0,
            "run_jobs_as": "service"}
ENTRY_POINT = "from gpupool.cli.main import main"
TARGETS = {"status": 0.150, "submit": 0.150, "from": 3.0}
"""Issue 23, item 6: medians of status and submit, and 1,000 jobs through --from, on 2 cores."""


def the_script() -> Path:
    """``gpupool`` next to this Python, checked to be today's entry point (else: how to regenerate it)."""
    script = Path(sys.executable).parent / "gpupool"
    if not script.is_file():
        raise SystemExit(f"no {script}: install the package first (.venv/bin/pip install -q -e .)")
    if ENTRY_POINT not in script.read_text():
        raise SystemExit(f"{script} is not the current entry point (gpupool.cli.main:main); "
                         "regenerate it: .venv/bin/pip install -q -e .")
    return script


def entry_command(cli_root: Path) -> list[str]:
    """What another checkout's console script ran: its ``[project.scripts]`` entry point, through this Python."""
    match = re.search(r'^gpupool = "([\w.]+):(\w+)"', (cli_root / "pyproject.toml").read_text(), re.MULTILINE)
    if match is None:
        raise SystemExit(f"no gpupool entry point in {cli_root / 'pyproject.toml'}")
    module, function = match.groups()
    return [sys.executable, "-c", f"import sys; from {module} import {function}; sys.exit({function}())"]


def median(values: list[float]) -> float:
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def wall_times(argv: list[str], env: dict[str, str], runs: int) -> list[float]:
    """Wall seconds of ``runs`` calls one after another (each must exit 0), from the folder ``$HOME`` names.

    Not from the project root: ``python -c`` puts the current folder first on its path, which would
    shadow the checkout measured with ``--cli-root``.
    """
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        result = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                cwd=env["HOME"])
        times.append(time.perf_counter() - t0)
        if result.returncode != 0:
            raise SystemExit(f"{' '.join(argv[:3])} ... failed ({result.returncode}): {result.stderr.strip()}")
    return times


def process_cpu(pid: int) -> float:
    """CPU seconds (user + system) process ``pid`` has used so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def submit_from(command: list[str], env: dict[str, str], path: Path, jobs: int, service_pid: int
                ) -> tuple[float, float, float]:
    """One ``gpupool submit --from`` of ``jobs`` lines: (wall, CLI CPU, service CPU) seconds."""
    path.write_text("".join(f'{{"name": "sweep-{i}", "command": ["true"]}}\n' for i in range(jobs)))
    cli_before, service_before = children_cpu(), process_cpu(service_pid)
    t0 = time.perf_counter()
    result = subprocess.run([*command, "submit", "--from", str(path), "--project", "bench", "--gpus", "1"],
                            env=env, capture_output=True, text=True, cwd=env["HOME"])
    wall = time.perf_counter() - t0
    if result.returncode != 0 or len(result.stdout.splitlines()) != jobs:
        raise SystemExit(f"submit --from failed ({result.returncode}): {result.stderr.strip()[-300:]}")
    return wall, children_cpu() - cli_before, process_cpu(service_pid) - service_before


def api_submits(url: str, jobs: int, service_pid: int) -> tuple[float, float]:
    """``jobs`` submits one after another over one kept connection, no CLI: (wall, service CPU) seconds."""
    spec = {"project": "bench", "gpus": 1, "command": ["true"]}
    with GpupoolClient(url, TOKEN) as client:
        client.whoami()  # the connection is open before the clock starts
        service_before = process_cpu(service_pid)
        t0 = time.perf_counter()
        for i in range(jobs):
            client.submit({**spec, "name": f"api-{i}"})
        return time.perf_counter() - t0, process_cpu(service_pid) - service_before


def cancel_queued(client: GpupoolClient) -> None:
    while queued := client.jobs(state="queued", limit=1000):
        for job in queued:
            client.cancel(job["id"])


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms"


def verdict(value: float, target: float) -> str:
    return f"<= {ms(target) if target < 1 else f'{target:g} s'}: {'met' if value <= target else 'MISSED'}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=21, help="calls of status and of submit (median of these)")
    parser.add_argument("--jobs", type=int, default=1000, help="lines of the --from file")
    parser.add_argument("--rounds", type=int, default=3, help="--from runs (the median is reported)")
    parser.add_argument("--cli-root", type=Path, default=None, help="checkout whose CLI the script runs")
    parser.add_argument("--setting", action="append", default=[], metavar="KEY=VALUE",
                        help="a service setting other than the benchmark's (VALUE is JSON)")
    args = parser.parse_args()
    settings = dict(SETTINGS)
    for item in args.setting:
        key, _, value = item.partition("=")
        settings[key] = json.loads(value)
    cli_root = args.cli_root.resolve() if args.cli_root else None
    has_from = cli_root is None or "--from" in (cli_root / "gpupool" / "cli" / "parser.py").read_text()

    script = the_script()
    command = [str(script)] if cli_root is None else entry_command(cli_root)
    tmp = Path(tempfile.mkdtemp(prefix="gpupool-bench-cli-"))
    service = ServeProcess(tmp / "state", f"{GPUS}xA100-80GB", settings, TOKEN,
                           env={"GPUPOOL_RUNTIME_DIR": str(tmp / "runtime")})
    service.start()
    assert service.proc is not None
    rows: list[tuple[str, str, str]] = []
    try:
        with GpupoolClient(service.url, TOKEN) as admin:
            admin.set_project("bench", train_guarantee=GPUS)
            for _ in range(GPUS):  # every GPU busy: the measured jobs queue, none is spawned
                admin.submit({"project": "bench", "gpus": 1, "command": ["sleep", "3600"]})
            env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPOOL_") and k != "PYTHONPATH"}
            env.update(HOME=str(tmp), XDG_CONFIG_HOME=str(tmp / "config"), GPUPOOL_RUNTIME_DIR=str(tmp / "runtime"),
                       GPUPOOL_URL=service.url, GPUPOOL_TOKEN=TOKEN)
            if cli_root is not None:
                env["PYTHONPATH"] = str(cli_root)
            floor = wall_times([sys.executable, "-c", "pass"], env, args.runs)
            rows.append(("`python -c pass` (the interpreter's start), median", ms(median(floor)), ""))
            for name, argv in (("status", ["status"]),
                               ("submit", ["submit", "--project", "bench", "--gpus", "1", "--", "true"])):
                wall_times([*command, *argv], env, 3)  # the page cache and bytecode, as after any first call
                times = wall_times([*command, *argv], env, args.runs)
                rows.append((f"`gpupool {name}`, median / p90 of {args.runs}",
                             f"**{ms(median(times))}** / {ms(p90(times))}", verdict(median(times), TARGETS[name])))
            cancel_queued(admin)
            runs = []
            for _ in range(args.rounds if has_from else 0):
                runs.append(submit_from(command, env, tmp / "jobs.jsonl", args.jobs, service.proc.pid))
                cancel_queued(admin)
            if runs:
                wall, cli_cpu, service_cpu = sorted(runs)[len(runs) // 2]
                rows.append((f"`gpupool submit --from` {args.jobs:,} jobs, median of {args.rounds} runs",
                             f"**{wall:.2f} s** ({args.jobs / wall:.0f} jobs/s)",
                             verdict(wall, TARGETS["from"]) if args.jobs == 1000 else ""))
                rows.append(("  CPU of the CLI process / of the service process in that run",
                             f"{cli_cpu:.2f} s / {service_cpu:.2f} s", ""))
            else:
                rows.append(("`gpupool submit --from`", "not in that checkout's CLI", ""))
            direct = []
            for _ in range(args.rounds):
                direct.append(api_submits(service.url, args.jobs, service.proc.pid))
                cancel_queued(admin)
            wall, service_cpu = sorted(direct)[len(direct) // 2]
            rows.append((f"the same {args.jobs:,} jobs by the Python client, no CLI (the service's floor)",
                         f"{wall:.2f} s, service CPU {service_cpu:.2f} s", ""))
    finally:
        service.stop()
        shutil.rmtree(tmp, ignore_errors=True)

    load = os.getloadavg()
    measured = script if cli_root is None else f"{cli_root} through its entry point"
    print(f"gpupool CLI ({measured}), {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {platform.machine()} "
          f"{os.cpu_count()} CPUs, Python {platform.python_version()}, load average {load[0]:.1f} at the end; "
          f"service settings {json.dumps(settings)}")
    width = max(len(r[0]) for r in rows)
    print(f"| {'measure'.ljust(width)} | result | target |")
    print(f"|{'-' * (width + 2)}|---|---|")
    for name, value, target in rows:
        print(f"| {name.ljust(width)} | {value} | {target} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
