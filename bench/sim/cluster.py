"""Building the simulated cluster and its projects as the policy engine sees them."""

from __future__ import annotations

from scheduler.policy.model import MILLI, TRAIN_POOL, Gpu, Node, Project

GPU_MODEL = "P100"  # Philly ran 12-24 GB Pascal/Maxwell cards; the model does not matter to any policy here
GPU_MEMORY_MIB = 16_384


def make_node(name: str, gpus: int) -> Node:
    """A training-only node with ``gpus`` whole GPUs, ids ``<node>/g<i>``."""
    return Node(
        name=name,
        cpu_milli=64_000,
        memory_mib=512 * 1024,
        gpus=tuple(
            Gpu(id=f"{name}/g{i}", index=i, model=GPU_MODEL, memory_mib=GPU_MEMORY_MIB, topology_group=name)
            for i in range(gpus)
        ),
        pools=frozenset({TRAIN_POOL}),
    )


def shared_cluster(nodes: int, gpus_per_node: int) -> tuple[Node, ...]:
    """The pooled cluster: ``nodes`` identical nodes."""
    return tuple(make_node(f"n{i:03d}", gpus_per_node) for i in range(nodes))


def partitioned_cluster(
    guarantees: dict[str, int], gpus_per_node: int
) -> tuple[tuple[Node, ...], dict[str, str]]:
    """The same GPUs cut into private per-team sub-clusters, and node -> owning team.

    A team with ``g`` guaranteed GPUs owns ``g // gpus_per_node`` full nodes and,
    if ``g`` is not a multiple, one partial node with the rest: the closest a
    static partition gets to its share when nodes are the unit of isolation.
    """
    nodes: list[Node] = []
    owner: dict[str, str] = {}
    for team, gpus in guarantees.items():
        full, rest = divmod(gpus, gpus_per_node)
        sizes = [gpus_per_node] * full + ([rest] if rest else [])
        for k, size in enumerate(sizes):
            node = make_node(f"{team}-{k}", size)
            nodes.append(node)
            owner[node.name] = team
    return tuple(nodes), owner


def projects_for(guarantees: dict[str, int]) -> tuple[Project, ...]:
    """One project per team, guaranteed its GPUs for training, no limit, equal weights."""
    return tuple(
        Project(name=team, train_guarantee_milli=gpus * MILLI, train_limit_milli=None, weight=1.0)
        for team, gpus in guarantees.items()
    )
