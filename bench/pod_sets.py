"""What a gang's other pod sets cost the planner: a gang of GPU workers planned alone, then with a
CPU-only launcher, with four CPU-only parameter servers, and with GPU pods of another shape,
on half-full clusters of 1,000 and 5,000 nodes x 8 GPUs (bench/placement.py's clusters, each
node with 64 cores and 512 GiB allocatable and a quarter of them requested). The baseline, in
the same run, is the same gang without its companions: the ratio is what pod sets add.

    .venv/bin/python bench/pod_sets.py [--repeats 100] [--sizes 1000 5000]
"""

from __future__ import annotations

import argparse
import dataclasses

from gangshare.core import Cluster, GangPlan, GangRequest, PodSet, plan_gang
from gangshare.core.constraints import PodConstraints
from placement import half_full_cluster, timed

GIB = 2**30
CPU_POD = PodConstraints(resources=(("cpu", 4000), ("memory", 16 * GIB), ("pods", 1)))
WORKER = PodConstraints(resources=(("cpu", 8000), ("memory", 64 * GIB), ("pods", 1)))


def with_cpu(cluster: Cluster) -> Cluster:
    for node in cluster.nodes.values():
        node.allocatable = {"cpu": 64000, "memory": 512 * GIB, "pods": 110}
        node.requested.update({"cpu": 16000, "memory": 128 * GIB, "pods": 20})
    return cluster


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 5000])
    args = parser.parse_args()
    workers = GangRequest("bench/gang", workers=4, gpus_per_worker=8, constraints=WORKER)
    gangs = {
        "4x8 GPU workers alone (baseline)": workers,
        "+ 1 CPU-only launcher": dataclasses.replace(
            workers, companions=(PodSet("launcher", 1, 0, CPU_POD),)
        ),
        "+ 4 CPU-only parameter servers": dataclasses.replace(
            workers, companions=(PodSet("ps", 4, 0, CPU_POD),)
        ),
        "+ 2x1 GPU evaluators": dataclasses.replace(
            workers, companions=(PodSet("eval", 2, 1, WORKER),)
        ),
    }
    print(f"{'nodes':>6} {'gang':<36} {'p50 ms':>8} {'p99 ms':>8} {'x base':>7}")
    for size in args.sizes:
        cluster = with_cpu(half_full_cluster(size))
        base = None
        for label, gang in gangs.items():
            plan = plan_gang(cluster, gang)
            assert isinstance(plan, GangPlan) and len(plan.placements) == gang.pod_count, plan
            p50, p99 = timed(lambda c=cluster, g=gang: plan_gang(c, g), args.repeats)
            base = base or p50
            print(f"{size:>6} {label:<36} {p50:>8.3f} {p99:>8.3f} {p50 / base:>6.2f}x")
        # Planning holds and releases: the cluster is as it was.
        assert not [o for o in cluster.owners() if o.startswith("bench/")]


if __name__ == "__main__":
    main()
