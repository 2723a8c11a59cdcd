"""Reclaim of borrowed quota, topology that holds out, and same-cycle interactions."""

from builders import make_cluster, make_gang, make_node
from queue_cases import admitted, borrower, cohort, job, pending, policy, split_islands

from gangshare.core import ServiceClass, Topology, TopologyPolicy, TopologyScope
from gangshare.core.cycle import PendingKind, schedule_cycle
from gangshare.core.queueing import QueuedJob, QueuePolicy, RunningJob, policy_refusal
from gangshare.core.queues import QueueSpec

# ----- reclaim --------------------------------------------------------------------------------


def test_a_lender_gets_its_quota_back_in_the_same_cycle():
    cluster = make_cluster().nodes(2, gpus=8).holding("b-own", "node-0", tuple(range(8))).build()
    for g in range(8):
        cluster.allocate(
            "b-borrow", f"b-borrow/{g}", "node-1", (g,), ServiceClass.OPPORTUNISTIC, 2048
        )
    running = [RunningJob("b-own", "b", 8, ServiceClass.GUARANTEED), borrower("b-borrow")]
    result = schedule_cycle(cluster, [job("a0", gpus=8, queue="a", at=5)], running, cohort(), 10)
    assert admitted(result) == ["a0"]
    assert result.admitted[0].service_class is ServiceClass.GUARANTEED
    assert [p.job.key for p in result.preemptions] == ["b-borrow"]
    assert result.preemptions[0].reason.startswith("reclaimed: cohort c's lenders")
    assert "lends 0 GPU(s) now and borrowers held 8" in result.preemptions[0].reason


def test_reclaim_takes_only_what_the_lender_needs():
    cluster = make_cluster().nodes(3, gpus=8).build()
    running = [borrower("b1", gpus=4, started=1), borrower("b2", gpus=4, started=2)]
    result = schedule_cycle(cluster, [job("a0", gpus=4, queue="a")], running, cohort(a=8, b=0), 10)
    assert admitted(result) == ["a0"]
    # a lends 4 now, borrowers hold 8: one 4-GPU borrower goes, the latest started.
    assert [p.job.key for p in result.preemptions] == ["b2"]


def test_reclaim_evicts_lowest_priority_then_latest_started_and_never_guaranteed_work():
    cluster = make_cluster().nodes(4, gpus=8).build()
    running = [
        RunningJob("a-own", "a", 8, ServiceClass.GUARANTEED, started_at=9),
        RunningJob("b-own", "b", 4, ServiceClass.GUARANTEED, started_at=9),
        borrower("old-low", gpus=2, priority=0, started=1),
        borrower("new-low", gpus=2, priority=0, started=5),
        borrower("high", gpus=2, priority=5, started=8),
        borrower("mid", gpus=2, priority=1, started=7),
    ]
    rules = cohort(a=16, b=4)
    # a uses 8 of 16 and lends 8, held by the four borrowers; a's new 6-GPU job leaves 2 to lend.
    result = schedule_cycle(cluster, [job("a1", gpus=6, queue="a")], running, rules, 10)
    assert admitted(result) == ["a1"]
    assert [p.job.key for p in result.preemptions] == ["new-low", "old-low", "mid"]
    assert all(p.job.borrowed for p in result.preemptions)


def test_nothing_is_reclaimed_while_the_cohort_lends_enough():
    cluster = make_cluster().nodes(3, gpus=8).build()
    running = [borrower("b1", gpus=4)]
    result = schedule_cycle(cluster, [job("a0", gpus=4, queue="a")], running, cohort(a=8, b=0), 10)
    assert admitted(result) == ["a0"]
    assert result.preemptions == []


# ----- topology that holds out, then relaxes --------------------------------------------------


def test_effective_topology_holds_out_then_relaxes():
    preferred = Topology(TopologyPolicy.PREFERRED, TopologyScope.NVLINK, 60)
    assert preferred.effective(0).policy is TopologyPolicy.REQUIRED
    assert preferred.effective(59.9).policy is TopologyPolicy.REQUIRED
    assert preferred.effective(60).policy is TopologyPolicy.PREFERRED
    assert preferred.effective(600) == preferred
    required = Topology(TopologyPolicy.REQUIRED, TopologyScope.NODE, 60)
    assert required.effective(10) == required
    assert required.effective(60) == Topology(TopologyPolicy.PREFERRED, TopologyScope.NODE)
    plain = Topology(TopologyPolicy.PREFERRED, TopologyScope.NVLINK)
    assert plain.effective(10**6) is plain


def test_a_preferred_nvlink_gang_holds_out_until_its_relax_time():
    gang = (
        make_gang("nv")
        .gpus(4)
        .topology(TopologyPolicy.PREFERRED, TopologyScope.NVLINK, relax_after=60)
        .build()
    )
    queued = QueuedJob("nv", gang, submitted_at=100.0)
    result = schedule_cycle(split_islands(), [queued], [], QueuePolicy(), 110)
    assert admitted(result) == []
    kind, reason = pending(result)["nv"]
    assert kind is PendingKind.UNSCHEDULABLE
    assert reason.endswith("(waiting for topology NVLink; a wider scope in 50s)")
    result = schedule_cycle(split_islands(), [queued], [], QueuePolicy(), 160)
    assert admitted(result) == ["nv"]
    plan = result.admitted[0].plan
    assert plan.relaxed
    assert sorted(plan.placements[0].gpu_indices) == [2, 3, 6, 7]


