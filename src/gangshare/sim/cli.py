"""`gangshare simulate`: replay a trace through gangshare.core, policies side by side.

    gangshare simulate --trace ../shared/traces/philly/philly_jobs.csv \\
        --cluster examples/clusters/philly-helios-3of8.yaml \\
        --policy fifo --policy multi-queue,backfill,antman --seed 1 --out sim-out/philly

With --metrics-out FILE (one policy), the replay's operator and per-GPU series are also
written as OpenMetrics text for promtool to backfill and Grafana to show (docs/simulator.md).

Bad input (a missing file, a bad column, an unknown policy) ends with one line
naming the flag or field, and exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gangshare.core.coordinator import ControlParams
from gangshare.core.spec import SpecError
from gangshare.sim.clusters import load_sim_cluster
from gangshare.sim.colocation import ColocationError, load_colocation
from gangshare.sim.config import (
    DEFAULT_CHECKPOINT_INTERVAL,
    DEFAULT_MAX_EVICTIONS,
    DEFAULT_RECLAIM_MIN_RUNTIME,
    DEFAULT_RESTART_OVERHEAD,
    DEFAULT_STARVATION,
    SimConfig,
)
from gangshare.sim.openmetrics import DEFAULT_STEP_SECONDS, ReplayMetrics
from gangshare.sim.outputs import NEVER_HELD, never_held, write_outputs
from gangshare.sim.policy import PolicyError, parse_policy
from gangshare.sim.progress import ProgressBar
from gangshare.sim.run import DEFAULT_OPPORTUNISTIC_FRACTION, RunResult, simulate
from gangshare.sim.trace import TraceError, load_trace

# The repository sits beside ../shared, which holds the public traces (never copied in).
REPO_ROOT = Path(__file__).resolve().parents[3]
TRACES = REPO_ROOT.parent / "shared" / "traces"
COLOCATION = TRACES / "lucid-colocation"


class UsageError(ValueError):
    pass


def add_simulate_command(commands: Any) -> None:
    sim = commands.add_parser(
        "simulate",
        help="replay a job trace through the scheduling core with virtual time",
        description="Replay a trace (Philly jobs, Alibaba 2023 pods or a generic CSV) through "
        "gangshare.core on a cluster spec and report JCT, queueing, utilization and fairness.",
    )
    sim.add_argument("--trace", type=Path, required=True, help="trace CSV (format auto-detected)")
    sim.add_argument(
        "--cluster",
        type=Path,
        required=True,
        help="cluster spec YAML (nodePools, queues) or an Alibaba node list CSV",
    )
    sim.add_argument(
        "--cluster-fraction",
        type=float,
        default=1.0,
        help="keep this share of each GPU-model group of a node list CSV",
    )
    sim.add_argument(
        "--policy",
        action="append",
        help="comma-separated policies (fifo, priority, qssf, sjf-oracle, multi-queue, "
        "fair-share, backfill, antman, cohort, pool, oracle-runtimes); repeat to compare "
        "(default: fifo)",
    )
    sim.add_argument("--seed", type=int, default=0, help="seed for class, priority, workload draws")
    sim.add_argument("--out", type=Path, default=Path("sim-out"), help="output directory")
    sim.add_argument("--window", help="Philly only: START,END dates (YYYY-MM-DD[ HH:MM:SS], UTC)")
    sim.add_argument("--limit", type=int, help="replay only the first N jobs")
    sim.add_argument("--colocation", type=Path, default=COLOCATION, help="Lucid data directory")
    sim.add_argument(
        "--opportunistic-fraction",
        type=float,
        default=DEFAULT_OPPORTUNISTIC_FRACTION,
        help="Philly under antman: share of 1-GPU jobs drawn Opportunistic",
    )
    sim.add_argument("--tolerance", type=float, default=0.05, help="guaranteed slowdown allowed")
    sim.add_argument(
        "--control-period",
        type=float,
        default=ControlParams.period_seconds,
        help="the coordinator's decision period, s",
    )
    sim.add_argument(
        "--checkpoint-interval",
        type=float,
        default=DEFAULT_CHECKPOINT_INTERVAL,
        help="seconds of a run between two checkpoints, for jobs whose trace gives none: an "
        "eviction loses the work since the last one (0: none lost) "
        f"(default {DEFAULT_CHECKPOINT_INTERVAL:g})",
    )
    sim.add_argument(
        "--restart-overhead",
        type=float,
        default=DEFAULT_RESTART_OVERHEAD,
        help="seconds a run after an eviction holds its GPUs before progressing "
        f"(default {DEFAULT_RESTART_OVERHEAD:g})",
    )
    sim.add_argument(
        "--reclaim-min-runtime",
        type=float,
        default=DEFAULT_RECLAIM_MIN_RUNTIME,
        help="seconds a borrower runs before reclaim may evict it "
        f"(default {DEFAULT_RECLAIM_MIN_RUNTIME:g})",
    )
    sim.add_argument(
        "--max-evictions",
        default=str(DEFAULT_MAX_EVICTIONS).lower(),
        help="evictions after which a borrower is no longer reclaimed; 0: borrowers are never "
        f"reclaimed; 'none': no cap (default {DEFAULT_MAX_EVICTIONS})",
    )
    sim.add_argument(
        "--starvation",
        default=str(DEFAULT_STARVATION).lower(),
        help="seconds after which a head blocked by its queue's quota gets the quota outright "
        f"(backfill only); 'none': no bound (default {DEFAULT_STARVATION})",
    )
    sim.add_argument("--check-invariants", action="store_true", help="check state every event")
    sim.add_argument("--no-plots", action="store_true")
    sim.add_argument("--jobs-csv", action="store_true", help="also write one row per job")
    sim.add_argument("--no-progress", action="store_true")
    sim.add_argument(
        "--metrics-out",
        type=Path,
        help="also write the operator's and the GPUs' Prometheus series over the replay as "
        "OpenMetrics text (one --policy), for `promtool tsdb create-blocks-from openmetrics`",
    )
    sim.add_argument(
        "--metrics-step",
        type=float,
        help="simulated seconds between two samples of each series in --metrics-out "
        f"(default {DEFAULT_STEP_SECONDS:g}; at most 300, Prometheus's lookback)",
    )
    sim.add_argument(
        "--metrics-start",
        type=float,
        help="Unix time of the replay's first sample in --metrics-out (default: the replay "
        "ends now, so it shows in Grafana's last hours or days)",
    )
    sim.set_defaults(run=run_simulate)


def parse_starvation(text: str) -> float | None:
    """--starvation: seconds >= 0, or 'none' for no bound."""
    if text.strip().lower() == "none":
        return None
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < float("inf"):
        raise UsageError(f"--starvation: must be seconds >= 0 or 'none', got {text!r}")
    return value


def parse_max_evictions(text: str) -> int | None:
    """--max-evictions: a count >= 0, or 'none' for no cap."""
    if text.strip().lower() == "none":
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise UsageError(f"--max-evictions: must be a count >= 0 or 'none', got {text!r}")
    return value


def parse_window(text: str) -> tuple[datetime, datetime]:
    parts = [p.strip() for p in text.split(",")]
    try:
        if len(parts) != 2:
            raise ValueError
        start, end = (datetime.fromisoformat(p).replace(tzinfo=UTC) for p in parts)
    except ValueError:
        raise UsageError(
            f"--window: expected START,END as YYYY-MM-DD[ HH:MM:SS], got {text!r}"
        ) from None
    if len(parts[1]) == 10:  # a bare date ends with its last second
        end = end.replace(hour=23, minute=59, second=59)
    if end < start:
        raise UsageError(f"--window: END is before START in {text!r}")
    return start, end


def _check(args: argparse.Namespace) -> None:
    if args.limit is not None and args.limit < 1:
        raise UsageError(f"--limit: must be at least 1, got {args.limit}")
    if not 0 <= args.opportunistic_fraction <= 1:
        raise UsageError(
            f"--opportunistic-fraction: must be in [0, 1], got {args.opportunistic_fraction}"
        )
    if not 0 < args.tolerance < 1:
        raise UsageError(f"--tolerance: must be in (0, 1), got {args.tolerance}")
    if args.control_period <= 0:
        raise UsageError(f"--control-period: must be positive, got {args.control_period}")
    args.max_evictions = parse_max_evictions(str(args.max_evictions))
    args.starvation = parse_starvation(str(args.starvation))
    for flag in ("checkpoint_interval", "restart_overhead", "reclaim_min_runtime"):
        value = getattr(args, flag)
        if not 0 <= value < float("inf"):
            raise UsageError(
                f"--{flag.replace('_', '-')}: must be a non-negative number of seconds, got {value}"
            )
    if args.metrics_out is None:
        if args.metrics_step is not None or args.metrics_start is not None:
            raise UsageError("--metrics-step, --metrics-start: only apply with --metrics-out")
        return
    if len(args.policy or ["fifo"]) != 1:
        raise UsageError(
            f"--metrics-out: takes one --policy (the series have no policy label), "
            f"got {len(args.policy)}"
        )
    if args.metrics_step is None:
        args.metrics_step = DEFAULT_STEP_SECONDS
    if not 0 < args.metrics_step <= 300:
        raise UsageError(
            "--metrics-step: must be in (0, 300] (Prometheus's 5-minute lookback), "
            f"got {args.metrics_step}"
        )
    if args.metrics_start is not None and args.metrics_start < 0:
        raise UsageError(f"--metrics-start: must be a Unix time, got {args.metrics_start}")


def run_simulate(args: argparse.Namespace) -> int:
    try:
        _check(args)
        policies = [parse_policy(p) for p in args.policy or ["fifo"]]
        window = parse_window(args.window) if args.window else None
        trace = load_trace(args.trace, window)
        if args.limit:
            trace = trace.head(args.limit)
        setup = load_sim_cluster(args.cluster, args.cluster_fraction)
        model = load_colocation(args.colocation)
    except (UsageError, PolicyError, TraceError, SpecError, ColocationError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    config = SimConfig(
        tolerance=args.tolerance,
        control_period=args.control_period,
        check_invariants=args.check_invariants,
        checkpoint_interval=args.checkpoint_interval,
        restart_overhead=args.restart_overhead,
        reclaim_min_runtime=args.reclaim_min_runtime,
        max_evictions=args.max_evictions,
        starvation=args.starvation,
    )
    show = not args.no_progress and sys.stderr.isatty()
    results: list[RunResult] = []
    recorder = ReplayMetrics(args.metrics_step) if args.metrics_out is not None else None
    for policy in policies:
        bar = ProgressBar(len(trace.jobs), f"{policy.name:<32}") if show else None
        result = simulate(
            trace,
            lambda: load_sim_cluster(args.cluster, args.cluster_fraction),
            policy,
            model,
            args.seed,
            config,
            args.opportunistic_fraction,
            bar,
            recorder,
        )
        if bar is not None:
            bar.close()
        results.append(result)
    header = {
        "trace": f"{args.trace.name} ({trace.kind}, {len(trace.jobs):,} jobs)",
        "dropped rows": trace.dropped or "none",
        **({"jobs pinned to GPU models (gpu_spec)": trace.pinned} if trace.pinned else {}),
        "cluster": setup.description,
        "seed": args.seed,
        "opportunistic fraction (Philly)": args.opportunistic_fraction,
        "guaranteed tolerance": args.tolerance,
        "control period (s)": args.control_period,
        "checkpoint interval (s)": args.checkpoint_interval,
        "restart overhead (s)": args.restart_overhead,
        "reclaim minimum run time (s)": args.reclaim_min_runtime,
        "evictions per job before reclaim stops": (
            "no cap" if args.max_evictions is None else args.max_evictions
        ),
        "starvation bound (s)": "none" if args.starvation is None else args.starvation,
    }
    written = write_outputs(args.out, header, results, not args.no_plots, args.jobs_csv)
    if recorder is not None:
        start = recorder.write(args.metrics_out, args.metrics_start)
        written.append(args.metrics_out)
        end = start + recorder.span
        print(
            f"metrics: {len(recorder.times):,} samples every {args.metrics_step:g} s, "
            f"{datetime.fromtimestamp(start, UTC):%Y-%m-%d %H:%M:%S} to "
            f"{datetime.fromtimestamp(end, UTC):%Y-%m-%d %H:%M:%S} UTC "
            f"(--metrics-start {start:.0f}, end {end:.0f})"
        )
    dropped = ", ".join(f"{n:,} {why}" for why, n in trace.dropped.items()) or "none"
    print(f"{args.trace.name}: {len(trace.jobs):,} jobs replayed; dropped rows: {dropped}")
    for result in results:
        s = result.summary
        print(
            f"{result.policy:<36} avg JCT {s['jct']['mean']:>10,.0f} s  "
            f"avg queueing {s['queueing']['mean']:>9,.0f} s  "
            f"({result.wall_seconds:.1f} s, {result.events / max(result.wall_seconds, 1e-9):,.0f} "
            "events/s)"
        )
        print(
            f"{'':<36} evictions {s['evictions']:,} (most on one job "
            f"{s['max_evictions_per_job']:,}), GPU-time lost to them "
            f"{s['eviction_gpu_hours_lost']:,.1f} GPU-h = {s['eviction_lost_share']:.2%} "
            "of GPU-time held"
        )
        if result.rejected:
            print(f"  {NEVER_HELD}: {never_held(result)}")
    print(f"wrote {', '.join(str(p) for p in written)}")
    return 0
