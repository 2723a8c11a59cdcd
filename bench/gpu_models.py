"""The simulator on a cluster of several GPU models where many queued jobs ask for the rare one.

Issue #39 kept aside an Alibaba 2023 replay (its `gpu_spec`, on a 1.1% sample of its nodes) on
which `multi-queue,backfill` ran at 21 events/s against 4,778 for `fifo`. This bench makes the
same shape from a generic trace (seeded, written to a temporary folder): `--common` nodes of 8
common GPUs and `--rare` nodes of 8 rare ones; jobs arrive over about `--hours`, loading the
common GPUs to about `--load`; a `--pinned` share of them name the rare model (gpu_spec), far
more than its nodes can run, so those pile up in the queue while the rest flow. Both policies
replay the same trace on the same cluster, one after the other in this process; it prints
wall time, events/s, cycles and the ratio to fifo's time (issue #39's target: within 3x).

    .venv/bin/python bench/gpu_models.py [--jobs 20000] [--policy multi-queue,backfill]
        [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import math
import pstats
import random
import tempfile
from pathlib import Path

from gangshare.sim.cli import TRACES
from gangshare.sim.clusters import load_sim_cluster
from gangshare.sim.colocation import load_colocation
from gangshare.sim.policy import parse_policy
from gangshare.sim.run import RunResult, simulate
from gangshare.sim.trace import load_trace


def write_inputs(folder: Path, args: argparse.Namespace) -> tuple[Path, Path]:
    cluster = folder / "cluster.yaml"
    cluster.write_text(
        "nodePools:\n"
        f"  - {{name: common, count: {args.common}, gpusPerNode: 8, gpuModel: A10,"
        " gpuMemoryMiB: 24576}\n"
        f"  - {{name: rare, count: {args.rare}, gpusPerNode: 8, gpuModel: H100,"
        " gpuMemoryMiB: 81920}\n"
    )
    rng = random.Random(args.seed)
    sizes, weights = (1, 2, 4, 8), (0.6, 0.2, 0.12, 0.08)
    mean_gpus = sum(s * w for s, w in zip(sizes, weights, strict=True))
    mean_run = 1800.0
    # Arrivals per second that keep the common GPUs about `load` busy with the unpinned jobs.
    rate = args.load * args.common * 8 / (mean_gpus * mean_run * (1 - args.pinned))
    rows = ["job_id,submit_time,duration,num_gpus,gpu_spec"]
    t = 0.0
    for i in range(args.jobs):
        t += rng.expovariate(rate)
        run = min(86400.0, rng.lognormvariate(math.log(mean_run) - 0.5, 1.0))
        gpus = rng.choices(sizes, weights)[0]
        spec = "H100" if rng.random() < args.pinned else ""
        rows.append(f"j{i},{t:.1f},{run:.1f},{gpus},{spec}")
    trace = folder / "trace.csv"
    trace.write_text("\n".join(rows) + "\n")
    return trace, cluster


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--common", type=int, default=60, help="nodes of the common model")
    parser.add_argument("--rare", type=int, default=2, help="nodes of the rare model")
    parser.add_argument("--pinned", type=float, default=0.3, help="share of jobs on the rare")
    parser.add_argument("--load", type=float, default=0.8)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--policy", action="append", help="default: multi-queue,backfill")
    parser.add_argument("--traces", type=Path, default=TRACES, help="../shared/traces")
    parser.add_argument("--profile", action="store_true", help="cProfile each policy but fifo")
    args = parser.parse_args()
    model = load_colocation(args.traces / "lucid-colocation")
    with tempfile.TemporaryDirectory() as folder:
        trace_path, cluster_path = write_inputs(Path(folder), args)
        trace = load_trace(trace_path)
        print(
            f"{len(trace.jobs):,} jobs, {trace.pinned:,} pinned to the rare model; "
            f"{load_sim_cluster(cluster_path).description}"
        )
        baseline: RunResult | None = None
        for name in ["fifo", *(args.policy or ["multi-queue,backfill"])]:
            policy = parse_policy(name)
            profiler = cProfile.Profile() if args.profile and name != "fifo" else None
            if profiler is not None:
                profiler.enable()
            result = simulate(trace, lambda: load_sim_cluster(cluster_path), policy, model, 1)
            if profiler is not None:
                profiler.disable()
            ratio = f"{result.wall_seconds / baseline.wall_seconds:.2f}x fifo" if baseline else ""
            print(
                f"{policy.name:<28} {result.wall_seconds:8.1f} s {result.events:>9,} events "
                f"{result.events / result.wall_seconds:>9,.0f} events/s "
                f"{result.counters.cycles:>8,} cycles  {ratio}",
                flush=True,
            )
            baseline = baseline or result
            if profiler is not None:
                out = io.StringIO()
                pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(30)
                print(out.getvalue())


if __name__ == "__main__":
    main()
