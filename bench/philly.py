"""Quotas on the Philly trace: static partitions vs pooled FIFO vs our policy.

Replays a busy window of Microsoft's Philly trace with each virtual cluster
(team) as a project whose guaranteed training quota is its share of
``philly_vc.csv``'s nodes, on a cluster sized so that teams contend, and
prints one row per policy: average and p99 job completion time, average
queueing delay, utilization, pauses, GPU-hours lost to pauses and guarantee
violations. ``--json`` prints one JSON object instead.

By default every job runs on one node and jobs wider than a node are left out
(counted): the replay the Philly figures of docs/benchmarks.md (and the first
tables of docs/benchmarks-history.md) were measured with. ``--real-sizes``
keeps every job at its trace GPU count: a job wider than a node runs as a
multi-node gang of identical replicas (bench.sim.gangs: 16
GPUs = 2 x 8, 12 GPUs = 2 x 6), on a cluster whose nodes sit in racks of
``--rack-nodes`` (node groups, so topology matters to the engine), and a job
that a policy can never run (wider than the cluster, or than its team's static
partition) is reported as such, per policy, never dropped. It adds a second
table: average JCT and its ratio to static partitions on the jobs both ran,
queueing delay percentiles of all jobs and of large ones (>= ``--large-gpus``),
violations in seconds and GPU-hours, and the jobs never run.

    python -m bench.philly                      # busiest 7-day window, cluster sized for ~90% load
    python -m bench.philly --start 2017-10-19 --days 7 --gpus 480 --checkpoint-interval 1800 --json
    python -m bench.philly --real-sizes --start 2017-10-19 --days 7 --gpus 480
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import platform
import sys
import time
import traceback
from collections import Counter
from dataclasses import replace
from pathlib import Path

from bench.sim import baselines
from bench.sim.cluster import partitioned_cluster, projects_for, shared_cluster
from bench.sim.gangs import replica_shape
from bench.sim.metrics import Summary, per_team_jct_h, summarize
from bench.sim.simulator import ScheduleFn, SimConfig, Simulator
from bench.sim.trace import (
    Window,
    busiest_window,
    cut_window,
    daily_demand,
    format_time,
    load_jobs,
    load_vc_sizes,
    offered_load,
    parse_time,
    proportional_guarantees,
)
from gpupool.policy.model import PolicyConfig

DEFAULT_TRACE_DIR = Path(__file__).resolve().parents[2] / "shared" / "traces" / "philly"
POLICIES = ("static", "fifo", "fifo-strict", "engine", "engine-decay")
POLICY_TITLES = {
    "static": "static partitions (FIFO+backfill per team)",
    "fifo": "pooled FIFO with backfill, no quotas",
    "fifo-strict": "pooled strict FIFO, no quotas",
    "engine": "our policy (gpupool.policy.schedule)",
    "engine-decay": "our policy with recent usage decayed by --half-life-h (fair share over time)",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m bench.philly", description=__doc__.split("\n\n")[0])
    p.add_argument("--trace-dir", type=Path, default=DEFAULT_TRACE_DIR, help="folder with philly.csv and philly_vc.csv")
    p.add_argument("--start", help="window start, YYYY-MM-DD[ HH:MM:SS] UTC (default: the busiest window)")
    p.add_argument("--days", type=float, default=7.0, help="window length in days (default 7)")
    p.add_argument("--gpus", type=int, help="cluster size in GPUs (default: sized for --target-load)")
    p.add_argument("--target-load", type=float, default=0.9, help="offered load / capacity when sizing (default 0.9)")
    p.add_argument("--gpus-per-node", type=int, default=8)
    p.add_argument("--cycle", type=float, default=60.0, help="scheduling cycle in seconds (default 60)")
    p.add_argument("--checkpoint-interval", type=float, default=1800.0,
                   help="seconds of run time between checkpoints; a paused job loses the work since its last one (default 1800; 0 = checkpoint on pause)")
    p.add_argument("--guaranteed", type=float, default=1.0,
                   help="fraction of the cluster the pooled policies guarantee (default 1: every GPU; static "
                        "partitions always split the whole cluster)")
    p.add_argument("--half-life-h", type=float, default=24.0,
                   help="usage half-life of engine-decay, in hours (default 24; the service's default is 168)")
    p.add_argument("--policies", default=",".join(POLICIES), help=f"comma-separated subset of {','.join(POLICIES)}")
    p.add_argument("--real-sizes", action="store_true",
                   help="keep jobs wider than a node, as multi-node gangs of replicas (default: leave them out, "
                        "the replay of the Philly figures in docs/benchmarks.md)")
    p.add_argument("--rack-nodes", type=int, default=4,
                   help="with --real-sizes: nodes per rack (node group); 0 = no racks (default 4)")
    p.add_argument("--max-reservations", type=int, default=PolicyConfig().max_reservations,
                   help="the engine's PolicyConfig.max_reservations: starving jobs that may hold a node "
                        "reservation per cycle (default: the policy's default)")
    p.add_argument("--large-gpus", type=int, default=16,
                   help="with --real-sizes: jobs of at least this many GPUs count as large (default 16)")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = p.parse_args(argv)
    chosen = [x.strip() for x in args.policies.split(",") if x.strip()]
    unknown = [x for x in chosen if x not in POLICIES]
    if unknown or not chosen:
        p.error(f"unknown policy {unknown}; choose from {', '.join(POLICIES)}")
    args.policies = chosen
    if not 0 <= args.guaranteed <= 1:
        p.error("--guaranteed must be between 0 and 1")
    if args.half_life_h <= 0:
        p.error("--half-life-h must be positive (engine is the policy without history)")
    if args.days <= 0 or args.cycle <= 0 or args.checkpoint_interval < 0 or args.gpus_per_node < 1:
        p.error("--days, --cycle and --gpus-per-node must be positive, --checkpoint-interval >= 0")
    if args.gpus is not None and args.gpus < args.gpus_per_node:
        p.error("--gpus must be at least one node")
    if args.rack_nodes < 0 or args.large_gpus < 1 or args.max_reservations < 0:
        p.error("--rack-nodes and --max-reservations must be >= 0, --large-gpus >= 1")
    if not args.real_sizes:
        args.rack_nodes = 0  # the one-node replay is measured without racks, as it was recorded
    return args


def engine_schedule() -> ScheduleFn:
    """The engine as the service runs it: one PolicyCache carried through the replay's cycles."""
    from gpupool.policy import (
        PolicyCache,
        engine,  # noqa: F401  (fail here, clearly, if the engine is missing)
        schedule,
    )

    cache = PolicyCache()
    return lambda snapshot: schedule(snapshot, cache)


