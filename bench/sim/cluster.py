"""Building the simulated cluster and its projects as the policy engine sees them."""

from __future__ import annotations

from gpupool.policy.model import MILLI, TRAIN_POOL, Gpu, Node, Project

GPU_MODEL = "P100"  # Philly ran 12-24 GB Pascal/Maxwell cards; the model does not matter to any policy here
GPU_MEMORY_MIB = 16_384


def make_node(name: str, gpus: int, group: str = "") -> Node:
    """A training-only node with ``gpus`` whole GPUs, ids ``<node>/g<i>``, in node group (rack) ``group``."""
    return Node(
        name=name,
        cpu_milli=64_000,
        memory_mib=512 * 1024,
        gpus=tuple(
            Gpu(id=f"{name}/g{i}", index=i, model=GPU_MODEL, memory_mib=GPU_MEMORY_MIB, topology_group=name)
            for i in range(gpus)
        ),
        pools=frozenset({TRAIN_POOL}),
        group=group,
    )


def rack_of(index: int, rack_nodes: int, prefix: str = "") -> str:
    """Node group of the ``index``-th node when racks hold ``rack_nodes`` nodes; "" (no racks) when 0."""
    return f"{prefix}r{index // rack_nodes:02d}" if rack_nodes > 0 else ""


def shared_cluster(nodes: int, gpus_per_node: int, rack_nodes: int = 0) -> tuple[Node, ...]:
    """The pooled cluster: ``nodes`` identical nodes, ``rack_nodes`` to a rack (0: no racks)."""
    return tuple(make_node(f"n{i:03d}", gpus_per_node, rack_of(i, rack_nodes)) for i in range(nodes))


def partitioned_cluster(
    guarantees: dict[str, int], gpus_per_node: int, rack_nodes: int = 0
) -> tuple[tuple[Node, ...], dict[str, str]]:
    """The same GPUs cut into private per-team sub-clusters, and node -> owning team.

    A team with ``g`` guaranteed GPUs owns ``g // gpus_per_node`` full nodes and,
    if ``g`` is not a multiple, one partial node with the rest: the closest a
    static partition gets to its share when nodes are the unit of isolation.
    With ``rack_nodes``, each team's nodes fill racks of their own (a
    partition is a team's own racks), ``rack_nodes`` to a rack.
    """
    nodes: list[Node] = []
    owner: dict[str, str] = {}
    for team, gpus in guarantees.items():
        full, rest = divmod(gpus, gpus_per_node)
        sizes = [gpus_per_node] * full + ([rest] if rest else [])
        for k, size in enumerate(sizes):
            node = make_node(f"{team}-{k}", size, rack_of(k, rack_nodes, f"{team}-"))
            nodes.append(node)
            owner[node.name] = team
    return tuple(nodes), owner


def projects_for(guarantees: dict[str, int]) -> tuple[Project, ...]:
    """One project per team, guaranteed its GPUs for training, no limit, equal weights."""
    return tuple(
        Project(name=team, train_guarantee_milli=gpus * MILLI, train_limit_milli=None, weight=1.0)
        for team, gpus in guarantees.items()
    )
