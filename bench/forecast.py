"""The cost of a start-time forecast: the pass's snapshot replayed forward through the cycle.

5,000 queued TrainingJobs (bench/operator_cycle.py's Philly-like size mix, declared run
times of 1 min to 1 day) on 500 nodes x 8 GPUs, half the GPUs held by running jobs. Times,
side by side on the same snapshot, the pass's own `schedule_cycle` and
`core.forecast.forecast_starts` for every queued job, for strict FIFO and for the full
stack (priority + multi-queue + backfill + fair share). The forecast runs on a copy of the
snapshot; the copy's time is part of it. Also prints how many cycles the replay ran and how
many jobs it starts within the horizon. Then shape advice (core/shape_advice.py) on the same
snapshot with every multi-GPU job allowing its other shapes (w*g x 1 and, for even g,
2w x g/2): what one round (8 replays, the operator's budget per forecast) adds to a forecast.

    .venv/bin/python bench/forecast.py [--jobs 5000] [--nodes 500] [--repeats 3] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from gangshare.core.cycle import schedule_cycle
from gangshare.core.forecast import forecast_starts
from gangshare.core.queueing import Ordering, QueuedJob, QueuePolicy
from gangshare.core.shape_advice import advise_shapes
from gangshare.kube.snapshot import build_snapshot, parse_time
from gangshare.kube.trainingjob import parse_trainingjob
from operator_cycle import workload

NOW = 1_795_400_000.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=5000)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="cProfile one full-stack forecast")
    args = parser.parse_args()
    node_objs, jobs = workload(args.nodes, args.jobs)
    pending = [
        parse_trainingjob(obj).queued(parse_time(obj["status"]["queuedAt"]) or 0.0)
        for obj in jobs
        if obj["status"]["phase"] == "Queued"
    ]
    policies = {
        "strict FIFO": QueuePolicy(),
        "priority + multi-queue + backfill + fair share": QueuePolicy(
            Ordering.PRIORITY, small_job_max_gpus=2, backfill=True, fair_share=True
        ),
    }
    print(f"{len(pending):,} queued jobs on {args.nodes} nodes x 8 GPUs")
    for name, policy in policies.items():
        cycle_times, forecast_times = [], []
        started = cycles = 0
        for _ in range(args.repeats):
            snapshot = build_snapshot(node_objs, [], jobs)
            began = time.perf_counter()
            schedule_cycle(snapshot.cluster.copy(), pending, snapshot.running, policy, NOW)
            cycle_times.append(time.perf_counter() - began)
            counting = CountingCycle()
            began = time.perf_counter()
            out = forecast_starts(
                snapshot.cluster, pending, snapshot.running, policy, NOW, cycle=counting
            )
            forecast_times.append(time.perf_counter() - began)
            cycles = counting.calls
            started = sum(1 for f in out.values() if f.start is not None)
        cycle, forecast = statistics.median(cycle_times), statistics.median(forecast_times)
        print(f"\n{name}")
        print(f"  one cycle (the pass's decision)   {cycle:7.3f} s")
        print(f"  forecast of every queued job      {forecast:7.3f} s  ({forecast / cycle:.0f}x)")
        print(f"  replayed cycles {cycles}; jobs started within the horizon {started:,}")
        flexible = [with_other_shapes(job) for job in pending]
        advice_times, advised, tried = [], 0, 0
        for _ in range(args.repeats):
            snapshot = build_snapshot(node_objs, [], jobs)
            out = forecast_starts(snapshot.cluster, flexible, snapshot.running, policy, NOW)
            began = time.perf_counter()
            found = advise_shapes(snapshot.cluster, flexible, snapshot.running, policy, NOW, out)
            advice_times.append(time.perf_counter() - began)
            advised, tried = len(found.advice), len(found.tried)
        advising = statistics.median(advice_times)
        print(
            f"  shape advice, one round           {advising:7.3f} s  "
            f"({advising / forecast:.2f}x a forecast); {tried} jobs tried, {advised} advised"
        )
        if args.profile and policy.backfill:
            snapshot = build_snapshot(node_objs, [], jobs)
            profiler = cProfile.Profile()
            profiler.enable()
            forecast_starts(snapshot.cluster, pending, snapshot.running, policy, NOW)
            profiler.disable()
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)


def with_other_shapes(job: QueuedJob) -> QueuedJob:
    gang = job.gang
    if gang.companions or gang.total_gpus < 2:
        return job
    shapes = {(gang.total_gpus, 1)}
    if gang.gpus_per_worker % 2 == 0:
        shapes.add((gang.workers * 2, gang.gpus_per_worker // 2))
    shapes.discard((gang.workers, gang.gpus_per_worker))
    return replace(job, gang=replace(gang, alternative_shapes=tuple(sorted(shapes))))


class CountingCycle:
    """schedule_cycle, counted: how many cycles one forecast replays."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.calls += 1
        return schedule_cycle(*args, **kwargs)


if __name__ == "__main__":
    main()
