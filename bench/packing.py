"""Packing benchmark: GPU allocation ratio on Alibaba's openb trace (FGD, ATC'23 protocol).

Run from the project root::

    python -m bench.packing --nodes ../shared/traces/openb/openb_node_list_gpu_node.csv \\
        --pods ../shared/traces/openb/openb_pod_list_default.csv --seeds 42-51 --policy default,bestfit

For each pod file and policy it prints the mean GPU allocation ratio at 100%
arrived demand (mean over seeds of the per-seed mean over the 99.5-100.5%
window) beside the FGD paper's published figure for that variant and policy
(from ``fgd-published.csv`` next to the pod file, when it has them). ``--json``
prints only ``{policy: ratio}`` (for several pod files ``{variant: {policy: ratio}}``).
The protocol itself is in :mod:`bench._openb`.
"""

from __future__ import annotations

import argparse
import csv
import json
import re
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from bench._openb import load_nodes, load_pods, run_seed
from gpupool.policy.placement import POLICIES

SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "traces" / "openb"
PUBLISHED_NAMES = {"bestfit": "BestFit", "fgd": "FGD", "random": "Random", "dotprod": "DotProd",
                   "gpuclustering": "GpuClustering", "gpupacking": "GpuPacking"}


def parse_seeds(text: str) -> list[int]:
    """``42-51``, ``42,45`` or a mix of both."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        m = re.fullmatch(r"(\d+)\s*-\s*(\d+)", part)
        if m:
            lo, hi = int(m.group(1)), int(m.group(2))
            if hi < lo:
                raise ValueError(f"seed range {part!r} runs backwards")
            seeds.extend(range(lo, hi + 1))
        elif part.isdigit():
            seeds.append(int(part))
        else:
            raise ValueError(f"bad seed {part!r}: use 42-51 or 42,43")
    if not seeds:
        raise ValueError("no seeds given")
    return seeds


def variant_of(pods: Path) -> str:
    """``openb_pod_list_<variant>.csv`` -> ``<variant>`` (else the file's stem)."""
    m = re.fullmatch(r"openb_pod_list_(.+)\.csv", pods.name)
    return m.group(1) if m else pods.stem


def load_published(*dirs: Path) -> dict[str, dict[str, float]]:
    """``fgd-published.csv`` as {variant: {column: ratio}} from the first dir that has it."""
    for d in dirs:
        path = d / "fgd-published.csv"
        if path.is_file():
            with open(path, newline="") as fh:
                return {row["workload"]: {k: float(v) for k, v in row.items() if k != "workload" and v}
                        for row in csv.DictReader(fh)}
    return {}


def _one(args: tuple[Path, Path, str, int]) -> tuple[float, int, int]:
    nodes_path, pods_path, policy, seed = args
    r = run_seed(load_nodes(nodes_path), load_pods(pods_path), policy, seed)
    return r.ratio, r.placed, r.dropped


def run_policy(nodes: Path, pods: Path, policy: str, seeds: list[int], jobs: int) -> tuple[list[float], float]:
    """Per-seed ratios for one policy on one pod file, and the wall time."""
    t0 = time.perf_counter()
    if jobs > 1:
        with ProcessPoolExecutor(max_workers=jobs) as ex:
            out = list(ex.map(_one, [(nodes, pods, policy, s) for s in seeds]))
    else:
        node_list, pod_list = load_nodes(nodes), load_pods(pods)
        out = [(r.ratio, r.placed, r.dropped) for r in (run_seed(node_list, pod_list, policy, s) for s in seeds)]
    return [o[0] for o in out], time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.packing", description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=Path, default=SHARED / "openb_node_list_gpu_node.csv")
    ap.add_argument("--pods", type=Path, nargs="+", default=[SHARED / "openb_pod_list_default.csv"])
    ap.add_argument("--seeds", default="42-51")
    ap.add_argument("--policy", default="default,bestfit", help=f"comma list of {', '.join(POLICIES)}")
    ap.add_argument("--jobs", type=int, default=1, help="worker processes (seeds in parallel)")
    ap.add_argument("--json", action="store_true", help="print only a JSON object {policy: mean ratio %%}")
    args = ap.parse_args(argv)
    try:
        seeds = parse_seeds(args.seeds)
        policies = [p.strip() for p in args.policy.split(",") if p.strip()]
        bad = [p for p in policies if p not in POLICIES]
        if bad or not policies:
            raise ValueError(f"unknown policy {', '.join(bad) or '(none)'}; known: {', '.join(POLICIES)}")
        for path in [args.nodes, *args.pods]:
            if not path.is_file():
                raise ValueError(f"cannot find {path} (the openb trace lives in ../shared/traces/openb)")
        load_nodes(args.nodes)  # fail fast on a malformed file
    except ValueError as exc:
        print(f"bench.packing: {exc}", file=sys.stderr)
        return 2
    results: dict[str, dict[str, float]] = {}
    for pods in args.pods:
        variant = variant_of(pods)
        published = load_published(pods.parent, args.nodes.parent).get(variant, {})
        results[variant] = {}
        rows = []
        for policy in policies:
            try:
                ratios, wall = run_policy(args.nodes, pods, policy, seeds, args.jobs)
            except ValueError as exc:
                print(f"bench.packing: {pods}: {exc}", file=sys.stderr)
                return 2
            mean = statistics.fmean(ratios)
            results[variant][policy] = round(mean, 3)
            pub = published.get(PUBLISHED_NAMES.get(policy, ""))
            rows.append((policy, mean, statistics.pstdev(ratios), min(ratios), max(ratios), pub, wall))
        if not args.json:
            _print_table(variant, pods, len(seeds), rows, published.get("FGD"))
    if args.json:
        print(json.dumps(results[variant_of(args.pods[0])] if len(args.pods) == 1 else results))
    return 0


def _print_table(variant: str, pods: Path, n_seeds: int, rows: list, fgd: float | None) -> None:
    print(f"\n{variant} ({pods.name}), {n_seeds} seeds: GPU allocation ratio (%) at 100% arrived demand")
    print(f"{'policy':<10} {'mean':>7} {'std':>5} {'min':>7} {'max':>7} {'published':>9} {'diff':>6} "
          f"{'vs FGD pub':>10} {'time s':>7}")
    for policy, mean, std, lo, hi, pub, wall in rows:
        pub_s = f"{pub:9.2f}" if pub is not None else f"{'-':>9}"
        diff_s = f"{mean - pub:+6.2f}" if pub is not None else f"{'':>6}"
        fgd_s = f"{mean - fgd:+10.2f}" if fgd is not None else f"{'-':>10}"
        print(f"{policy:<10} {mean:7.2f} {std:5.2f} {lo:7.2f} {hi:7.2f} {pub_s} {diff_s} {fgd_s} {wall:7.1f}")


if __name__ == "__main__":
    sys.exit(main())
