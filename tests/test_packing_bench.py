"""The packing benchmark's protocol math, on small hand-made openb-format files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from bench import packing
from bench._openb import (
    Pod,
    capacity_milli,
    load_nodes,
    load_pods,
    replay,
    replay_order,
    run_seed,
    window_mean,
)
from gpupool.policy.model import Request

NODES = "sn,cpu_milli,memory_mib,gpu,model\nn0,4000,16000,2,T4\n"
POD_HEADER = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_loading_maps_pods_to_requests(tmp_path: Path) -> None:
    pods = load_pods(write(tmp_path, "openb_pod_list_x.csv", POD_HEADER
                           + "a,1000,100,1,1000,,LS,Running,0,1,0\n"
                           + "b,2000,100,1,460,T4|V100M16,LS,Running,0,1,0\n"
                           + "c,3000,100,0,0,,LS,Running,0,1,0\n"
                           + "d,4000,100,8,1000,,LS,Running,0,1,0\n"))
    assert [p.request for p in pods] == [
        Request(gpus=1, cpu_milli=1000, memory_mib=100),
        Request(gpu_milli=460, gpu_models=frozenset({"T4", "V100M16"}), cpu_milli=2000, memory_mib=100),
        Request(cpu_milli=3000, memory_mib=100),
        Request(gpus=8, cpu_milli=4000, memory_mib=100),
    ]
    assert [p.gpu_milli for p in pods] == [1000, 460, 0, 8000]
    nodes = load_nodes(write(tmp_path, "nodes.csv", NODES))
    assert capacity_milli(nodes) == 2000 and nodes[0].gpus[1].model == "T4"


def test_hand_computed_replay_and_window() -> None:
    """One node, 2 GPUs, 4 cores; the third pod is dropped for lack of CPU."""
    from bench._openb import pod_request

    nodes = [load_nodes_text(NODES)][0]
    order = [
        Pod("a", pod_request(1, 1000, 3000, 0, ""), 1000),  # a whole GPU, 3 cores
        Pod("b", pod_request(1, 600, 500, 0, ""), 600),  # 0.6 GPU, 0.5 core: last CPU but 0.5
        Pod("c", pod_request(1, 400, 1000, 0, ""), 400),  # needs 1 core: dropped
        Pod("d", pod_request(1, 400, 500, 0, ""), 400),  # fits beside b
    ]
    arrived, allocated, placed = replay(nodes, order, "default")
    assert arrived.tolist() == [1000, 1600, 2000, 2400]
    assert allocated.tolist() == [1000, 1600, 1600, 2000]
    assert placed == 3
    # only k=3 has arrived demand in [99.5, 100.5): allocation there is 1600/2000
    assert window_mean(arrived, allocated, 2000) == pytest.approx(80.0)
    with pytest.raises(ValueError, match="never reached"):
        window_mean(arrived[:2], allocated[:2], 2000)
    # a pod that jumps over the window: the ratio just before it stands in
    assert window_mean(np.array([500, 1500]), np.array([500, 500]), 1000) == pytest.approx(50.0)


def load_nodes_text(text: str) -> list:
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        return load_nodes(write(Path(d), "n.csv", text))


def test_window_averages_every_prefix_in_range() -> None:
    arrived = np.array([990, 994, 995, 1000, 1004, 1005])  # capacity 1000 -> 99.0 ... 100.5 %
    allocated = np.array([900, 910, 920, 930, 940, 950])
    assert window_mean(arrived, allocated, 1000) == pytest.approx((92.0 + 93.0 + 94.0) / 3)


def test_replay_order_inflates_then_shuffles() -> None:
    pods = [Pod(f"p{k}", Request(gpu_milli=500), 500) for k in range(4)] + [Pod("cpu", Request(cpu_milli=1), 0)]
    order = replay_order(pods, 10_000, np.random.default_rng(7))
    total = sum(p.gpu_milli for p in order)
    assert 13_000 - 500 < total <= 13_000  # stops at the first draw that would pass 1.3x
    names = [p.name for p in order]
    assert all(names.count(f"p{k}") >= 1 for k in range(4)) and "cpu" in names
    assert order != sorted(order, key=lambda p: p.name)  # shuffled
    again = replay_order(pods, 10_000, np.random.default_rng(7))
    assert [p.name for p in again] == names


def test_replay_order_needs_gpu_pods() -> None:
    with pytest.raises(ValueError, match="no GPU pods"):
        replay_order([Pod("c", Request(cpu_milli=1), 0)], 1000, np.random.default_rng(0))


def test_replay_order_trims_to_the_limit() -> None:
    pods = [Pod(f"p{k}", Request(gpus=1), 1000) for k in range(20)]
    order = replay_order(pods, 10_000, np.random.default_rng(1))
    assert sum(p.gpu_milli for p in order) == 13_000
    assert len({p.name for p in order}) == 13  # removed, never duplicated


def small_trace(tmp_path: Path) -> tuple[Path, Path]:
    nodes = "sn,cpu_milli,memory_mib,gpu,model\n" + "".join(
        f"n{k},{32000 if k % 2 else 16000},65536,{8 if k % 3 == 0 else 2},{'G2' if k % 3 == 0 else 'T4'}\n"
        for k in range(12)
    )
    rows = []
    sizes = [(1, 1000, 8000), (1, 500, 2000), (1, 250, 1000), (2, 1000, 8000), (0, 0, 4000), (1, 810, 4000)]
    for k in range(60):
        g, m, c = sizes[k % len(sizes)]
        rows.append(f"p{k},{c},1024,{g},{m},,LS,Running,0,1,0\n")
    return write(tmp_path, "nodes.csv", nodes), write(tmp_path, "openb_pod_list_tiny.csv", POD_HEADER + "".join(rows))


def test_run_seed_is_deterministic_and_sane(tmp_path: Path) -> None:
    nodes_path, pods_path = small_trace(tmp_path)
    nodes, pods = load_nodes(nodes_path), load_pods(pods_path)
    for policy in ("default", "bestfit", "fgd"):
        r1 = run_seed(nodes, pods, policy, 3)
        r2 = run_seed(nodes, pods, policy, 3)
        assert r1 == r2
        assert 0 < r1.ratio <= 100.5
        assert r1.placed + r1.dropped == r1.pods


def test_cli_json_and_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    nodes_path, pods_path = small_trace(tmp_path)
    write(tmp_path, "fgd-published.csv", "workload,BestFit,FGD\ntiny,50.00,60.00\n")
    args = ["--nodes", str(nodes_path), "--pods", str(pods_path), "--seeds", "1-2", "--policy", "default,bestfit"]
    assert packing.main([*args, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"default", "bestfit"}
    nodes, pods = load_nodes(nodes_path), load_pods(pods_path)
    expect = np.mean([run_seed(nodes, pods, "bestfit", s).ratio for s in (1, 2)])
    assert out["bestfit"] == pytest.approx(expect, abs=1e-3)
    assert packing.main(args) == 0
    table = capsys.readouterr().out
    assert "tiny" in table and "50.00" in table  # BestFit's published figure beside ours


def test_cli_errors_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert packing.main(["--nodes", str(tmp_path / "none.csv"), "--pods", str(tmp_path / "x.csv")]) == 2
    assert "cannot find" in capsys.readouterr().err
    nodes_path, pods_path = small_trace(tmp_path)
    assert packing.main(["--nodes", str(nodes_path), "--pods", str(pods_path), "--policy", "magic"]) == 2
    assert "unknown policy" in capsys.readouterr().err
    assert packing.main(["--nodes", str(nodes_path), "--pods", str(pods_path), "--seeds", "9-1"]) == 2


def test_seed_parsing() -> None:
    assert packing.parse_seeds("42-44,50") == [42, 43, 44, 50]
    assert packing.variant_of(Path("openb_pod_list_gpushare40.csv")) == "gpushare40"
    with pytest.raises(ValueError):
        packing.parse_seeds("x")
