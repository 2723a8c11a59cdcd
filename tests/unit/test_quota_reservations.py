"""A head blocked by its queue's quota reserves that quota as a head blocked by GPUs reserves
GPUs: later jobs of its queue start guaranteed only if they end before it, or borrow."""

from builders import make_cluster
from queue_cases import admitted, borrower, job, pending, policy

from gangshare.core import ServiceClass
from gangshare.core.cycle import PendingKind, schedule_cycle
from gangshare.core.queueing import Ordering, RunningJob
from gangshare.core.queues import QueueSpec


def _team_holding_six(cohort=None, other_busy=False, **settings):
    """Queue `team` (quota 8) runs 6 GPUs until t=100 on a 24-GPU cluster; with `other_busy`,
    queue `other` uses all its quota (8) until t=1000, so it lends nothing."""
    builder = make_cluster().nodes(3, gpus=8).holding("r", "node-0", tuple(range(6)))
    running = [RunningJob("r", "team", 6, ServiceClass.GUARANTEED, expected_end=100)]
    if other_busy:
        builder.holding("o", "node-1", tuple(range(8)))
        running.append(RunningJob("o", "other", 8, ServiceClass.GUARANTEED, expected_end=1000))
    cluster = builder.build()
    rules = policy(
        QueueSpec("team", nominal_gpus=8, cohort=cohort),
        QueueSpec("other", nominal_gpus=8, cohort=cohort),
        backfill=True,
        **settings,
    )
    return cluster, running, rules


def test_a_quota_blocked_head_keeps_its_queues_quota_from_jobs_that_outlast_the_wait():
    cluster, running, rules = _team_holding_six(small_job_max_gpus=2)
    jobs = [
        job("head", gpus=8, queue="team", at=1, runtime=500),
        job("long", gpus=1, queue="team", at=2, runtime=1000),
        job("short", gpus=1, queue="team", at=3, runtime=50),
        job("elsewhere", gpus=1, queue="other", at=4, runtime=1000),
    ]
    result = schedule_cycle(cluster, jobs, running, rules, 10)
    # "r" frees the team's quota at t=100: the 8-GPU head is promised it from then.
    head = [r for r in result.reservations if r.head == "head"]
    assert [(r.queue, r.quota_start, r.quota_extra) for r in head] == [("team", 100, 0)]
    assert pending(result)["head"][0] is PendingKind.QUOTA
    kind, reason = pending(result)["long"]
    assert kind is PendingKind.BACKFILL
    assert reason == "backfill: would spend queue team's quota reserved for head from t=100s"
    # A job that ends before the head may start, and other queues' quota is not the head's.
    assert sorted(admitted(result)) == ["elsewhere", "short"]


def test_in_a_cohort_a_job_kept_off_a_reserved_quota_borrows_instead():
    cluster, running, rules = _team_holding_six(cohort="c", other_busy=True, small_job_max_gpus=2)
    jobs = [
        job("head", gpus=8, queue="team", at=1, runtime=500),
        job("long", gpus=1, queue="team", at=2, runtime=1000),
    ]
    result = schedule_cycle(cluster, jobs, running, rules, 10)
    assert [(a.job.key, a.borrowed, a.service_class) for a in result.admitted] == [
        ("long", True, ServiceClass.OPPORTUNISTIC)
    ]
    assert pending(result)["head"][0] is PendingKind.QUOTA


def test_a_head_past_the_starvation_bound_gets_its_queues_quota_outright():
    cluster, running, rules = _team_holding_six(small_job_max_gpus=2, starvation_seconds=3600)
    jobs = [
        job("head", gpus=8, queue="team", at=0, runtime=500),
        job("short", gpus=1, queue="team", at=5, runtime=50),
        job("elsewhere", gpus=1, queue="other", at=6, runtime=1000),
    ]
    young = schedule_cycle(cluster, jobs, running, rules, 10)
    assert sorted(admitted(young)) == ["elsewhere", "short"]
    cluster, running, rules = _team_holding_six(small_job_max_gpus=2, starvation_seconds=3600)
    old = schedule_cycle(cluster, jobs, running, rules, 3600)
    assert admitted(old) == ["elsewhere"]
    assert pending(old)["short"][0] is PendingKind.BACKFILL


def test_a_later_head_of_the_same_queue_waits_behind_the_earlier_ones_reservation():
    # Two lanes of one queue, each with a head its quota blocks.
    cluster, running, rules = _team_holding_six(small_job_max_gpus=4)
    running.append(RunningJob("r2", "team", 2, ServiceClass.GUARANTEED, expected_end=300))
    cluster = (
        make_cluster()
        .nodes(3, gpus=8)
        .holding("r", "node-0", tuple(range(6)))
        .holding("r2", "node-0", (6, 7))
        .build()
    )
    jobs = [
        job("first", gpus=6, queue="team", at=1, runtime=500),
        job("second", gpus=4, queue="team", at=2, runtime=500),
    ]
    result = schedule_cycle(cluster, jobs, running, rules, 10)
    starts = {r.head: r.quota_start for r in result.reservations}
    # 6 GPUs of quota are free at t=100, all promised to "first", which is expected to run
    # until t=600: only then do 4 more fit beside what is left.
    assert starts == {"first": 100, "second": 600}


def test_a_job_that_can_only_ever_borrow_reserves_nothing():
    cluster, running, rules = _team_holding_six(cohort="c")
    running.append(borrower("b", gpus=8, queue="other"))
    jobs = [job("huge", gpus=6, workers=2, queue="team", at=1, runtime=500)]
    result = schedule_cycle(cluster, jobs, running, rules, 10)
    assert result.reservations == []
    assert pending(result)["huge"][0] is PendingKind.QUOTA


def test_in_one_lane_only_the_first_job_the_quota_blocks_reserves():
    cluster, running, rules = _team_holding_six()
    jobs = [
        job("first", gpus=6, queue="team", at=1, runtime=500),
        job("second", gpus=4, queue="team", at=2, runtime=500),
    ]
    result = schedule_cycle(cluster, jobs, running, rules, 10)
    assert [r.head for r in result.reservations] == ["first"]
    assert pending(result)["second"][0] is PendingKind.QUOTA


def test_a_job_past_the_starvation_bound_goes_first_in_its_lane_whatever_the_order():
    cluster = make_cluster().nodes(1, gpus=8).build()
    rules = policy(
        QueueSpec("team", nominal_gpus=8),
        ordering=Ordering.SHORTEST,
        starvation_seconds=3600,
    )
    jobs = [
        job("long", gpus=8, queue="team", at=0, runtime=10_000),
        job("short", gpus=8, queue="team", at=100, runtime=10),
    ]
    young = schedule_cycle(cluster, jobs, [], rules, 1000)
    assert admitted(young) == ["short"]
    cluster = make_cluster().nodes(1, gpus=8).build()
    old = schedule_cycle(cluster, jobs, [], rules, 3600)
    assert admitted(old) == ["long"]