def test_a_preferred_gang_without_relax_time_spreads_at_once():
    gang = make_gang("nv").gpus(4).build()
    result = schedule_cycle(split_islands(), [QueuedJob("nv", gang, 100.0)], [], QueuePolicy(), 100)
    assert admitted(result) == ["nv"]
    assert result.admitted[0].plan.relaxed


def test_a_preferred_gang_that_fits_its_island_is_not_marked_relaxed():
    gang = (
        make_gang("nv")
        .gpus(4)
        .topology(TopologyPolicy.PREFERRED, TopologyScope.NVLINK, relax_after=60)
        .build()
    )
    cluster = (
        make_cluster().node(make_node("node-0").gpus(8).nvlink([0, 1, 2, 3], [4, 5, 6, 7])).build()
    )
    result = schedule_cycle(cluster, [QueuedJob("nv", gang, 100.0)], [], QueuePolicy(), 100)
    assert admitted(result) == ["nv"]
    assert not result.admitted[0].plan.relaxed
    assert set(result.admitted[0].plan.placements[0].gpu_indices) in ({0, 1, 2, 3}, {4, 5, 6, 7})


# ----- regressions: same-cycle interactions ---------------------------------------------------


def test_a_borrower_admitted_before_a_lenders_own_job_in_its_lane_is_withdrawn():
    # b's 6-GPU head borrows from the cohort pool (a's 4 idle and b's own 4); the 4-GPU job
    # behind it is within b's quota and takes b's 4 back in the same cycle.
    cluster = make_cluster().nodes(2, gpus=8).build()
    rules = cohort(a=4, b=4)
    jobs = [job("b-wide", gpus=6, queue="b", at=1), job("b-own", gpus=4, queue="b", at=2)]
    result = schedule_cycle(cluster, jobs, [], rules, 10)
    assert [(a.job.key, a.borrowed) for a in result.admitted] == [("b-own", False)]
    assert result.preemptions == []
    kind, reason = pending(result)["b-wide"]
    assert kind is PendingKind.QUOTA
    assert reason.startswith("cohort c lends 4 GPU(s) now, less than its borrowers need")
    # The withdrawn gang no longer holds anything in the snapshot.
    assert cluster.allocations_of("b-wide") == []
    assert all(
        t.owner != "b-wide" for n in cluster.nodes.values() for g in n.gpus for t in g.tenants()
    )


def test_a_blocked_head_reserves_behind_jobs_admitted_earlier_in_the_same_cycle():
    cluster = make_cluster().nodes(1, gpus=4).build()
    pending_jobs = [
        job("first", gpus=2, at=1, runtime=100),
        job("head", gpus=4, at=2, runtime=100),
        job("long", gpus=1, at=3, runtime=1000),
        job("short", gpus=1, at=4, runtime=50),
    ]
    result = schedule_cycle(cluster, pending_jobs, [], QueuePolicy(backfill=True), 10)
    # "first" frees its 2 GPUs at t=110: the head is promised them, so "long" must not start.
    assert [(r.head, r.start, r.extra) for r in result.reservations] == [("head", 110, 0)]
    assert admitted(result) == ["first", "short"]
    assert pending(result)["long"][0] is PendingKind.BACKFILL


def test_a_borrower_that_does_not_fit_reserves_no_guaranteed_gpus():
    # Every GPU is free for guaranteed work but its share slots are full of opportunistic work.
    builder = make_cluster().node(make_node("node-0").gpus(4).share_slots(1))
    for gpu in range(4):
        builder.holding(f"opp{gpu}", "node-0", (gpu,), ServiceClass.OPPORTUNISTIC, 1000)
    rules = policy(
        QueueSpec("a", nominal_gpus=8, cohort="c"),
        QueueSpec("b", nominal_gpus=2, cohort="c", backfill=True),
    )
    jobs = [job("b-borrow", gpus=4, queue="b", at=1), job("b-own", gpus=2, queue="b", at=2)]
    result = schedule_cycle(builder.build(), jobs, [], rules, 10)
    assert pending(result)["b-borrow"][0] is PendingKind.UNSCHEDULABLE
    assert result.reservations == []
    assert [(a.job.key, a.borrowed) for a in result.admitted] == [("b-own", False)]


def test_the_cohort_bound_on_job_size_counts_the_queues_own_quota_and_its_limit():
    rules = cohort(a=8, b=8, borrowing_limit=12)
    assert policy_refusal(rules, job("ok", gpus=12, queue="b")) is None
    assert policy_refusal(rules, job("big", gpus=13, queue="b")) == (
        "needs 13 guaranteed GPUs, more than queue b's whole quota of 8 "
        "or than its cohort could ever lend (12)"
    )


def test_each_holding_out_gang_is_told_its_own_time_to_relax():
    def preferred(key):
        return (
            make_gang(key)
            .gpus(4)
            .topology(TopologyPolicy.PREFERRED, TopologyScope.NVLINK, relax_after=60)
            .build()
        )

    # In two queues, so neither waits behind the other: both are planned, and both fail.
    jobs = [
        QueuedJob("early", preferred("early"), 100.0, "q1"),
        QueuedJob("late", preferred("late"), 130.0, "q2"),
    ]
    rules = QueuePolicy()
    result = schedule_cycle(split_islands(), jobs, [], rules, 140)
    assert pending(result)["early"][1].endswith("a wider scope in 20s)")
    assert pending(result)["late"][1].endswith("a wider scope in 50s)")
