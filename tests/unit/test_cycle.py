"""The scheduling cycle: lanes, strict order, quotas, fair share, backfill."""

from builders import make_cluster, make_gang

from gangshare.core import ServiceClass, TopologyPolicy, TopologyScope
from gangshare.core.cycle import PendingKind, schedule_cycle
from gangshare.core.queueing import Ordering, QueuedJob, QueuePolicy, RunningJob


def job(
    key, workers=1, gpus=1, at=0.0, queue="default", priority=0, runtime=None, opportunistic=False
):
    builder = make_gang(key).workers(workers).gpus(gpus)
    if opportunistic:
        builder.opportunistic(1000)
    return QueuedJob(key, builder.build(), at, queue, priority, runtime)


def admitted(result):
    return [a.job.key for a in result.admitted]


def reasons(result):
    return {p.job.key: p.reason for p in result.pending}


def test_strict_fifo_head_blocks_its_lane():
    cluster = make_cluster().nodes(1, gpus=4).build()
    result = schedule_cycle(
        cluster,
        [job("a", gpus=2, at=1), job("big", gpus=4, at=2), job("c", gpus=1, at=3)],
        [],
        QueuePolicy(),
        10,
    )
    assert admitted(result) == ["a"]
    assert reasons(result)["c"] == "waiting behind big (strict order in its queue)"
    assert reasons(result)["big"].startswith("needs 1 worker(s) x 4 GPU(s)")


def test_multi_queue_lets_small_jobs_past_a_blocked_large_head():
    cluster = make_cluster().nodes(1, gpus=4).holding("old", "node-0", (0,)).build()
    pending = [job("big", gpus=4, at=1), job("small", gpus=1, at=2)]
    assert admitted(schedule_cycle(cluster, pending, [], QueuePolicy(), 10)) == []
    multi = QueuePolicy(small_job_max_gpus=2)
    assert admitted(schedule_cycle(cluster, pending, [], multi, 10)) == ["small"]


def test_priority_ordering_admits_the_important_job_first():
    cluster = make_cluster().nodes(1, gpus=2).build()
    pending = [job("low", gpus=2, at=1, priority=0), job("high", gpus=2, at=2, priority=10)]
    assert admitted(schedule_cycle(cluster, pending, [], QueuePolicy(Ordering.PRIORITY), 10)) == [
        "high"
    ]
    assert admitted(
        schedule_cycle(make_cluster().nodes(1, gpus=2).build(), pending, [], QueuePolicy(), 10)
    ) == ["low"]


def test_shortest_first_uses_estimated_gpu_time():
    cluster = make_cluster().nodes(1, gpus=2).build()
    pending = [job("long", gpus=2, at=1, runtime=1000), job("short", gpus=2, at=2, runtime=10)]
    assert admitted(schedule_cycle(cluster, pending, [], QueuePolicy(Ordering.SHORTEST), 10)) == [
        "short"
    ]


def test_quota_caps_guaranteed_gpus_but_not_opportunistic_ones():
    cluster = make_cluster().nodes(1, gpus=8).build()
    running = [RunningJob("r", "team", 6, ServiceClass.GUARANTEED)]
    pending = [job("g", gpus=4, queue="team"), job("o", gpus=1, queue="team", opportunistic=True)]
    result = schedule_cycle(cluster, pending, running, QueuePolicy(quotas={"team": 8}), 10)
    assert admitted(result) == ["o"]
    assert reasons(result)["g"] == "queue team guaranteed quota: 6 of 8 GPUs in use, job needs 4"


def test_fair_share_serves_the_least_served_queue_first():
    cluster = make_cluster().nodes(1, gpus=2).build()
    running = [RunningJob("r", "rich", 8, ServiceClass.GUARANTEED)]
    pending = [
        job("rich-job", gpus=2, at=1, queue="rich"),
        job("poor-job", gpus=2, at=5, queue="poor"),
    ]
    assert admitted(schedule_cycle(cluster, pending, running, QueuePolicy(), 10)) == ["rich-job"]
    cluster = make_cluster().nodes(1, gpus=2).build()
    assert admitted(
        schedule_cycle(cluster, pending, running, QueuePolicy(fair_share=True), 10)
    ) == ["poor-job"]


def test_backfill_admits_short_jobs_that_end_before_the_reservation():
    cluster = make_cluster().nodes(1, gpus=4).holding("r", "node-0", (0, 1)).build()
    running = [RunningJob("r", "default", 2, ServiceClass.GUARANTEED, expected_end=100)]
    pending = [
        job("head", gpus=4, at=1, runtime=500),
        job("short", gpus=1, at=2, runtime=50),
        job("long", gpus=1, at=3, runtime=5000),
    ]
    result = schedule_cycle(cluster, pending, running, QueuePolicy(backfill=True), 10)
    assert admitted(result) == ["short"]
    assert reasons(result)["long"].startswith("backfill: would delay head")
    assert [(r.head, r.start, r.extra) for r in result.reservations] == [("head", 100, 0)]


def test_backfill_lets_jobs_use_gpus_the_reservation_does_not_need():
    cluster = make_cluster().nodes(1, gpus=8).holding("r", "node-0", (0, 1, 2, 3, 4, 5)).build()
    running = [RunningJob("r", "default", 6, ServiceClass.GUARANTEED, expected_end=100)]
    pending = [job("head", gpus=4, at=1), job("long", gpus=1, at=2, runtime=5000)]
    result = schedule_cycle(cluster, pending, running, QueuePolicy(backfill=True), 10)
    # At t=100, 8 GPUs are free; the head needs 4, so 4 are extra and the long job may use one.
    assert admitted(result) == ["long"]


