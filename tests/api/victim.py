"""A training job that checkpoints, used by the end-to-end tests (run as a real process).

usage: python victim.py CHECKPOINT OUTPUT STEPS [STEP_SECONDS]

Counts to STEPS, saving the step to CHECKPOINT every few steps and at SIGTERM
(the scheduler's pause signal), then exits. Started with GPUPOOL_RESUME=1 it
continues from the checkpoint. At the end it writes OUTPUT as JSON: the steps,
where this attempt started, and every attempt's start step (so a test can see
that no work was lost or done twice beyond the last checkpoint).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def save(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def main() -> int:
    ckpt, output, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    step_s = float(sys.argv[4]) if len(sys.argv) > 4 else 0.05
    state = {"step": 0, "starts": []}
    resumed = os.environ.get("GPUPOOL_RESUME") == "1"
    if resumed and os.path.exists(ckpt):
        with open(ckpt) as f:
            state = json.load(f)
    state["starts"].append({"step": state["step"], "resume": resumed,
                            "attempt": os.environ.get("GPUPOOL_ATTEMPT"),
                            "gpus": os.environ.get("CUDA_VISIBLE_DEVICES")})
    save(ckpt, state)
    print(f"attempt {os.environ.get('GPUPOOL_ATTEMPT')} starts at step {state['step']}", flush=True)
    stopping = False

    def on_term(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    while state["step"] < steps:
        time.sleep(step_s)
        state["step"] += 1
        if stopping or state["step"] % 5 == 0:
            save(ckpt, state)
        if stopping:
            print(f"paused: checkpoint at step {state['step']}", flush=True)
            return 0
    save(ckpt, state)
    save(output, {"steps": state["step"], "starts": state["starts"]})
    print(f"done after {state['step']} steps", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
