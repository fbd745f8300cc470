"""How a trace job wider than one node becomes a multi-node gang of replicas.

The Philly trace gives each job a GPU count and nothing else. A data-parallel
job of G GPUs on nodes of at most ``width`` GPUs runs as R identical
replicas (torchrun / Horovod workers), one ``Workload`` each, linked as a
gang (docs/policy.md, rule 7). The rule chosen here:

* R is the smallest number of replicas, at least ``ceil(G / width)``, that
  divides G evenly; each replica asks ``G / R`` whole GPUs. So 16 GPUs on
  8-GPU nodes is 2 x 8, 24 is 3 x 8, and 12 is 2 x 6 (not 8 + 4: the
  policy's gangs are identical replicas, and not 2 x 8 = 16: that would
  invent four GPUs of work the trace never asked for). The job's GPU-seconds
  stay exactly the trace's, so every policy is measured on the same work.
* A job that fits one node (G <= ``width``) stays a single workload with its
  id unchanged, so a replay without wide jobs decides exactly as before.

In the Philly trace this matters only for the 7 jobs of 12 GPUs; every other
wide job is a multiple of 8 (16, 24, 32, 64, 128).
"""

from __future__ import annotations

import math


def replica_shape(gpus: int, width: int) -> tuple[int, int]:
    """(replicas, GPUs per replica) for a job of ``gpus`` GPUs on nodes of at most ``width`` GPUs."""
    if gpus < 1 or width < 1:
        raise ValueError(f"a job needs at least one GPU and nodes at least one ({gpus=}, {width=})")
    if gpus <= width:
        return 1, gpus
    replicas = math.ceil(gpus / width)
    while gpus % replicas:
        replicas += 1  # terminates: replicas == gpus divides it, with one GPU each
    return replicas, gpus // replicas


def replica_ids(job_id: str, replicas: int) -> tuple[str, ...]:
    """Workload ids of a job's replicas: the job's own id when it is one workload."""
    if replicas == 1:
        return (job_id,)
    return tuple(f"{job_id}-r{k}" for k in range(replicas))