def test_admissions_are_applied_to_the_snapshot_within_the_cycle():
    cluster = make_cluster().nodes(2, gpus=4).build()
    result = schedule_cycle(
        cluster, [job(f"j{i}", gpus=2, at=i) for i in range(5)], [], QueuePolicy(), 10
    )
    assert admitted(result) == ["j0", "j1", "j2", "j3"]
    assert sum(n.free_guaranteed for n in cluster.nodes.values()) == 0
    gpus = [(p.node, g) for a in result.admitted for p in a.plan.placements for g in p.gpu_indices]
    assert len(gpus) == len(set(gpus)) == 8


def test_a_failed_shape_is_not_planned_again_in_the_same_cycle():
    cluster = make_cluster().nodes(1, gpus=4).holding("old", "node-0", (0,)).build()
    pending = [job(f"big{i}", gpus=4, at=i) for i in range(3)]
    result = schedule_cycle(
        cluster, pending, [], QueuePolicy(small_job_max_gpus=2, backfill=True), 10
    )
    assert admitted(result) == []
    assert len({p.reason for p in result.pending}) == 1
    assert result.pending[0].reason.startswith("needs 1 worker(s) x 4 GPU(s)")


def test_a_head_that_running_jobs_can_never_satisfy_reserves_nothing():
    cluster = make_cluster().nodes(1, gpus=4).build()
    pending = [job("impossible", gpus=8, at=1), job("long", gpus=1, at=2, runtime=10**6)]
    result = schedule_cycle(cluster, pending, [], QueuePolicy(backfill=True), 10)
    assert admitted(result) == ["long"]
    assert result.reservations == []


def kinds(result):
    return {p.job.key: p.kind for p in result.pending}


def test_an_impossible_job_is_inadmissible_and_never_blocks_its_lane():
    cluster = make_cluster().nodes(2, gpus=4).build()
    pending = [
        job("too-wide", gpus=8, at=1),  # no node has 8 GPUs
        job("too-many", workers=3, gpus=4, at=2),  # 12 GPUs in a cluster of 8
        job("fits", gpus=2, at=3),
    ]
    result = schedule_cycle(cluster, pending, [], QueuePolicy(), 10)
    assert admitted(result) == ["fits"]
    assert kinds(result) == {
        "too-wide": PendingKind.INADMISSIBLE,
        "too-many": PendingKind.INADMISSIBLE,
    }
    assert reasons(result)["too-wide"] == (
        "can never fit: 1 worker(s) x 8 GPU(s), the whole cluster holds at most 0 even when "
        "empty; 2 of 2 node(s) cannot take one (2: node has 4 GPUs, worker needs 8)"
    )
    assert "holds at most 2 even when empty" in reasons(result)["too-many"]


def test_an_impossible_job_behind_a_blocked_head_is_marked_too():
    cluster = make_cluster().nodes(1, gpus=4).holding("old", "node-0", (0,)).build()
    pending = [job("waits", gpus=4, at=1), job("never", gpus=8, at=2), job("c", gpus=1, at=3)]
    result = schedule_cycle(cluster, pending, [], QueuePolicy(), 10)
    assert kinds(result) == {
        "waits": PendingKind.UNSCHEDULABLE,
        "never": PendingKind.INADMISSIBLE,
        "c": PendingKind.BEHIND,
    }


def test_a_job_over_its_whole_quota_or_priority_bound_is_inadmissible():
    cluster = make_cluster().nodes(2, gpus=8).build()
    policy = QueuePolicy(Ordering.PRIORITY, quotas={"team": 8}, max_priority={"team": 10, "*": 0})
    pending = [
        job("greedy", workers=2, gpus=8, queue="team", at=1),
        job("vip", gpus=1, queue="team", priority=11, at=2),
        job("elsewhere", gpus=1, queue="other", priority=1, at=3),
        job("ok", gpus=8, queue="team", priority=10, at=4),
    ]
    result = schedule_cycle(cluster, pending, [], policy, 10)
    assert admitted(result) == ["ok"]
    assert reasons(result) == {
        "greedy": "needs 16 guaranteed GPUs, more than queue team's whole quota of 8",
        "vip": "spec.priority 11 is above queue team's maximum of 10",
        "elsewhere": "spec.priority 1 is above queue other's maximum of 0",
    }
    assert set(kinds(result).values()) == {PendingKind.INADMISSIBLE}


def test_a_required_topology_that_relaxes_later_is_not_inadmissible():
    cluster = make_cluster().nodes(2, gpus=4).build()
    strict = (
        make_gang("strict")
        .workers(2)
        .gpus(4)
        .topology(TopologyPolicy.REQUIRED, TopologyScope.NODE)
        .build()
    )
    relaxing = (
        make_gang("relaxing")
        .workers(2)
        .gpus(4)
        .topology(TopologyPolicy.REQUIRED, TopologyScope.NODE, 60)
        .build()
    )
    pending = [QueuedJob("strict", strict, 0.0), QueuedJob("relaxing", relaxing, 1.0)]
    result = schedule_cycle(cluster, pending, [], QueuePolicy(small_job_max_gpus=0), 10)
    assert kinds(result)["strict"] is PendingKind.INADMISSIBLE
    assert "on one node (topology Node, Required), the largest holds 1" in reasons(result)["strict"]
    assert kinds(result)["relaxing"] is PendingKind.UNSCHEDULABLE
