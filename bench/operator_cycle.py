"""The operator's scheduling pass without the network: snapshot from API objects + core cycle.

1,000 queued TrainingJobs (a Philly-like size mix) on 500 nodes x 8 GPUs, half the
GPUs held by 250 running jobs. Times `build_snapshot` (parsing Node/Pod/TrainingJob
dicts as the API server returns them) and `schedule_cycle`, for strict FIFO and for
the full stack (multi-queue + backfill + fair share). The API LIST calls are not timed.

    .venv/bin/python bench/operator_cycle.py [--jobs 1000] [--nodes 500] [--repeats 10]
"""

from __future__ import annotations

import argparse
import copy
import random
import statistics
import time
from typing import Any

from gangshare.core.cycle import schedule_cycle
from gangshare.core.queueing import Ordering, QueuePolicy
from gangshare.kube.nodes import ready_node_objects
from gangshare.kube.snapshot import build_snapshot, parse_time
from gangshare.kube.trainingjob import parse_trainingjob

SIZES = [(1, 1)] * 70 + [(1, 2)] * 10 + [(1, 4)] * 8 + [(1, 8)] * 6 + [(2, 8)] * 4 + [(4, 8)] * 2


def nodes(count: int) -> list[dict[str, Any]]:
    racks = [f"rack-{r}" for r in range(max(1, count // 40))]
    return ready_node_objects(
        {
            "nodePools": [
                {
                    "name": "gpu",
                    "count": count,
                    "gpusPerNode": 8,
                    "racks": racks,
                    "nvlinkIslands": [[0, 1, 2, 3], [4, 5, 6, 7]],
                }
            ]
        }
    )


def job(
    name: str, workers: int, gpus: int, rng: random.Random, status: dict[str, Any]
) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": f"team-{rng.randrange(8)}",
            "uid": name,
            "generation": 1,
        },
        "spec": {
            "queue": f"q{rng.randrange(4)}",
            "priority": rng.choice([0, 0, 0, 10]),
            "workers": workers,
            "gpusPerWorker": gpus,
            "serviceClass": "Guaranteed",
            "runtimeEstimateSeconds": rng.randint(60, 86400),
            "topology": {"policy": "Preferred", "scope": "NVLink"},
            "template": {"spec": {"containers": [{"name": "t", "image": "i"}]}},
        },
        "status": status,
    }


def workload(
    node_count: int, queued: int, seed: int = 3
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rng = random.Random(seed)
    node_objs = nodes(node_count)
    jobs = []
    # Running jobs hold half the GPUs: one 4-GPU island on every node.
    for i, node in enumerate(node_objs):
        island = rng.choice([[0, 1, 2, 3], [4, 5, 6, 7]])
        jobs.append(
            job(
                f"run-{i}",
                1,
                4,
                rng,
                {
                    "phase": "Running",
                    "placement": [{"rank": 0, "node": node["metadata"]["name"], "gpus": island}],
                    "startedAt": "2026-11-22T00:00:00Z",
                },
            )
        )
    for i in range(queued):
        workers, gpus = rng.choice(SIZES)
        jobs.append(
            job(
                f"q-{i}",
                workers,
                gpus,
                rng,
                {"phase": "Queued", "queuedAt": f"2026-11-22T01:{i // 60 % 60:02d}:{i % 60:02d}Z"},
            )
        )
    return node_objs, jobs


def one_pass(
    node_objs: list[dict[str, Any]], jobs: list[dict[str, Any]], policy: QueuePolicy
) -> tuple[float, float, int]:
    started = time.perf_counter()
    snapshot = build_snapshot(node_objs, [], jobs)
    pending = []
    for obj in jobs:
        if obj["status"]["phase"] == "Queued":
            pending.append(
                parse_trainingjob(obj).queued(parse_time(obj["status"]["queuedAt"]) or 0.0)
            )
    built = time.perf_counter()
    result = schedule_cycle(
        snapshot.cluster, pending, snapshot.running, policy, now=1_795_400_000.0
    )
    return built - started, time.perf_counter() - built, len(result.admitted)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    node_objs, jobs = workload(args.nodes, args.jobs)
    policies = {
        "strict FIFO": QueuePolicy(),
        "priority + multi-queue + backfill + fair share": QueuePolicy(
            Ordering.PRIORITY, small_job_max_gpus=2, backfill=True, fair_share=True
        ),
    }
    print(
        f"{args.jobs} queued jobs, {args.nodes} nodes x 8 GPUs, "
        f"{args.nodes} running jobs hold half the GPUs"
    )
    print(f"{'policy':<48}{'snapshot ms':>12}{'cycle ms':>10}{'total ms':>10}{'admitted':>10}")
    for label, policy in policies.items():
        runs = [one_pass(copy.deepcopy(node_objs), jobs, policy) for _ in range(args.repeats)]
        snap = statistics.median(r[0] for r in runs) * 1000
        cycle = statistics.median(r[1] for r in runs) * 1000
        print(f"{label:<48}{snap:>12.1f}{cycle:>10.1f}{snap + cycle:>10.1f}{runs[0][2]:>10}")


if __name__ == "__main__":
    main()
