"""The simulator's decision step: the operator's scheduling cycle, on the jobs that can matter.

`decide` is `gangshare.core.cycle.schedule_cycle` called on the live cluster, the
running jobs and the pending jobs `PendingIndex.candidates` keeps. The core
applies each admitted plan to the cluster itself. The counts it takes as keyword
arguments (free GPUs, quota usage, free share slots) are what the engine tracks
as it goes; left out, they are recomputed from the cluster and the running jobs
(the tests compare both against `schedule_cycle` on every pending job).

Precondition: every pending job can run at all. The cycle marks a job that never
can (`never_fits`, `policy_refusal`) Inadmissible and lets its lane go on past it;
the engine rejects such jobs on arrival with the same two functions, so the index
may stop a lane at the first job that certainly blocks.

With cohorts a job beyond its queue's quota may still borrow, so what a queue can take
is its remaining quota plus `borrow_room`: what its cohort lends and nobody borrows yet,
within its borrowing limit. Both only shrink during a cycle (admissions add guaranteed
use and borrowing; reclaim comes after admission), so bounds taken at its start hold.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gangshare.core import Cluster, ServiceClass
from gangshare.core.cycle import CycleResult, schedule_cycle
from gangshare.core.queueing import QueuePolicy, RunningJob
from gangshare.core.queues import CohortBook
from gangshare.sim.full_nodes import FullNodes
from gangshare.sim.pending import PendingIndex


def free_guaranteed_gpus(cluster: Cluster) -> int:
    return sum(node.free_guaranteed for node in cluster.nodes.values())


def full_nodes_of(cluster: Cluster, policy: QueuePolicy) -> FullNodes | None:
    """Nodes full for guaranteed work, where no lanes compete (no fair share, no cohorts):
    PendingIndex leaves out repeats of jobs pinned to them (see its candidates)."""
    if policy.fair_share or any(spec.cohort for spec in policy.queues.values()):
        return None
    return FullNodes(cluster)


def free_share_slots(cluster: Cluster) -> int:
    return sum(
        gpu.free_share_slots()
        for node in cluster.nodes.values()
        for gpu in node.gpus
        if gpu.gpu.healthy
    )


def guaranteed_usage(running: Sequence[RunningJob]) -> dict[str, int]:
    """Guaranteed GPUs per queue, as the cycle's phase 1 counts them."""
    usage: dict[str, int] = {}
    for job in running:
        if job.service_class is ServiceClass.GUARANTEED:
            usage[job.queue] = usage.get(job.queue, 0) + job.gpus
    return usage


def quota_headroom(policy: QueuePolicy, usage: Mapping[str, int]) -> dict[str, int]:
    # Never below 0: a queue already over its quota (a lender's quota shrank under running
    # work) can take nothing more within it, but it may still borrow; a negative headroom
    # subtracted from what it may borrow and hid jobs the cycle would admit.
    return {
        queue: max(0, quota - usage.get(queue, 0)) for queue, quota in policy.quota_map().items()
    }


def borrowed_usage(running: Sequence[RunningJob]) -> dict[str, int]:
    """GPUs per queue held on borrowed quota, as the cycle's phase 1 counts them."""
    borrowed: dict[str, int] = {}
    for job in running:
        if job.borrowed:
            borrowed[job.queue] = borrowed.get(job.queue, 0) + job.gpus
    return borrowed


def borrow_room(
    policy: QueuePolicy, usage: Mapping[str, int], borrowed: Mapping[str, int]
) -> dict[str, int]:
    """Most GPUs each queue that may borrow could borrow now (cohort queues with a quota)."""
    queues = policy.queues
    if not any(spec.cohort for spec in queues.values()):
        return {}
    book = CohortBook(queues, dict(usage), dict(borrowed))
    cohorts = {spec.cohort for spec in queues.values() if spec.cohort is not None}
    free = {cohort: book.lent(cohort) - book.borrowed_in(cohort) for cohort in cohorts}
    rooms: dict[str, int] = {}
    for spec in queues.values():
        if spec.cohort is None or spec.nominal_gpus is None:
            continue
        room = free[spec.cohort]
        if spec.borrowing_limit is not None:
            room = min(room, spec.borrowing_limit - borrowed.get(spec.name, 0))
        rooms[spec.name] = max(0, room)
    return rooms


def decide(
    cluster: Cluster,
    pending: PendingIndex,
    running: Sequence[RunningJob],
    policy: QueuePolicy,
    now: float,
    *,
    free_gpus: int | None = None,
    usage: Mapping[str, int] | None = None,
    share_slots: int | None = None,
    borrowed: Mapping[str, int] | None = None,
) -> CycleResult:
    if free_gpus is None:
        free_gpus = free_guaranteed_gpus(cluster)
    if usage is None:
        usage = guaranteed_usage(running)
    if share_slots is None:
        share_slots = free_share_slots(cluster)
    if borrowed is None:
        borrowed = borrowed_usage(running)
    rooms = borrow_room(policy, usage, borrowed)
    full = full_nodes_of(cluster, policy)
    jobs = pending.candidates(free_gpus, quota_headroom(policy, usage), share_slots, rooms, full)
    return schedule_cycle(cluster, jobs, list(running), policy, now)
