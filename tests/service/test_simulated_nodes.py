"""Simulated pools of several nodes (issue 12): the spec, the nodes the core schedules on, and what users see."""

from __future__ import annotations

import pytest

from gpupool.app.backend import build_core
from gpupool.cli.tables import gpus_table
from gpupool.inventory.simulated import SimulatedInventory, parse_nodes, parse_spec
from gpupool.service.config import ServiceConfig
from gpupool.wire.errors import InvalidRequest
from tests.service.helpers import fast_config

THREE = "node-a@rack1=8xA100-80GB;node-b@rack1=8xA100-80GB;node-c=4xT4"


def test_a_spec_of_several_nodes_gives_each_node_its_gpus_and_group():
    nodes = parse_nodes(THREE)
    assert [(n.name, n.group, n.items) for n in nodes] == [
        ("node-a", "rack1", ((8, "A100-80GB"),)), ("node-b", "rack1", ((8, "A100-80GB"),)), ("node-c", "", ((4, "T4"),))]
    inv = SimulatedInventory(THREE, node="ignored-for-named-nodes")
    per_node = {n.name: gpus for n, gpus in inv.nodes}
    assert [g.index for g in per_node["node-b"]] == list(range(8))  # indexes from 0 on every node
    assert [g.index for g in per_node["node-c"]] == [0, 1, 2, 3] and per_node["node-c"][0].model == "T4"
    assert len({g.id for g in inv.gpus()}) == 20 and all(g.node in per_node for g in inv.gpus())
    # ids are stable per node name and spec: a restart finds the GPUs that stored assignments name
    assert [g.id for g in SimulatedInventory(THREE).gpus()] == [g.id for g in inv.gpus()]
    renamed = SimulatedInventory(THREE.replace("node-c", "node-z")).gpus()
    assert [g.id for g in renamed[:16]] == [g.id for g in inv.gpus()[:16]] and renamed[16].id != inv.gpus()[16].id
    # those counting GPUs only (the Jupyter extension) read every node's
    assert sum(c for c, _ in parse_spec(THREE)) == 20


def test_a_spec_without_names_is_still_one_node():
    nodes = parse_nodes("2xA100-80GB,2xT4", default_node="host")
    assert [(n.name, n.group) for n in nodes] == [("host", "")]
    old = SimulatedInventory("2xA100-80GB,2xT4", node="host")
    assert not old.multi_node and [g.index for g in old.gpus()] == [0, 1, 2, 3]


@pytest.mark.parametrize("spec,fragment", [
    ("node-a=8xA100-80GB;;node-b=2xT4", "empty node"),
    ("node-a=8xA100-80GB;", "empty node"),
    ("node-a=8xA100-80GB;4xT4", "every node of a pool of several is NAME[@GROUP]=SPEC"),
    ("node-a=8xA100-80GB;node-a=4xT4", "node node-a appears twice"),
    ("-bad=4xT4", "bad node name '-bad'"),
    ("=4xT4", "bad node name ''"),
    ("node-a@=4xT4", "bad group ''"),
    ("node-a@rack 1=4xT4", "bad group 'rack 1'"),
    ("node-a=4xB9000", "unknown GPU model 'B9000'"),
    ("node-a=0xT4", "bad GPU count 0"),
    ("node-a=", "non-empty string"),
    ("node-a=4xT4=node-b", "separate nodes with ';'"),
])
def test_bad_multi_node_specs_are_clear_errors(spec, fragment):
    with pytest.raises(InvalidRequest) as e:
        parse_nodes(spec)
    assert fragment in e.value.message
    with pytest.raises(InvalidRequest):  # the service refuses it at its configuration, before anything starts
        ServiceConfig(simulate=spec)


def test_build_gpus_with_several_nodes_is_refused_with_a_reason(tmp_path):
    with pytest.raises(InvalidRequest) as e:
        ServiceConfig(state_dir=tmp_path, simulate=THREE, build_gpus=2)
    assert "build_gpus" in e.value.message and "several nodes" in e.value.message
    ServiceConfig(state_dir=tmp_path, simulate="4xA100-80GB", build_gpus=2)  # one machine may still be split


async def test_the_core_schedules_on_every_simulated_node_and_shows_them(tmp_path):
    core = build_core(fast_config(tmp_path / "state", simulate=THREE))
    await core.start()
    try:
        assert [(n.name, n.group, len(n.gpus)) for n in core.pool_state.nodes] == [
            ("node-a", "rack1", 8), ("node-b", "rack1", 8), ("node-c", "", 4)]
        pool = core.pool()
        assert pool["simulated"] is True
        assert [(n["name"], n["group"], len(n["gpus"]), n["pools"]) for n in pool["nodes"]] == [
            ("node-a", "rack1", 8, ["build", "train"]), ("node-b", "rack1", 8, ["build", "train"]),
            ("node-c", "", 4, ["build", "train"])]
        text = gpus_table(pool)  # what gpupool status prints
        assert "node-a (rack1)" in text and "node-b (rack1)" in text and "node-c " in text
        assert text.count("A100-80GB") == 16 and text.count("T4") == 4
    finally:
        await core.stop()
