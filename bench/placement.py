"""Placement latency of the core on large half-full clusters.

Plans one 4x8-GPU gang and one 1-GPU pod on clusters of 1,000 and 5,000 nodes x 8 GPUs
(two NVLink islands of 4, 40 nodes a rack), half of the GPUs held at random.
Baseline, measured in the same run: a kube-scheduler-style full scan that filters and
scores every node for the 1-GPU pod, versus the core's best-fit index.

    .venv/bin/python bench/placement.py [--repeats 300] [--sizes 1000 5000]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

from gangshare.core import (
    Cluster,
    GangPlan,
    GangRequest,
    Gpu,
    NodeState,
    ServiceClass,
    WorkerRequest,
    filter_worker,
    plan_gang,
    score_worker,
)

ISLANDS = ([0, 1, 2, 3], [4, 5, 6, 7])


def half_full_cluster(nodes: int, seed: int = 7) -> Cluster:
    rng = random.Random(seed)
    cluster = Cluster(
        NodeState.build(
            f"node-{i:05d}",
            [Gpu(g, f"GPU-{i}-{g}", "H100", 81920) for g in range(8)],
            ISLANDS,
            rack=f"rack-{i // 40:03d}",
        )
        for i in range(nodes)
    )
    for i, name in enumerate(cluster.nodes):
        used = rng.sample(range(8), rng.randint(0, 8))  # mean 4 of 8: half full
        if used:
            cluster.allocate(f"pre-{i}", f"pre-{i}/0", name, used, ServiceClass.GUARANTEED)
    return cluster


def full_scan_single_pod(cluster: Cluster, req: WorkerRequest) -> str | None:
    best: tuple[float, str] | None = None
    for node in cluster.nodes.values():
        if filter_worker(node, req) is None:
            key = (score_worker(node, req), node.name)
            if best is None or key[0] > best[0]:
                best = key
    return None if best is None else best[1]


def timed(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    fn()  # warm caches once, outside the measurement
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, int(len(samples) * 0.99))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=300)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000])
    args = parser.parse_args()
    gang = GangRequest("bench/gang", workers=4, gpus_per_worker=8)
    pod = GangRequest("bench/pod", workers=1, gpus_per_worker=1)
    print(f"{'nodes':>6} {'what':<34} {'p50 ms':>8} {'p99 ms':>8}")
    for size in args.sizes:
        cluster = half_full_cluster(size)
        used = sum(8 - n.free_guaranteed for n in cluster.nodes.values()) / (8 * size)
        assert isinstance(plan_gang(cluster, gang), GangPlan)
        rows = [
            ("plan 4x8-GPU gang (core)", lambda c=cluster: plan_gang(c, gang)),
            ("plan 1-GPU pod (core, best-fit index)", lambda c=cluster: plan_gang(c, pod)),
            (
                "1-GPU pod, full scan (baseline)",
                lambda c=cluster: full_scan_single_pod(c, pod.worker()),
            ),
        ]
        results = {}
        for label, fn in rows:
            results[label] = timed(
                fn, args.repeats if "baseline" not in label else max(20, args.repeats // 10)
            )
            p50, p99 = results[label]
            print(f"{size:>6} {label:<38} {p50:>8.3f} {p99:>8.3f}")
        core = results["plan 1-GPU pod (core, best-fit index)"][0]
        scan = results["1-GPU pod, full scan (baseline)"][0]
        print(f"{size:>6} GPUs held {used:.1%}; full scan / core index (p50): {scan / core:.1f}x")


if __name__ == "__main__":
    main()
