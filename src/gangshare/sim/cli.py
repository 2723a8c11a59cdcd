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
from gangshare.sim.engine import SimConfig
from gangshare.sim.openmetrics import DEFAULT_STEP_SECONDS, ReplayMetrics
from gangshare.sim.outputs import write_outputs
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
        "fair-share, backfill, antman, cohort, oracle-runtimes); repeat to compare (default: fifo)",
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
        "cluster": setup.description,
        "seed": args.seed,
        "opportunistic fraction (Philly)": args.opportunistic_fraction,
        "guaranteed tolerance": args.tolerance,
        "control period (s)": args.control_period,
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
    for result in results:
        s = result.summary
        print(
            f"{result.policy:<36} avg JCT {s['jct']['mean']:>10,.0f} s  "
            f"avg queueing {s['queueing']['mean']:>9,.0f} s  "
            f"({result.wall_seconds:.1f} s, {result.events / max(result.wall_seconds, 1e-9):,.0f} "
            "events/s)"
        )
    print(f"wrote {', '.join(str(p) for p in written)}")
    return 0