def run(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    trace_csv = args.trace_dir / "philly.csv"
    vc_csv = args.trace_dir / "philly_vc.csv"
    if not trace_csv.is_file() or not vc_csv.is_file():
        print(f"bench.philly: cannot find {trace_csv} and {vc_csv} (see ../shared/README.md)", file=sys.stderr)
        return 2
    t_load = time.perf_counter()
    jobs = load_jobs(trace_csv)
    vcs = load_vc_sizes(vc_csv)
    gpn = args.gpus_per_node
    widest = None if args.real_sizes else gpn  # the widest job kept
    try:
        start = parse_time(args.start) if args.start else busiest_window(jobs, math.ceil(args.days), vcs, widest)
    except ValueError as exc:
        print(f"bench.philly: {exc}", file=sys.stderr)
        return 2
    window = cut_window(jobs, start, args.days, vcs, widest)
    if not window.jobs:
        print(f"bench.philly: no jobs submitted in the window starting {format_time(start)}", file=sys.stderr)
        return 2
    load = offered_load(window.jobs, window.start, window.end)
    gpus = args.gpus or max(gpn, gpn * math.ceil(load / args.target_load / gpn))
    if gpus % gpn:
        print(f"bench.philly: --gpus {gpus} is not a multiple of --gpus-per-node {gpn}", file=sys.stderr)
        return 2
    partitions = proportional_guarantees(vcs, gpus)  # static: each team's own nodes
    guarantees = proportional_guarantees(vcs, round(gpus * args.guaranteed))  # the pooled policies' quotas
    too_small = {t: g for t, g in partitions.items() if g < gpn}
    if too_small:
        print(f"bench.philly: a {gpus}-GPU cluster leaves teams {too_small} a partition narrower than one "
              f"{gpn}-GPU job; use at least {gpn * math.ceil(gpn * sum(vcs.values()) / min(vcs.values()) / gpn)} GPUs",
              file=sys.stderr)
        return 2
    load_s = time.perf_counter() - t_load

    sim_cfg = SimConfig(
        cycle_s=args.cycle,
        checkpoint_interval_s=args.checkpoint_interval,
        measure_start=window.start,
        measure_end=window.end,
        policy_config=PolicyConfig(max_reservations=args.max_reservations),
        gang_width=gpn if args.real_sizes else 0,
    )
    projects = projects_for(guarantees)
    partition_projects = projects_for(partitions)
    summaries: list[Summary] = []
    team_jct: dict[str, dict[str, float]] = {}
    team_violation: dict[str, dict[str, dict[str, float]]] = {}
    job_jct: dict[str, dict[str, float]] = {}  # policy -> job id -> JCT (s), jobs it ran
    large_jobs: dict[str, list[dict[str, object]]] = {}  # policy -> each large job's wait (who waited, how long)
    episodes: dict[str, list[dict[str, object]]] = {}  # policy -> its 20 longest literal violation episodes
    failures: dict[str, str] = {}
    for name in args.policies:
        nodes = shared_cluster(gpus // gpn, gpn, args.rack_nodes)
        cfg = sim_cfg
        try:
            if name == "static":
                nodes, owner = partitioned_cluster(partitions, gpn, args.rack_nodes)
                fn = baselines.static_partitions(owner, backfill=True)
                cfg = _time_invariant(sim_cfg)
            elif name in ("fifo", "fifo-strict"):
                fn = baselines.pooled_fifo(backfill=name == "fifo")
                cfg = _time_invariant(sim_cfg)
            else:
                fn = engine_schedule()
                if name == "engine-decay":
                    cfg = replace(sim_cfg, usage_half_life_s=args.half_life_h * 3600.0)
            if not args.json:
                print(f"... {POLICY_TITLES[name]}", file=sys.stderr, flush=True)
            result = Simulator(window.jobs, nodes, partition_projects if name == "static" else projects, fn, cfg).run()
        except Exception as exc:  # one failing policy must not hide the others' rows
            failures[name] = f"{type(exc).__name__}: {exc}"
            if not args.json:
                traceback.print_exc(file=sys.stderr)
            continue
        summaries.append(summarize(name, result, window.start, args.large_gpus))
        team_jct[name] = per_team_jct_h(result)
        team_violation[name] = {"issue": result.violation_s, "gang_aware": result.violation_gang_s}
        job_jct[name] = {r.trace.id: r.jct for r in result.jobs if r.never is None}
        large_jobs[name] = [
            {"id": r.trace.id, "gpus": r.trace.gpus, "team": r.trace.team, "submit": format_time(r.trace.submit),
             "queue_h": None if r.first_start is None else r.queueing / 3600, "pauses": r.pauses, "never": r.never}
            for r in result.jobs if r.trace.gpus >= args.large_gpus
        ]
        longest = sorted(((p, e) for p, log in result.violation_log.items() for e in log), key=lambda pe: -pe[1].seconds)
        episodes[name] = [{"project": p, "start": format_time(e.start), "seconds": e.seconds, "guarantee": e.guarantee,
                           "held": e.held, "pending_job_gpus": {str(k): v for k, v in e.pending.items()}}
                          for p, e in longest[:20]]

    context = _context(args, window, load, gpus, guarantees, load_s)
    vs_static = vs_static_same_jobs(job_jct)
    if args.json:
        extra = {"vs_static_same_jobs": vs_static, "large_job_waits": large_jobs,
                 "longest_violations": episodes} if args.real_sizes else {}
        print(json.dumps({**context, "results": [s.as_dict() for s in summaries],
                          "avg_jct_h_per_team": team_jct, "violation_s_per_team": team_violation,
                          **extra, "failures": failures}, indent=1))
    else:
        _print_report(context, summaries, failures)
        if args.real_sizes:
            print_real_sizes(context, summaries, vs_static)
    return 1 if failures else 0


def vs_static_same_jobs(job_jct: dict[str, dict[str, float]]) -> dict[str, dict[str, float]]:
    """Per policy: static's average JCT over its own, on the jobs both ran (a job static can never run
    would otherwise flatter static by leaving the widest jobs out of its average)."""
    static = job_jct.get("static")
    out: dict[str, dict[str, float]] = {}
    if static is None:
        return out
    for name, jct in job_jct.items():
        common = sorted(static.keys() & jct.keys())
        if not common:
            continue
        mine = sum(jct[j] for j in common) / len(common)
        theirs = sum(static[j] for j in common) / len(common)
        out[name] = {"jobs": len(common), "static_avg_jct_h": theirs / 3600, "avg_jct_h": mine / 3600,
                     "ratio": theirs / mine if mine > 0 else math.inf}
    return out


def print_real_sizes(ctx: dict[str, object], rows: list[Summary], vs: dict[str, dict[str, float]]) -> None:
    """The second table of ``--real-sizes``: what multi-node gangs change, per policy."""
    large = rows[0].large_gpus if rows else 16
    print()
    print(f"real job sizes: {ctx['gang_jobs']} jobs wider than {ctx['gpus_per_node']} GPUs run as gangs "
          f"({', '.join(f'{n} x {k}' for k, n in ctx['gang_shapes'].items()) or 'none'}); racks of "
          f"{ctx['rack_nodes']} nodes; {ctx['large_jobs']} jobs of >= {large} GPUs")
    print(f"{'policy':<13}{'avg JCT h':>10}{'vs static':>10}{'queue p50/p95 h':>17}"
          f"{f'>={large} GPUs: n, queue p50/p95/max h':>38}{'util':>7}{'pauses':>8}"
          f"{'viol n/s/GPUh':>20}{'gang-aware n/s/GPUh':>22}{'never ran (GPUh)':>18}{'gang runs (>1 rack)':>21}")
    for r in rows:
        ratio = vs.get(r.policy, {}).get("ratio")
        big = (f"{r.large_jobs}, {r.large_queue_p50_h:.2f}/{r.large_queue_p95_h:.2f}/{r.large_queue_max_h:.2f}"
               if r.large_jobs else "0")
        print(f"{r.policy:<13}{r.avg_jct_h:>10.2f}{(f'{ratio:.2f}x' if ratio else '-'):>10}"
              f"{f'{r.queue_p50_h:.2f}/{r.queue_p95_h:.2f}':>17}{big:>38}{100 * r.utilization:>6.1f}%"
              f"{r.pauses:>8}{f'{r.violation_episodes}/{r.violation_s:.0f}/{r.violation_gpu_h:.1f}':>20}"
              f"{f'{r.violation_gang_episodes}/{r.violation_gang_s:.0f}/{r.violation_gang_gpu_h:.1f}':>22}"
              f"{f'{r.never_ran} ({r.never_ran_gpu_h:.0f})':>18}"
              f"{f'{r.gang_runs} ({r.gang_runs_across_racks})':>21}")
    for r in rows:
        for line in r.never_ran_reasons:
            print(f"  never ran under {r.policy}: {line}")
    if "static" in vs and "engine" in vs:
        e = vs["engine"]
        print(f"engine vs static on the {e['jobs']} jobs both ran: average JCT {e['static_avg_jct_h']:.2f} h -> "
              f"{e['avg_jct_h']:.2f} h, {e['ratio']:.2f}x lower")


def _time_invariant(cfg: SimConfig) -> SimConfig:
    return replace(cfg, time_invariant_policy=True)


def _context(args: argparse.Namespace, window: Window, load: float, gpus: int,
             guarantees: dict[str, int], load_s: float) -> dict[str, object]:
    team_load = {
        team: offered_load([j for j in window.jobs if j.team == team], window.start, window.end)
        for team in guarantees
    }
    wide = [j for j in window.jobs if j.gpus > args.gpus_per_node]
    shapes = Counter(f"{r} x {g}" for r, g in (replica_shape(j.gpus, args.gpus_per_node) for j in wide))
    return {
        "real_sizes": args.real_sizes,
        "gang_jobs": len(wide),
        "gang_shapes": dict(sorted(shapes.items(), key=lambda kv: -kv[1])),
        "large_jobs": sum(1 for j in window.jobs if j.gpus >= args.large_gpus),
        "rack_nodes": args.rack_nodes,
        "window_start": format_time(window.start),
        "window_end": format_time(window.end),
        "days": window.days,
        "jobs": len(window.jobs),
        "excluded_jobs": dict(window.excluded),
        "excluded_gpu_h": {k: v / 3600 for k, v in window.excluded_gpu_s.items()},
        "offered_load_gpus": load,
        "cluster_gpus": gpus,
        "gpus_per_node": args.gpus_per_node,
        "offered_load_fraction": load / gpus,
        "cycle_s": args.cycle,
        "half_life_h": args.half_life_h,
        "max_reservations": args.max_reservations,
        "guaranteed_fraction": args.guaranteed,
        "checkpoint_interval_s": args.checkpoint_interval,
        "guarantee_gpus": guarantees,
        "team_offered_load_gpus": team_load,
        "daily_demand_gpu_days": dict(daily_demand(list(window.jobs), window.start, window.end)),
        "trace_load_s": load_s,
        "policy_source_sha256": _policy_source_hash(),
        "python": platform.python_version(),
    }


def _policy_source_hash() -> str:
    """Hash of gpupool/policy/*.py: which engine the numbers belong to, committed or not."""
    digest = hashlib.sha256()
    folder = Path(__file__).resolve().parents[1] / "scheduler" / "policy"
    for path in sorted(folder.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:16]


def _print_report(ctx: dict[str, object], rows: list[Summary], failures: dict[str, str]) -> None:
    print(f"Philly window {ctx['window_start']} .. {ctx['window_end']} UTC ({ctx['days']:g} days): "
          f"{ctx['jobs']} jobs; excluded {ctx['excluded_jobs'] or 'none'}")
    print(f"cluster {ctx['cluster_gpus']} GPUs ({ctx['cluster_gpus'] // ctx['gpus_per_node']} nodes x "
          f"{ctx['gpus_per_node']}); offered load {ctx['offered_load_gpus']:.0f} GPUs = "
          f"{100 * ctx['offered_load_fraction']:.0f}% of capacity; cycle {ctx['cycle_s']:g} s; "
          f"checkpoint every {ctx['checkpoint_interval_s']:g} s of run time")
    guarantees = ctx["guarantee_gpus"]
    team_load = ctx["team_offered_load_gpus"]
    print("team        guarantee  offered load (GPUs)")
    for team, g in guarantees.items():
        print(f"  {team:<10}{g:>8}  {team_load[team]:>10.1f}")
    header = (f"{'policy':<12}{'avg JCT h':>10}{'p99 JCT h':>10}{'avg queue h':>12}{'util':>7}"
              f"{'pauses':>8}{'lost GPUh':>10}{'viol s':>10}{'viol(gang) s':>13}{'Jain/day mean,min':>18}"
              f"{'call ms mean/p99/max':>24}{'wall s':>8}")
    print(header)
    for r in rows:
        calls = f"{r.call_ms_mean:.2f}/{r.call_ms_p99:.1f}/{r.call_ms_max:.1f}"
        print(f"{r.policy:<12}{r.avg_jct_h:>10.2f}{r.p99_jct_h:>10.1f}{r.avg_queue_h:>12.2f}"
              f"{100 * r.utilization:>6.1f}%{r.pauses:>8}{r.lost_gpu_h:>10.1f}{r.violation_s:>10.0f}"
              f"{r.violation_gang_s:>13.0f}{f'{r.fairness_daily_mean:.3f},{r.fairness_daily_min:.3f}':>18}"
              f"{calls:>24}{r.wall_s:>8.1f}")
    by_name = {r.policy: r for r in rows}
    if "static" in by_name and "engine" in by_name:
        s, e = by_name["static"], by_name["engine"]
        print(f"engine vs static: average JCT {s.avg_jct_h / e.avg_jct_h:.2f}x lower; "
              f"guarantee violations {e.violation_s:.0f} s (gang-aware {e.violation_gang_s:.0f} s)")
    if "engine" in by_name and "engine-decay" in by_name:
        e, d = by_name["engine"], by_name["engine-decay"]
        print(f"engine-decay (half-life {ctx['half_life_h']:g} h) vs engine: daily fairness (Jain) "
              f"{d.fairness_daily_mean:.3f} vs {e.fairness_daily_mean:.3f}; average JCT "
              f"{100 * (d.avg_jct_h / e.avg_jct_h - 1):+.1f}%; guarantee violations {d.violation_s:.0f} s")
    print(f"policy sources sha256 {ctx['policy_source_sha256']}")
    for name, err in failures.items():
        print(f"FAILED {name}: {err}")


def main() -> None:
    sys.exit(run())


if __name__ == "__main__":
    main()
