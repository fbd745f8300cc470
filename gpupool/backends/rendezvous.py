"""The rendezvous environment of a multi-node gang's replicas (docs/design.md "Multi-node gangs").

torchrun, Horovod and ``torch.distributed`` find each other through a handful
of variables: how many replicas there are, which one this is, and where rank 0
listens. Both executors (local processes, Kubernetes pods) give the same
variables, made here once, so a training script never tells them apart.
"""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on now, for rank 0 to listen on (chosen anew for each attempt).

    The kernel picks it (bind to port 0); it is free the moment it is
    returned. Another process could take it before rank 0 binds it, as with
    any such choice; an attempt that then fails to rendezvous fails visibly
    and its resume picks a new port.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def rendezvous_env(rank: int, world_size: int, master_addr: str, master_port: int) -> dict[str, str]:
    """The variables replica ``rank`` of ``world_size`` runs with, on top of its GPU environment."""
    if not 0 <= rank < world_size:
        raise ValueError(f"rank {rank} is outside 0..{world_size - 1}")
    return {
        "WORLD_SIZE": str(world_size),
        "RANK": str(rank),
        "NODE_RANK": str(rank),
        "GPUPOOL_REPLICA": str(rank),
        "GPUPOOL_REPLICAS": str(world_size),
        "MASTER_ADDR": master_addr,
        "MASTER_PORT": str(master_port),
    }
