"""Nodes whose GPUs the DRA driver publishes as ResourceSlices (no nvidia.com/gpu) are in the pool."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from gpupool.cli.tables import status_text
from tests.kube.dra_objects import delete_dra_node, make_dra_node, resource_api
from tests.service.helpers import wait_for


@pytest.fixture
def dra_nodes(api: Any) -> Iterator[list[str]]:
    made: list[str] = []
    yield made
    for n in made:
        delete_dra_node(api, n)


async def test_a_node_with_only_resourceslices_is_in_the_pool_with_its_model_and_memory(
        api: Any, namespace: str, make_core: Any, dra_nodes: list[str]) -> None:
    name = f"dra-{uuid.uuid4().hex[:6]}"
    make_dra_node(api, name, gpus=4, product="NVIDIA H100 80GB HBM3", memory="80Gi")
    dra_nodes.append(name)
    assert "nvidia.com/gpu" not in (api.read_node(name).status.allocatable or {})
    core = await make_core()
    (node,) = await wait_for(lambda: [n for n in core.pool()["nodes"] if n["name"] == name],
                             what="the DRA node in the pool")
    assert [(g["index"], g["id"], g["model"], g["memory"]) for g in node["gpus"]] == [
        (i, f"GPU-{name}-{i}", "H100-80GB", 80 * 1024 ** 3) for i in range(4)]
    text = status_text("http://x", core.status())
    (row,) = [line for line in text.splitlines() if line.startswith(f"{name} ") and " 2 " in line]
    assert row.split()[:6] == [name, "2", "H100-80GB", "80GiB", "0/1", "-"], row
    # The driver withdrawing its slice takes the node's GPUs out of the pool.
    resource_api(api).delete_resource_slice(f"{name}-gpu.nvidia.com")
    await wait_for(lambda: not [n for n in core.pool()["nodes"] if n["name"] == name],
                   what="the node out of the pool with its slice gone")
