"""Replay speed of the simulator: the Philly job table under a policy stack, by trace length.

Replays the first N jobs of ../shared/traces/philly/philly_jobs.csv (N = 10k, 20k,
40k and all 82,247 by default) on the 3/8-size Helios cluster, one replay at a time
in this process, and prints wall time, events handled and events per second, and
how the time grows from one length to the next. Events are arrivals, completions,
control ticks and evictions.

    .venv/bin/python bench/simulator.py
    .venv/bin/python bench/simulator.py --policy fifo --sizes 82247 --profile
    .venv/bin/python bench/simulator.py --sizes 20000 --min-events-per-second 550   # the guard

With --min-events-per-second it exits 1 when the last replay of a policy handles fewer events
per second than that: the README gives the command and the figure measured on 2 cores, so a
slowdown of the full stack (#40: 3.5x, unseen for a week) shows the next time anyone runs it.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time
from pathlib import Path

from gangshare.sim.cli import REPO_ROOT, TRACES
from gangshare.sim.clusters import load_sim_cluster
from gangshare.sim.colocation import load_colocation
from gangshare.sim.policy import parse_policy
from gangshare.sim.run import RunResult, simulate
from gangshare.sim.trace import load_trace

FULL_STACK = "multi-queue,fair-share,backfill,antman"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--policy", action="append", help=f"default: {FULL_STACK}")
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 20_000, 40_000, 82_247])
    parser.add_argument(
        "--cluster", type=Path, default=REPO_ROOT / "examples/clusters/philly-helios-3of8.yaml"
    )
    parser.add_argument("--traces", type=Path, default=TRACES, help="../shared/traces")
    parser.add_argument("--profile", action="store_true", help="cProfile the largest replay")
    parser.add_argument(
        "--min-events-per-second",
        type=float,
        help="exit 1 when a policy's last replay is slower than this",
    )
    args = parser.parse_args()
    slow: list[str] = []

    began = time.perf_counter()
    trace = load_trace(args.traces / "philly/philly_jobs.csv")
    print(f"trace: {len(trace.jobs):,} jobs read in {time.perf_counter() - began:.1f} s")
    model = load_colocation(args.traces / "lucid-colocation")
    print(f"cluster: {load_sim_cluster(args.cluster).description}")
    for name in args.policy or [FULL_STACK]:
        policy = parse_policy(name)
        print(f"\npolicy {policy.name}")
        columns = ("jobs", "wall s", "events", "events/s", "cycles", "x time")
        print(" ".join(f"{c:>{w}}" for c, w in zip(columns, (8, 8, 9, 9, 8, 7), strict=True)))
        previous: RunResult | None = None
        for size in args.sizes:
            profiler = cProfile.Profile() if args.profile and size == max(args.sizes) else None
            part = trace.head(size)
            if profiler is not None:
                profiler.enable()
            result = simulate(part, lambda: load_sim_cluster(args.cluster), policy, model, seed=1)
            if profiler is not None:
                profiler.disable()
            growth = f"{result.wall_seconds / previous.wall_seconds:6.2f}x" if previous else ""
            print(
                f"{len(part.jobs):>8,} {result.wall_seconds:>8.1f} {result.events:>9,} "
                f"{result.events / result.wall_seconds:>9,.0f} {result.counters.cycles:>8,} "
                f"{growth:>7}",
                flush=True,
            )
            previous = result
            rate = result.events / result.wall_seconds
            floor = args.min_events_per_second
            if size == args.sizes[-1] and floor is not None and rate < floor:
                slow.append(f"{policy.name}: {rate:,.0f} events/s, below {floor:,.0f}")
            if profiler is not None:
                out = io.StringIO()
                pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(18)
                print(out.getvalue())
    if slow:
        print("\nSLOWER THAN THE FLOOR: " + "; ".join(slow))
        raise SystemExit(1)


if __name__ == "__main__":
    main()
