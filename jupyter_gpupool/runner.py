"""The process a promoted notebook's training job runs: papermill, in its run directory.

``python -m jupyter_gpupool.runner --staging .staging-X.ipynb -- <papermill args>``
starts in ``<name>.runs/`` (the job's working directory), takes its snapshot
into ``<job-id>/input.ipynb`` (see :mod:`jupyter_gpupool.promote`), and runs
papermill (``input.ipynb output.ipynb ...``) there with the job's GPU
environment, through :mod:`jupyter_gpupool.headless`: papermill's own CLI with
the kernel on IPC sockets, not plain-text TCP ports. papermill's output goes both to stdout (the scheduler's job log)
and to ``job.log`` beside the notebooks. Stop signals are passed on so a pause
or cancel stops the notebook's kernel too.

A gang job (``replicas`` N > 1) runs this once per replica, all in the same run
folder, each with its own GPUs and rendezvous environment (``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``...; docs/design.md "Multi-node gangs"). Every
replica runs the whole notebook; rank 0 writes ``output.ipynb`` and ``job.log``
(the job's output), rank K ``output.replica-K.ipynb`` and ``job.replica-K.log``,
so no two processes write one file.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time

from jupyter_gpupool.promote import claim_snapshot, replica_file


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """Split our options from papermill's (after ``--``)."""
    if "--" in argv:
        cut = argv.index("--")
        ours, theirs = argv[:cut], argv[cut + 1 :]
    else:
        ours, theirs = argv, []
    parser = argparse.ArgumentParser(prog="python -m jupyter_gpupool.runner")
    parser.add_argument("--staging", required=True, help="snapshot file in the working directory")
    return parser.parse_args(ours), theirs


def wait_for_snapshot(run_dir: str, timeout: float = 10.0) -> bool:
    """Whether input.ipynb is (or within ``timeout``) in place."""
    target = os.path.join(run_dir, "input.ipynb")
    deadline = time.monotonic() + timeout
    while not os.path.exists(target):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def replica_rank() -> int:
    """This process's replica (``GPUPOOL_REPLICA``, set by the executor for a gang), 0 otherwise."""
    raw = os.environ.get("GPUPOOL_REPLICA", "")
    return int(raw) if raw.isdigit() else 0


def for_replica(papermill_args: list[str], rank: int) -> list[str]:
    """papermill's arguments with the output notebook (the second one) renamed for ``rank``."""
    if rank == 0 or len(papermill_args) < 2:
        return papermill_args
    return [papermill_args[0], replica_file(papermill_args[1], rank), *papermill_args[2:]]


def main(argv: list[str] | None = None) -> int:
    """Run papermill for this job; returns its exit status."""
    args, papermill_args = parse(sys.argv[1:] if argv is None else argv)
    job_id = os.environ.get("GPUPOOL_JOB_ID")
    if not job_id:
        print("gpupool runner: GPUPOOL_JOB_ID is not set; run me as a gpupool job", file=sys.stderr)
        return 2
    runs_dir = os.getcwd()
    try:
        run_dir = claim_snapshot(runs_dir, args.staging, job_id)
    except FileNotFoundError:
        run_dir = os.path.join(runs_dir, job_id)
    if not wait_for_snapshot(run_dir):
        print(f"gpupool runner: no notebook snapshot for job {job_id} in {run_dir}", file=sys.stderr)
        return 2
    rank = replica_rank()
    command = [sys.executable, "-m", "jupyter_gpupool.headless", *for_replica(papermill_args, rank)]
    with open(os.path.join(run_dir, replica_file("job.log", rank)), "ab", buffering=0) as log:
        attempt = os.environ.get("GPUPOOL_ATTEMPT", "")
        who = f" replica {rank} of {os.environ.get('GPUPOOL_REPLICAS', '?')}" if "GPUPOOL_REPLICA" in os.environ else ""
        header = f"gpupool: job {job_id}{who} attempt {attempt or '?'}: {' '.join(command)}\n".encode()
        log.write(header)
        sys.stdout.buffer.write(header)
        sys.stdout.flush()
        child = subprocess.Popen(command, cwd=run_dir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)

        def forward(signum: int, _frame: object) -> None:
            if child.poll() is None:
                child.send_signal(signum)

        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, forward)
        assert child.stdout is not None
        for chunk in iter(lambda: child.stdout.read1(65536), b""):  # type: ignore[union-attr]
            log.write(chunk)
            sys.stdout.buffer.write(chunk)
            sys.stdout.flush()
        code = child.wait()
        footer = f"gpupool: papermill exited with status {code}\n".encode()
        log.write(footer)
        sys.stdout.buffer.write(footer)
        sys.stdout.flush()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(main())
